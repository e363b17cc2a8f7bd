// Queues: depth, oldest message, workers serving, dead letters (GET /v1/queues).
import { duration, h } from "../dom.js";
import { tablePage } from "./table.js";

export function render(main, { signal }) {
  return tablePage(main, signal, {
    title: "Queues",
    path: "/v1/queues",
    intro: "The queues of unfinished runs, of live workers and of dead letters.",
    empty: "No queue in use.",
    columns: [
      ["Queue", (q) => h("code", {}, q.queue)],
      ["Waiting", (q) => String(q.depth)],
      ["In flight", (q) => String(q.in_flight ?? "—")],
      ["Oldest message", (q) => (q.depth ? duration(q.oldest_age_s) : "—")],
      ["Live workers", (q) => h("span", { class: q.workers === 0 && q.depth ? "error-line" : null }, String(q.workers))],
      ["Dead letters", (q) => (q.dead_letters ? h("a", { href: `#/dead-letters?queue=${encodeURIComponent(q.queue)}` }, String(q.dead_letters)) : "0")],
    ],
  });
}
