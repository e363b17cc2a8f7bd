// A run: its DAG coloured by state and updated live from the run's event stream, a
// timeline (Gantt) of its attempts, a task panel, and cancel / retry actions.
import { ApiError, enc, get, post } from "../api.js";
import { badge, coalesce, h, notice, pause, when } from "../dom.js";
import { GraphView } from "../graph/view.js";
import { runHash } from "../routes.js";
import { drawGantt, fromTasks } from "../run/gantt.js";
import { TaskPanel } from "../run/taskpanel.js";
import { FINAL_RUN_STATES, stateAfter } from "../states.js";
import { follow } from "../sse.js";

let page = null; // the page shown: {panel, view, id}
/** How long a quiet stream goes before the run's states are read again (plus a little
 * per task: a large run's states are a large read). */
const QUIET_MS = 1500;
const QUIET_MS_PER_TASK = 2;

/** The same run, another task (or none): no reload, no new stream. */
export function retarget(params) {
  if (!page || page.id !== params.id) return;
  page.panel.show(params.task);
  if (params.task) page.view.focusNode(params.task);
}

class Selection {
  constructor(onChange) {
    this.names = new Set();
    this.onChange = onChange;
  }
  has(name) { return this.names.has(name); }
  toggle(name, on) {
    if (on) this.names.add(name);
    else this.names.delete(name);
    this.onChange();
  }
  set(names) {
    this.names = new Set(names);
    this.onChange();
  }
}

