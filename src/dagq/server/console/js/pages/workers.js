// Workers: the live worker records (GET /v1/workers).
import { ago, badge, h } from "../dom.js";
import { tablePage } from "./table.js";

export function render(main, { signal }) {
  return tablePage(main, signal, {
    title: "Workers",
    path: "/v1/workers",
    intro: "Workers that reported recently: what they serve and how busy they are.",
    empty: "No live worker.",
    columns: [
      ["Worker", (w) => h("code", {}, w.id)],
      ["State", (w) => badge(w.state)],
      ["Host", (w) => `${w.host} (pid ${w.pid})`],
      ["Queues", (w) => w.queues.join(", ")],
      ["Running", (w) => `${w.running} of ${w.concurrency}`],
      ["Finished", (w) => String(w.completed)],
      ["Version", (w) => w.version || "—"],
      ["Seen", (w) => ago(w.last_seen)],
    ],
  });
}
