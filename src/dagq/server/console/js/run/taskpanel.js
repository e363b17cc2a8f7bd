// The task panel of a run: state, why a queued task is not running, attempts, error,
// output, live logs, events; actions: approve/reject a wait_for (with data), retry.
import { ApiError, enc, get, post, taskPath } from "../api.js";
import { badge, duration, h, notice, when } from "../dom.js";
import { logView } from "./logs.js";

const RETRYABLE = new Set(["failed", "upstream_failed", "cancelled"]);

export class TaskPanel {
  /** `node(name)` gives the graph's node (marks, signal); `selection` the retry set. */
  constructor(aside, { id, node, selection, onClose, onChange }) {
    this.aside = aside;
    this.id = id;
    this.node = node;
    this.selection = selection;
    this.onClose = onClose;
    this.onChange = onChange;
    this.name = null;
    this.controller = null;
    this.logsFor = null;
    this.drafts = new Map(); // task → the decision data typed so far (kept across redraws)
    aside.addEventListener("keydown", (e) => {
      if (e.key === "Escape") onClose();
    });
  }

  /** Shows task `name` (null: closes the panel). */
  async show(name) {
    if (name !== this.name) {
      this.controller?.abort();
      this.controller = new AbortController();
      this.logsFor = null;
      this.name = name;
    }
    this.aside.hidden = !name;
    if (!name) return;
    await this.refresh();
  }

