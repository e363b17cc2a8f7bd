// Preview: paste or upload a definition, see its graph (POST /v1/graph), then submit it.
import { post } from "../api.js";
import { h, notice } from "../dom.js";
import { GraphView } from "../graph/view.js";
import { runHash } from "../routes.js";

const KEY = "dagq.preview";

function typeOf(text) {
  return /^\s*[{[]/.test(text) ? "application/json" : "application/yaml";
}

export async function render(main) {
  const text = h("textarea", {
    class: "code definition", rows: 16, spellcheck: "false", "aria-label": "Workflow definition (YAML or JSON)",
    placeholder: "name: my-pipeline\ntasks:\n  - name: fetch\n    cmd: echo hi",
  });
  text.value = sessionStorage.getItem(KEY) ?? "";
  const file = h("input", { type: "file", accept: ".yaml,.yml,.json", "aria-label": "Upload a definition file" });
  const message = h("div", { class: "message", role: "status" });
  const graphBox = h("section", { class: "dag-box", "aria-label": "Graph preview", hidden: true });
  const submit = h("button", { type: "button", disabled: true }, "Submit");
  const show = h("button", { type: "button", class: "primary" }, "Preview graph");
  main.append(
    h("h1", {}, "Preview a definition"),
    h("p", { class: "muted" }, "Paste a workflow (YAML or JSON) or upload a file: its graph is drawn before anything runs."),
    h("div", { class: "preview-input" }, text, h("div", { class: "buttons" }, file, show, submit)),
    message,
    graphBox,
  );
  let view = null;
  let shownText = null;

  file.addEventListener("change", async () => {
    const picked = file.files?.[0];
    if (!picked) return;
    text.value = await picked.text();
    preview();
  });
  text.addEventListener("input", () => {
    sessionStorage.setItem(KEY, text.value);
    submit.disabled = text.value !== shownText;
  });
  text.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) preview();
  });
  show.addEventListener("click", preview);

  async function preview() {
    const body = text.value;
    if (!body.trim()) {
      message.replaceChildren(notice("Paste a definition first.", "error"));
      return;
    }
    message.replaceChildren(notice("Checking…"));
    try {
      const graph = await post("/v1/graph", body, { type: typeOf(body) });
      shownText = body;
      submit.disabled = false;
      message.replaceChildren(notice(`${graph.name}: ${graph.nodes.length} tasks, ${graph.edges.length} dependencies — valid.`, "ok"));
      graphBox.hidden = false;
      view ??= new GraphView(graphBox, { label: `Graph of ${graph.name}`, onOpen: () => {} });
      await view.setGraph(graph);
    } catch (error) {
      submit.disabled = true;
      message.replaceChildren(notice(error.message, "error"));
    }
  }

  submit.addEventListener("click", async () => {
    submit.disabled = true;
    try {
      const accepted = await post("/v1/workflows", text.value, { type: typeOf(text.value) });
      location.hash = runHash(accepted.id);
    } catch (error) {
      submit.disabled = false;
      message.replaceChildren(notice(error.message, "error"));
    }
  });
  if (text.value.trim()) preview();
}
