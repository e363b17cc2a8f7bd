// A task attempt's logs, polled incrementally (offset → next_offset) and appended; with
// "follow" on, the view keeps to the end. Stops once the attempt is complete.
import { ApiError, get, query, taskPath } from "../api.js";
import { h, pause } from "../dom.js";

const POLL_MS = 700;

export function logView(id, name, attempt, signal) {
  const pre = h("pre", { class: "logs", tabindex: 0, "aria-label": `Logs of ${name}`, "aria-live": "off" });
  const follow = h("input", { type: "checkbox", checked: true });
  const state = h("span", { class: "muted small", role: "status" });
  const box = h("section", { class: "log-box", "aria-label": "Logs" },
    h("div", { class: "row" }, h("h3", {}, "Logs"), h("label", { class: "small" }, follow, " follow"), state),
    pre);
  (async () => {
    let offset = 0;
    while (!signal.aborted) {
      let chunk;
      try {
        chunk = await get(`${taskPath(id, name)}/logs${query({ attempt, offset })}`, { signal });
      } catch (error) {
        if (signal.aborted) return;
        state.textContent = error instanceof ApiError && error.status === 404 && !offset
          ? "no logs (yet)"
          : `logs: ${error.message}`;
        await pause(POLL_MS * 3, signal);
        continue;
      }
      if (chunk.text) {
        pre.append(chunk.text);
        if (follow.checked) pre.scrollTop = pre.scrollHeight;
      }
      offset = chunk.next_offset ?? offset;
      state.textContent = chunk.complete ? `attempt ${chunk.attempt}: complete` : `attempt ${chunk.attempt}: following…`;
      if (chunk.complete) return;
      await pause(POLL_MS, signal);
    }
  })();
  return box;
}
