// A read-only page of one API listing as a table, refreshed every few seconds.
import { ApiError, get } from "../api.js";
import { h, notice, pause } from "../dom.js";

/**
 * columns: [[header, (item) => cell]]. `rowsOf(body)` picks the items; `extra(body)`
 * adds content above the table; `decorate(row, item)` may add to each row.
 */
export async function tablePage(main, signal, { title, path, columns, rowsOf = (b) => b.items, empty, intro, extra, decorate, every = 5000 }) {
  const body = h("tbody");
  const above = h("div");
  const message = h("div", { class: "message", role: "status" });
  main.append(h("h1", {}, title), intro ? h("p", { class: "muted" }, intro) : "", above, message,
    h("div", { class: "scroll" }, h("table", {}, h("thead", {}, h("tr", {}, columns.map(([c]) => h("th", { scope: "col" }, c)))), body)));
  const load = async () => {
    const found = await get(path, { signal });
    if (extra) above.replaceChildren(extra(found));
    const items = rowsOf(found);
    body.replaceChildren(...items.map((item) => {
      const row = h("tr", { tabindex: 0 }, columns.map(([, cell]) => h("td", {}, cell(item))));
      decorate?.(row, item);
      return row;
    }));
    if (!items.length) body.append(h("tr", {}, h("td", { colspan: columns.length }, notice(empty))));
    message.replaceChildren();
  };
  const reload = async () => {
    try {
      await load();
    } catch (error) {
      if (signal.aborted) return;
      const missing = error instanceof ApiError && error.status === 404;
      message.replaceChildren(notice(missing ? `This server does not offer ${path} (a newer dagq does).` : error.message, "error"));
    }
  };
  await reload();
  (async () => {
    while (!signal.aborted) {
      await pause(every, signal);
      if (!signal.aborted && !document.hidden) await reload();
    }
  })();
  return { reload };
}