  /** Fetches the task again and redraws (logs keep following the same attempt). */
  async refresh() {
    const name = this.name;
    if (!name) return;
    // Someone typing (a decision's data) keeps what they typed: redraw later.
    if (this.aside.contains(document.activeElement) && document.activeElement.matches("textarea, input[type=text]")) return;
    const signal = this.controller.signal;
    let task;
    try {
      task = await get(taskPath(this.id, name), { signal });
    } catch (error) {
      if (!signal.aborted) this.aside.replaceChildren(this.#head(name), notice(error.message, "error"));
      return;
    }
    if (signal.aborted || name !== this.name) return;
    const keepScroll = this.aside.scrollTop;
    const parts = [this.#head(name), this.#facts(task)];
    if (task.reason) parts.push(h("p", { class: "reason", role: "note" }, h("strong", {}, "Not running: "), task.reason));
    parts.push(this.#actions(task));
    if (task.full_error) parts.push(h("h3", {}, "Error"), h("pre", { class: "error-text", tabindex: 0 }, task.full_error));
    if (task.status === "completed") parts.push(await this.#output(signal));
    parts.push(this.#logs(task, signal));
    parts.push(this.#instances(task), this.#attempts(task), this.#events(task));
    this.aside.replaceChildren(...parts);
    this.aside.scrollTop = keepScroll;
  }

  #head(name) {
    const close = h("button", { type: "button", class: "quiet", "aria-label": "Close the task panel", onclick: () => this.onClose() }, "✕");
    return h("div", { class: "panel-head" }, h("h2", { id: "task-title" }, name), close);
  }

  #facts(task) {
    const rows = [
      ["State", badge(task.status)],
      ["Attempt", String(task.attempt)],
      ["Queue", task.queue],
      ["Started", when(task.started_at)],
      ["Finished", when(task.finished_at)],
      ["Duration", duration(task.duration_s)],
    ];
    if (task.items) rows.push(["Items", Object.entries(task.items).map(([k, v]) => `${v} ${k}`).join(", ")]);
    if (task.compensation) rows.push(["Undo", task.compensation]);
    return h("dl", { class: "facts" }, rows.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
  }

  #actions(task) {
    const box = h("div", { class: "actions" });
    const node = this.node(task.name);
    if (task.status === "waiting" && node?.signal) {
      const data = h("textarea", { rows: 3, class: "code", "aria-label": "Data sent with the decision (JSON)", placeholder: '{"note": "looks good"}' });
      data.value = this.drafts.get(task.name) ?? "";
      data.addEventListener("input", () => this.drafts.set(task.name, data.value));
      const said = h("p", { class: "small", role: "status" });
      const decide = (approved) => async () => {
        let extra = {};
        try {
          extra = data.value.trim() ? JSON.parse(data.value) : {};
        } catch (error) {
          said.replaceChildren(notice(`The data is not JSON: ${error.message}`, "error"));
          return;
        }
        const body = extra !== null && typeof extra === "object" && !Array.isArray(extra) ? { ...extra, approved } : { approved, data: extra };
        try {
          await post(`/v1/workflows/${enc(this.id)}/signals/${enc(node.signal)}`, body);
          said.textContent = `${approved ? "Approved" : "Rejected"}: signal '${node.signal}' sent.`;
          this.drafts.delete(task.name);
          this.onChange();
        } catch (error) {
          said.replaceChildren(notice(error.message, "error"));
        }
      };
      box.append(h("fieldset", { class: "decide" }, h("legend", {}, `Waiting for '${node.signal}'`), data,
        h("div", { class: "buttons" },
          h("button", { type: "button", class: "primary", onclick: decide(true) }, "Approve"),
          h("button", { type: "button", class: "danger", onclick: decide(false) }, "Reject")),
        said));
    }
    if (RETRYABLE.has(task.status)) {
      const said = h("span", { class: "small", role: "status" });
      const pick = h("input", { type: "checkbox", checked: this.selection.has(task.name) });
      pick.addEventListener("change", () => this.selection.toggle(task.name, pick.checked));
      box.append(h("div", { class: "buttons" },
        h("button", { type: "button", onclick: async (e) => {
          e.target.disabled = true;
          try {
            await post(`/v1/workflows/${enc(this.id)}/retry`, { tasks: [task.name] });
            said.textContent = "Retry sent.";
            this.onChange();
          } catch (error) {
            said.replaceChildren(notice(error.message, "error"));
          } finally {
            e.target.disabled = false;
          }
        } }, "Retry this task"),
        h("label", { class: "small" }, pick, " select for retry"),
        said));
    }
    return box;
  }

  async #output(signal) {
    try {
      const value = await get(`${taskPath(this.id, this.name)}/output`, { signal });
      const text = JSON.stringify(value, null, 2) ?? "null";
      return h("section", {}, h("h3", {}, "Output"), h("pre", { class: "output", tabindex: 0 }, text.length > 20000 ? `${text.slice(0, 20000)}\n…` : text));
    } catch (error) {
      const quiet = error instanceof ApiError && error.status === 409;
      return h("section", {}, h("h3", {}, "Output"), notice(quiet ? "No output." : error.message, quiet ? "muted" : "error"));
    }
  }

  #logs(task, signal) {
    if (task.attempt < 1 || this.node(task.name)?.signal) return "";
    // One log view per attempt: a redraw of the panel keeps the one already following.
    const key = `${task.name}#${task.attempt}`;
    if (this.logsFor?.key !== key) this.logsFor = { key, view: logView(this.id, task.name, task.attempt, signal) };
    return this.logsFor.view;
  }

  /** A foreach task's instances: each one's state, attempt, times and error. */
  #instances(task) {
    const all = task.instances ?? [];
    if (!all.length) return "";
    const total = Object.values(task.items ?? {}).reduce((a, n) => a + n, 0);
    const more = total > all.length ? h("p", { class: "small muted" }, `The first ${all.length} of ${total} instances.`) : "";
    return h("section", { class: "instances" }, h("h3", {}, "Instances"), more,
      h("div", { class: "scroll" }, h("table", { class: "small" },
        h("thead", {}, h("tr", {}, ["Instance", "State", "Attempt", "Started", "Duration", "Error"].map((c) => h("th", { scope: "col" }, c)))),
        h("tbody", {}, all.map((i) => h("tr", { dataset: { instance: i.name } },
          h("td", {}, i.name),
          h("td", {}, badge(i.status)),
          h("td", {}, String(i.attempt)),
          h("td", {}, when(i.started_at)),
          h("td", {}, duration(i.duration_s)),
          h("td", { class: "instance-error", title: i.error ?? "" }, i.error ? i.error.split("\n")[0] : "")))))));
  }

  #attempts(task) {
    if (!task.attempts?.length) return "";
    return h("section", {}, h("h3", {}, "Attempts"), h("table", { class: "small" },
      h("thead", {}, h("tr", {}, ["#", "Sent", "Started", "Ended", "Outcome"].map((c) => h("th", { scope: "col" }, c)))),
      h("tbody", {}, task.attempts.map((a) => h("tr", {},
        h("td", {}, String(a.attempt)),
        h("td", {}, when(a.enqueued_at ?? a.sent_at)),
        h("td", {}, when(a.started_at)),
        h("td", {}, when(a.finished_at ?? a.ended_at)),
        h("td", { title: a.detail ?? "" }, a.outcome ?? a.status ?? "…"))))));
  }

  #events(task) {
    if (!task.events?.length) return "";
    return h("section", {}, h("h3", {}, "Events"), h("ol", { class: "events small" },
      task.events.map((e) => h("li", {}, h("time", {}, when(e.at)), " ", h("strong", {}, e.kind), e.attempt ? ` #${e.attempt}` : "", e.detail ? ` — ${e.detail}` : ""))));
  }
}
