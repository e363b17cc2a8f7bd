// The console's core checks in headless Firefox, driven over WebDriver BiDi by
// puppeteer-core (installed under .ci by `npm ci --prefix .ci`). Run by
// tests/integration/test_console_firefox.py, which starts `dagq server`, a coordinator
// and a worker, submits the held run and passes one JSON argument:
//   {url, firefox, artefacts, held: {id, go}, submit: <definition>, waitMs}
// Prints "ok: STEP" per check; a failed check prints "failed: STEP: why", saves
// firefox-failed.png beside the other screenshots and exits 1.
import { writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";

const require = createRequire(new URL("../../.ci/package.json", import.meta.url));
const puppeteer = require("puppeteer-core");

const config = JSON.parse(process.argv[2]);
const WAIT = config.waitMs;

const browser = await puppeteer.launch({
  browser: "firefox",
  executablePath: config.firefox,
  headless: true,
  protocolTimeout: WAIT,
  extraPrefsFirefox: {
    // Nothing leaves 127.0.0.1: every other address goes to a closed local proxy port
    // (loopback is never proxied), and Firefox's own background traffic is off.
    "network.proxy.type": 1,
    "network.proxy.http": "127.0.0.1",
    "network.proxy.http_port": 9,
    "network.proxy.ssl": "127.0.0.1",
    "network.proxy.ssl_port": 9,
    "network.proxy.no_proxies_on": "127.0.0.1",
    "network.captive-portal-service.enabled": false,
    "network.connectivity-service.enabled": false,
    "browser.safebrowsing.update.enabled": false,
    "app.update.enabled": false,
  },
});
let step = "open the console";
const errors = [];
let page;
try {
  page = await browser.newPage();
  await page.setViewport({ width: 1400, height: 900 });
  page.setDefaultTimeout(WAIT);
  page.on("pageerror", (error) => errors.push(String(error)));

  // `fn(...args)` holds in the page within WAIT ms, or the step fails naming `what`.
  const until = async (what, fn, ...args) => {
    step = what;
    await page.waitForFunction(fn, { timeout: WAIT, polling: 100 }, ...args);
    console.log(`ok: ${what}`);
  };
  const text = (selector, wanted) => {
    const found = document.querySelector(selector);
    return found != null && found.textContent.includes(wanted);
  };
  const inState = (name, state) => {
    const node = document.querySelector(`svg.dag g.node[data-name="${name}"]`);
    return node != null && node.classList.contains(`s-${state}`);
  };
  const shot = (name) => page.screenshot({ path: join(config.artefacts, `firefox-${name}.png`) });

  await page.goto(`${config.url}/#/runs`);
  await until("the runs list loads and its stream is live", text, "#live", "● live");
  await page.evaluate(() => { window.__sameDocument = true; }); // gone if the page reloads

  step = "submit a run";
  const answer = await fetch(`${config.url}/v1/workflows`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(config.submit),
  });
  if (answer.status !== 202) throw new Error(`${answer.status} ${await answer.text()}`);
  const { id } = await answer.json();
  await until("a new run appears in the list and completes live", text, `tr[data-id="${id}"] .badge`, "completed");
  await until("the counts by status follow it", text, ".counts", "completed");
  await until("without a reload", () => window.__sameDocument === true);
  await shot("runs");

  step = "open the run by keyboard";
  await page.focus(`tr[data-id="${id}"]`);
  await page.keyboard.press("Enter");
  await until("Enter on a row opens its run", (want) => location.hash === want, `#/runs/${id}`);
  await until("its DAG is drawn with its nodes coloured completed", inState, "report", "completed");

  await page.goto(`${config.url}/#/runs/${config.held.id}`);
  await until("the DAG is drawn as SVG nodes", () => document.querySelectorAll("svg.dag g.node").length === 2);
  await until("a running task's node is coloured running", inState, "prepare", "running");
  await until("its child's node is coloured pending", inState, "report", "pending");
  step = "open a task by keyboard";
  await page.evaluate(() => document.querySelector('svg.dag g.node[data-name="prepare"]').focus());
  await until("an SVG node takes focus", () => document.activeElement?.dataset?.name === "prepare");
  await page.keyboard.press("Enter");
  await until("Enter on a node opens its task panel", text, "aside.task-panel h2", "prepare");
  await until("the task panel's logs show its output", text, "aside.task-panel pre.logs", "first line");
  await until("the logs follow while it runs", text, "aside.task-panel .log-box", "following");
  await until("the timeline draws the running attempt", () =>
    document.querySelector('ol.gantt li[data-task="prepare"] .bar.run') != null);
  await page.evaluate(() => { window.__sameDocument = true; });
  await shot("run-running");

  writeFileSync(config.held.go, "");
  await until("new log lines are appended", text, "aside.task-panel pre.logs", "second line");
  await until("the node turns completed live", inState, "prepare", "completed");
  await until("its child runs and completes live", inState, "report", "completed");
  await until("the timeline has a bar per task", () =>
    ["prepare", "report"].every((t) => document.querySelector(`ol.gantt li[data-task="${t}"] .bar.run.s-completed`)));
  await until("all without a reload", () => window.__sameDocument === true);
  await shot("run-completed");

  step = "no script error";
  if (errors.length) throw new Error(`the page raised: ${errors.join(" | ")}`);
  console.log("ok: no script error");
} catch (error) {
  console.log(`failed: ${step}: ${error.message}`);
  if (errors.length) console.log(`page errors: ${errors.join(" | ")}`);
  process.exitCode = 1;
  await page?.screenshot({ path: join(config.artefacts, "firefox-failed.png") }).catch(() => {});
} finally {
  await browser.close();
}
