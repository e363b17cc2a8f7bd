// Queues: depth, oldest message, workers serving, dead letters (GET /v1/queues).
import { duration, h } from "../dom.js";
import { tablePage } from "./table.js";

export function render(main, { signal }) {
  return tablePage(main, signal, {
    title: "Queues",
    path: "/v1/queues",
    empty: "No queue has messages or workers.",
    columns: [
      ["Queue", (q) => h("code", {}, q.queue)],
      ["Depth", (q) => String(q.depth ?? "—")],
      ["Oldest message", (q) => (q.oldest_age_s == null ? "—" : duration(q.oldest_age_s))],
      ["Workers", (q) => String(Array.isArray(q.workers) ? q.workers.length : (q.workers ?? "—"))],
      ["Dead letters", (q) => (q.dead_letters ? h("a", { href: `#/dead-letters?queue=${encodeURIComponent(q.queue)}` }, String(q.dead_letters)) : "0")],
    ],
  });
}
