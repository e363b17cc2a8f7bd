// Dead letters: messages no worker could handle; select some, then replay or purge.
import { post, query } from "../api.js";
import { h, notice, when } from "../dom.js";
import { tablePage } from "./table.js";

export async function render(main, { query: q, signal }) {
  const picked = new Set();
  const said = h("div", { class: "message", role: "status" });
  const act = (action) => async () => {
    const keys = [...picked];
    if (!keys.length) {
      said.replaceChildren(notice("Select dead letters first.", "error"));
      return;
    }
    if (action === "purge" && !window.confirm(`Purge ${keys.length} dead letter(s)? They cannot be replayed afterwards.`)) return;
    try {
      const done = await post(`/v1/dead-letters/${action}`, { keys }, { signal });
      said.replaceChildren(notice(`${action === "replay" ? "Replayed" : "Purged"} ${done.count}.`, "ok"));
      picked.clear();
      await page.reload();
    } catch (error) {
      said.replaceChildren(notice(`${action}: ${error.message}`, "error"));
    }
  };
  const bar = h("div", { class: "buttons" },
    h("button", { type: "button", onclick: act("replay") }, "Replay selected"),
    h("button", { type: "button", class: "danger", onclick: act("purge") }, "Purge selected"));
  const page = await tablePage(main, signal, {
    title: "Dead letters",
    path: `/v1/dead-letters${query({ queue: q.queue })}`,
    intro: "Messages set aside after failing to be delivered or handled. Replay sends one again; purge deletes it.",
    empty: "No dead letters.",
    columns: [
      ["", (d) => {
        const box = h("input", { type: "checkbox", "aria-label": `Select ${d.key}`, checked: picked.has(d.key) });
        box.addEventListener("change", () => (box.checked ? picked.add(d.key) : picked.delete(d.key)));
        return box;
      }],
      ["Queue", (d) => h("code", {}, d.queue)],
      ["Kind", (d) => d.kind],
      ["What", (d) => d.summary],
      ["Reason", (d) => d.reason],
      ["Deliveries", (d) => String(d.deliveries)],
      ["Set aside", (d) => when(d.dead_at)],
    ],
  });
  main.querySelector("h1").after(bar, said);
}