export async function render(main, { params, signal }) {
  const id = params.id;
  const base = `/v1/workflows/${enc(id)}`;
  let detail;
  let graph;
  let tasks;
  let history;
  try {
    [detail, graph, tasks, history] = await Promise.all([
      get(base, { signal }),
      get(`${base}/graph`, { signal }),
      get(`${base}/tasks`, { signal }),
      get(`${base}/events`, { signal }),
    ]);
  } catch (error) {
    main.append(h("h1", {}, id), notice(error.message, "error"));
    return;
  }
  const iterations = new Map();
  const countIteration = (e) => {
    if (e.kind === "iterated" && e.task) iterations.set(e.task, (iterations.get(e.task) ?? 1) + 1);
  };
  history.forEach(countIteration);
  const lastEventId = history.length ? history[history.length - 1].id : null;

  const head = h("div", { class: "run-head" });
  const message = h("div", { class: "message", role: "status" });
  const graphBox = h("section", { class: "dag-box", "aria-label": "Graph" });
  const ganttBox = h("section", { class: "gantt-box", "aria-labelledby": "timeline-title" });
  const aside = h("aside", { class: "task-panel", "aria-labelledby": "task-title", hidden: true });
  main.append(head, message,
    h("div", { class: "run-body" }, h("div", { class: "run-main" }, graphBox,
      h("h2", { id: "timeline-title" }, "Timeline"), ganttBox), aside));

  const selection = new Selection(() => { view.setSelected(selection.names); drawHead(); });
  const open = (name) => { location.hash = runHash(id, name); };
  const view = new GraphView(graphBox, {
    label: `Graph of ${id}`,
    onOpen: open,
    onSelect: (names) => selection.set(names),
  });
  const nodeInfo = () => {
    const byTask = new Map(tasks.map((t) => [t.name, t]));
    return graph.nodes.map((n) => ({
      ...n,
      items: byTask.get(n.name)?.items ?? null,
      iteration: iterations.get(n.name) ?? (n.marks?.some((m) => m.startsWith("loop")) && byTask.get(n.name)?.attempt ? 1 : null),
    }));
  };
  const panel = new TaskPanel(aside, {
    id,
    node: (name) => view.byName?.get(name),
    selection,
    onClose: () => { location.hash = runHash(id); },
    onChange: () => refresh(),
  });
  page = { id, panel, view };
  signal.addEventListener("abort", () => { if (page?.id === id) page = null; }, { once: true });

  function drawHead() {
    const counts = Object.entries(detail.counts ?? {}).filter(([, n]) => n);
    const ended = FINAL_RUN_STATES.has(detail.status);
    const retryable = ["failed", "upstream_failed", "cancelled"].some((st) => detail.counts?.[st]);
    const act = async (label, path, body, ask) => {
      if (ask && !window.confirm(ask)) return;
      try {
        await post(`${base}/${path}`, body);
        message.replaceChildren(notice(`${label}: sent.`));
        refresh();
      } catch (error) {
        message.replaceChildren(notice(`${label}: ${error.message}`, "error"));
      }
    };
    const picked = [...selection.names];
    head.replaceChildren(
      h("div", { class: "title" }, h("h1", {}, detail.id), badge(detail.status), h("span", { class: "muted" }, detail.name)),
      h("div", { class: "progress-row" },
        h("progress", { max: 1, value: detail.progress ?? 0, "aria-label": "Progress" }),
        h("span", {}, ` ${detail.done}/${detail.total} done`),
        h("span", { class: "counts" }, counts.map(([st, n]) => h("span", { class: "count" }, badge(st), ` ${n}`))),
        h("span", { class: "muted small" }, `created ${when(detail.created_at)}${detail.finished_at ? ` · finished ${when(detail.finished_at)}` : ""}`)),
      h("div", { class: "buttons" },
        h("button", { type: "button", class: "danger", disabled: ended, onclick: () => act("Cancel", "cancel", { reason: "cancelled from the console" }, `Cancel ${id}?`) }, "Cancel run"),
        h("button", { type: "button", disabled: !retryable, onclick: () => act("Retry", "retry", {}) }, "Retry failed tasks"),
        h("button", { type: "button", disabled: !picked.length, onclick: () => act(`Retry ${picked.join(", ")}`, "retry", { tasks: picked }).then(() => selection.set([])) },
          `Retry selected (${picked.length})`),
        h("span", { class: "muted small" }, "Space or Shift+click selects a task")),
      detail.error ? h("p", { class: "error-line" }, detail.error) : "",
    );
  }

  async function drawTimeline() {
    let items;
    try {
      items = (await get(`${base}/timeline`, { signal })).items;
    } catch (error) {
      if (!(error instanceof ApiError && error.status === 404) || signal.aborted) return;
      items = fromTasks(tasks);
    }
    drawGantt(ganttBox, items, open);
  }

  let refreshing = false;
  let again = false;
  let refreshed = 0;
  async function refresh() {
    if (refreshing) { again = true; return; }
    refreshing = true;
    refreshed = performance.now();
    try {
      [detail, graph, tasks] = await Promise.all([get(base, { signal }), get(`${base}/graph`, { signal }), get(`${base}/tasks`, { signal })]);
      view.update(nodeInfo());
      drawHead();
      await Promise.all([drawTimeline(), panel.refresh()]);
    } catch (error) {
      if (!signal.aborted) message.replaceChildren(notice(error.message, "error"));
    } finally {
      refreshing = false;
      if (again && !signal.aborted) { again = false; refresh(); }
    }
  }
  const soon = coalesce(refresh, 250 + graph.nodes.length / 10);
  const quietMs = QUIET_MS + QUIET_MS_PER_TASK * graph.nodes.length;
  // Not every change of state writes a history entry (so not every one is an event):
  // while the run goes on, its states are read again when the stream is quiet.
  (async () => {
    while (!signal.aborted) {
      await pause(quietMs, signal);
      const quiet = performance.now() - refreshed >= quietMs;
      if (!signal.aborted && quiet && !document.hidden && !FINAL_RUN_STATES.has(detail.status)) soon();
    }
  })();

  drawHead();
  const shown = view.setGraph({ nodes: nodeInfo(), edges: graph.edges });
  drawTimeline();
  if (params.task) {
    panel.show(params.task);
    shown.then(() => view.focusNode(params.task));
  }

  const indicator = document.getElementById("live");
  follow(`${base}/stream`, (event) => {
    if (event.event === "end") {
      soon();
      return;
    }
    if (event.event !== "message") return;
    const e = JSON.parse(event.data);
    countIteration(e);
    const state = e.task ? stateAfter(e.kind) : null;
    if (state && view.byName?.has(e.task)) view.update([{ name: e.task, state, iteration: iterations.get(e.task) ?? null }]);
    soon();
  }, {
    signal,
    lastEventId,
    onState: (state, error) => {
      indicator.textContent = { live: "● live", reconnecting: "reconnecting…", ended: "run ended", failed: `stream: ${error?.message}` }[state] ?? "";
    },
  });
  signal.addEventListener("abort", () => { indicator.textContent = ""; }, { once: true });
  await shown;
}
