// The timeline of a run: one row per attempt, its queue wait (sent → started) light and
// its run time (started → finished) solid, on a shared time axis. Each foreach instance
// (`name[k]`) and each iteration of a loop is a bar of its own.
import { duration, h, when } from "../dom.js";

const MAX_ROWS = 500;

/** Attempts from the task list, for a server without /timeline (no queue wait). */
export function fromTasks(tasks) {
  return tasks
    .filter((t) => t.started_at != null)
    .map((t) => ({ task: t.name, attempt: t.attempt, enqueued_at: null, started_at: t.started_at, finished_at: t.finished_at, status: t.status }));
}

/** Draws `items` into `container`; a row's label opens its task with `open(name)`. */
export function drawGantt(container, items, open) {
  const rows = items
    .filter((i) => (i.enqueued_at ?? i.started_at) != null)
    .sort((a, b) => (a.enqueued_at ?? a.started_at) - (b.enqueued_at ?? b.started_at) || a.attempt - b.attempt);
  if (!rows.length) {
    container.replaceChildren(h("p", { class: "muted" }, "No attempt has started yet."));
    return;
  }
  const now = Date.now() / 1000;
  // An attempt with no recorded end that a later one replaced ended when that one was sent.
  const next = new Map();
  const last = new Map(); // task → its latest attempt seen so far (rows go by send time)
  for (const r of rows) {
    const before = last.get(r.task);
    if (before) next.set(before, r.enqueued_at ?? r.started_at);
    last.set(r.task, r);
  }
  const endOf = (r) => r.finished_at ?? next.get(r) ?? now;
  const t0 = Math.min(...rows.map((r) => r.enqueued_at ?? r.started_at));
  const t1 = Math.max(...rows.map(endOf));
  const span = Math.max(t1 - t0, 0.001);
  const pct = (t) => `${(((t - t0) / span) * 100).toFixed(3)}%`;
  const width = (a, b) => `${Math.max(((b - a) / span) * 100, 0.15).toFixed(3)}%`;
  const ticks = h("div", { class: "gantt-axis", "aria-hidden": "true" },
    [0, 0.25, 0.5, 0.75, 1].map((f) => h("span", { style: `left:${f * 100}%` }, `+${duration(f * span)}`)));
  const list = h("ol", { class: "gantt", "aria-label": `Timeline from ${when(t0)}` });
  for (const r of rows.slice(0, MAX_ROWS)) {
    const start = r.started_at;
    const end = endOf(r);
    const wait = r.enqueued_at != null && start != null ? start - r.enqueued_at : null;
    const ran = start != null ? end - start : null;
    const what = r.iteration ? `iteration ${r.iteration} (attempt ${r.attempt})` : `attempt ${r.attempt}`;
    const text = [`${r.task} ${what}: ${r.status ?? ""}`,
      wait != null ? `queue wait ${duration(wait)}` : null,
      ran != null ? `run ${duration(ran)}${r.finished_at == null ? " so far" : ""}` : "no start recorded"].filter(Boolean).join(", ");
    const track = h("div", { class: "track", title: text });
    if (r.enqueued_at != null) {
      track.append(h("span", { class: "bar wait", style: `left:${pct(r.enqueued_at)};width:${width(r.enqueued_at, start ?? end)}` }));
    }
    if (start != null) {
      track.append(h("span", { class: `bar run s-${r.status}`, style: `left:${pct(start)};width:${width(start, end)}` }));
    }
    const task = r.task.replace(/\[\d+\]$/, ""); // an instance opens its foreach task
    const label = h("button", { type: "button", class: "link", "aria-label": text, onclick: () => open(task) },
      r.task, r.iteration ? h("span", { class: "muted" }, ` ↻${r.iteration}`) : r.attempt > 1 ? h("span", { class: "muted" }, ` #${r.attempt}`) : null);
    const data = { task: r.task, attempt: String(r.attempt), ...(r.iteration ? { iteration: String(r.iteration) } : {}) };
    list.append(h("li", { dataset: data }, label, track));
  }
  const more = rows.length > MAX_ROWS ? h("p", { class: "muted small" }, `The first ${MAX_ROWS} of ${rows.length} attempts.`) : null;
  const legend = h("p", { class: "legend small" }, h("span", { class: "key wait" }), " queue wait ", h("span", { class: "key run" }), " run");
  container.replaceChildren(legend, ticks, list, more ?? "");
}
