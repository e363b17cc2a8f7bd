// Workers: the live worker records (GET /v1/workers).
import { ago, badge, h } from "../dom.js";
import { tablePage } from "./table.js";

const pick = (item, ...keys) => keys.map((k) => item[k]).find((v) => v != null);

export function render(main, { signal }) {
  return tablePage(main, signal, {
    title: "Workers",
    path: "/v1/workers",
    empty: "No worker has reported.",
    columns: [
      ["Worker", (w) => h("code", {}, pick(w, "worker_id", "id", "name") ?? "?")],
      ["State", (w) => badge(pick(w, "state", "status") ?? (w.alive === false ? "gone" : "alive"))],
      ["Host", (w) => pick(w, "host", "hostname") ?? "—"],
      ["Queues", (w) => (pick(w, "queues") ?? []).join?.(", ") ?? String(pick(w, "queues") ?? "—")],
      ["Running", (w) => String(pick(w, "running", "busy", "in_flight") ?? "—")],
      ["Seen", (w) => ago(pick(w, "heartbeat_at", "last_seen", "updated_at", "seen_at"))],
    ],
  });
}
