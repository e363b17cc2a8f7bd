// Doctor: what `dagq doctor` reports about the store, coordinator, workers and queues.
import { badge, h } from "../dom.js";
import { tablePage } from "./table.js";

export function render(main, { signal }) {
  return tablePage(main, signal, {
    title: "Doctor",
    path: "/v1/doctor",
    every: 15000,
    rowsOf: (b) => b.findings ?? [],
    empty: "No findings.",
    extra: (b) => h("p", { class: b.ok ? "notice ok" : "notice error", role: "status" }, b.ok ? "Every check passes." : "Something needs attention."),
    columns: [
      ["Level", (f) => badge(f.level)],
      ["Check", (f) => f.what],
      ["Saw", (f) => f.detail],
      ["Fix", (f) => (f.fix ? h("code", {}, f.fix) : "")],
    ],
  });
}
