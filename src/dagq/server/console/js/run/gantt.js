// The timeline of a run on a shared time axis: one row per task, each foreach instance
// (`name[k]`) and each iteration of a loop, and on it a segment per attempt (retries
// too): its queue wait (sent → started) light, its run time (started → finished)
// coloured by how it ended; hovering a segment names its attempt and outcome.
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
  const attempts = items
    .filter((i) => (i.enqueued_at ?? i.started_at) != null)
    .sort((a, b) => (a.enqueued_at ?? a.started_at) - (b.enqueued_at ?? b.started_at) || a.attempt - b.attempt);
  if (!attempts.length) {
    container.replaceChildren(h("p", { class: "muted" }, "No attempt has started yet."));
    return;
  }
  const now = Date.now() / 1000;
  // An attempt with no recorded end that a later one replaced ended when that one was sent.
  const next = new Map();
  const last = new Map(); // task → its latest attempt seen so far (attempts go by send time)
  // One row per task, foreach instance and loop iteration, in the order each was first
  // sent; its attempts (retries) are segments of that row.
  const rows = new Map();
  for (const r of attempts) {
    const before = last.get(r.task);
    if (before) next.set(before, r.enqueued_at ?? r.started_at);
    last.set(r.task, r);
    const key = `${r.task}\u0000${r.iteration ?? 0}`;
    if (!rows.has(key)) rows.set(key, { task: r.task, iteration: r.iteration ?? 0, attempts: [] });
    rows.get(key).attempts.push(r);
  }
  const endOf = (r) => r.finished_at ?? next.get(r) ?? now;
  const t0 = Math.min(...attempts.map((r) => r.enqueued_at ?? r.started_at));
  const t1 = Math.max(...attempts.map(endOf));
  const span = Math.max(t1 - t0, 0.001);
  const pct = (t) => `${(((t - t0) / span) * 100).toFixed(3)}%`;
  const width = (a, b) => `${Math.max(((b - a) / span) * 100, 0.15).toFixed(3)}%`;
  const ticks = h("div", { class: "gantt-axis", "aria-hidden": "true" },
    [0, 0.25, 0.5, 0.75, 1].map((f) => h("span", { style: `left:${f * 100}%` }, `+${duration(f * span)}`)));
  const list = h("ol", { class: "gantt", "aria-label": `Timeline from ${when(t0)}` });
  const all = [...rows.values()];
  for (const row of all.slice(0, MAX_ROWS)) {
    const what = `${row.task}${row.iteration ? ` iteration ${row.iteration}` : ""}`;
    const track = h("div", { class: "track" });
    const told = [];
    for (const r of row.attempts) {
      const start = r.started_at;
      const end = endOf(r);
      const wait = r.enqueued_at != null && start != null ? start - r.enqueued_at : null;
      const ran = start != null ? end - start : null;
      const text = [`attempt ${r.attempt}: ${r.status ?? ""}`,
        wait != null ? `queue wait ${duration(wait)}` : null,
        ran != null ? `run ${duration(ran)}${r.finished_at == null ? " so far" : ""}` : "no start recorded"].filter(Boolean).join(", ");
      told.push(text);
      const title = `${what} ${text}`;
      const retry = r !== row.attempts[0] ? " retry" : "";
      const data = { attempt: String(r.attempt), status: r.status ?? "" };
      if (r.enqueued_at != null) {
        track.append(h("span", { class: `bar wait${retry}`, title, dataset: data,
          style: `left:${pct(r.enqueued_at)};width:${width(r.enqueued_at, start ?? end)}` }));
      }
      if (start != null) {
        track.append(h("span", { class: `bar run s-${r.status}${retry}`, title, role: "img", "aria-label": title, dataset: data,
          style: `left:${pct(start)};width:${width(start, end)}` }));
      }
    }
    const latest = row.attempts[row.attempts.length - 1];
    const task = row.task.replace(/\[\d+\]$/, ""); // an instance opens its foreach task
    const many = row.attempts.length > 1;
    const label = h("button", { type: "button", class: "link", "aria-label": `${what}: ${told.join("; ")}`, onclick: () => open(task) },
      row.task, row.iteration ? h("span", { class: "muted" }, ` ↻${row.iteration}`) : null,
      many ? h("span", { class: "muted", title: `${row.attempts.length} attempts` }, ` ×${row.attempts.length}`)
        : latest.attempt > 1 ? h("span", { class: "muted" }, ` #${latest.attempt}`) : null);
    const data = { task: row.task, attempt: String(latest.attempt), attempts: String(row.attempts.length),
      ...(row.iteration ? { iteration: String(row.iteration) } : {}) };
    list.append(h("li", { dataset: data }, label, track));
  }
  const more = all.length > MAX_ROWS ? h("p", { class: "muted small" }, `The first ${MAX_ROWS} of ${all.length} rows.`) : null;
  const legend = h("p", { class: "legend small" }, h("span", { class: "key wait" }), " queue wait ", h("span", { class: "key run" }), " run",
    " · each attempt a segment (hover: its number and outcome)");
  container.replaceChildren(legend, ticks, list, more ?? "");
}
