// The console's router: #/runs, #/runs/<id>[/tasks/<name>], #/preview, #/workers,
// #/queues, #/dead-letters, #/doctor. Each page renders into <main> and stops its
// streams and polls when the route changes (its AbortSignal aborts).
import { forgetToken, showSignOut } from "./token.js";
import { notice } from "./dom.js";
import { route } from "./routes.js";

const PAGES = {
  runs: () => import("./pages/runs.js"),
  run: () => import("./pages/run.js"),
  preview: () => import("./pages/preview.js"),
  workers: () => import("./pages/workers.js"),
  queues: () => import("./pages/queues.js"),
  "dead-letters": () => import("./pages/deadletters.js"),
  doctor: () => import("./pages/doctor.js"),
};

let current = null; // {key, controller, page}

async function show() {
  const { page, params, query } = route(location.hash, Object.keys(PAGES));
  document.querySelectorAll("nav a").forEach((a) => {
    a.toggleAttribute("aria-current", a.dataset.page === (page === "run" ? "runs" : page));
  });
  const main = document.getElementById("page");
  // The same run with another task: the page updates itself (no new graph, no new stream).
  if (current?.page === "run" && page === "run" && current.params.id === params.id && current.module.retarget) {
    current.params = params;
    current.module.retarget(params, query);
    return;
  }
  current?.controller.abort();
  const controller = new AbortController();
  const module = await PAGES[page]();
  current = { page, params, controller, module };
  main.replaceChildren();
  try {
    await module.render(main, { params, query, signal: controller.signal });
  } catch (error) {
    if (!controller.signal.aborted) main.append(notice(`Could not show this page: ${error.message}`, "error"));
  }
}

document.getElementById("sign-out").addEventListener("click", () => {
  forgetToken();
  show();
});
showSignOut();
window.addEventListener("hashchange", show);
show();
