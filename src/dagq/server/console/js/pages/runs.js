// Runs: a live list with filters (name, status, tenant, label, time), counts by status
// over the whole store (GET /v1/workflows/counts, under the same filters), a throughput
// sparkline, and bulk cancel/retry by filter after a dry-run count.
import { ApiError, get, post, query } from "../api.js";
import { ago, badge, coalesce, h, notice, openable, pause, when } from "../dom.js";
import { runHash } from "../routes.js";
import { sparkline } from "../sparkline.js";
import { FINAL_RUN_STATES, RUN_STATES } from "../states.js";
import { follow } from "../sse.js";

const PAGE = 200;
const FILTERS = ["name", "status", "tenant", "label", "created_after", "created_before"];

function filtersOf(q) {
  return Object.fromEntries(FILTERS.map((f) => [f, q[f] ?? ""]));
}

/** A datetime-local value as epoch seconds (the API takes either). */
function epoch(local) {
  return local ? String(new Date(local).getTime() / 1000) : "";
}

function filterForm(filters) {
  const input = (name, label, attrs = {}) =>
    h("label", {}, label, h("input", { name, value: filters[name], ...attrs }));
  const status = h("select", { name: "status" }, h("option", { value: "" }, "any"),
    RUN_STATES.map((st) => h("option", { value: st, selected: filters.status === st }, st)));
  const form = h("form", { class: "filters", role: "search", "aria-label": "Filter runs" },
    input("name", "Name", { placeholder: "any", type: "search" }),
    h("label", {}, "Status", status),
    input("tenant", "Tenant", { placeholder: "any" }),
    input("label", "Label", { placeholder: "key=value" }),
    input("created_after", "Created after", { type: "datetime-local" }),
    input("created_before", "Created before", { type: "datetime-local" }),
    h("button", { type: "submit", class: "primary" }, "Filter"),
    h("button", { type: "reset" }, "Clear"),
  );
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const data = new FormData(form);
    location.hash = `#/runs${query(Object.fromEntries(FILTERS.map((f) => [f, data.get(f)])))}`;
  });
  form.addEventListener("reset", (e) => {
    e.preventDefault();
    location.hash = "#/runs";
  });
  return form;
}

function apiFilters(filters) {
  return {
    ...filters,
    created_after: epoch(filters.created_after),
    created_before: epoch(filters.created_before),
  };
}

export async function render(main, { query: q, signal }) {
  const filters = filtersOf(q);
  const rows = new Map();
  const counts = h("div", { class: "counts", role: "group", "aria-label": "Runs by status", title: "Every run in the store matching the filters (whatever the status filter), by status" });
  const spark = h("div", { class: "spark" });
  const body = h("tbody");
  const table = h("table", { class: "runs" },
    h("caption", { class: "sr-only" }, "Runs, newest first"),
    h("thead", {}, h("tr", {}, ["Run", "Name", "Status", "Progress", "Created", "Updated", "Tenant", "Labels"].map((c) => h("th", { scope: "col" }, c)))),
    body);
  const bulk = h("section", { class: "bulk", "aria-label": "Act on every matching run" });
  const message = h("div", { class: "message", role: "status" });
  const more = h("button", { type: "button", hidden: true }, "Show older runs");
  let cursor = null;
  main.append(
    h("div", { class: "page-head" }, h("h1", {}, "Runs"), counts, spark),
    filterForm(filters),
    bulk,
    message,
    h("div", { class: "scroll" }, table),
    more,
  );

  const draw = () => {
    const list = [...rows.values()].sort((a, b) => b.created_at - a.created_at);
    const finished = list.filter((r) => FINAL_RUN_STATES.has(r.status)).map((r) => r.updated_at);
    spark.replaceChildren(h("span", { class: "muted small" }, "finished, last hour"), sparkline(finished, { label: "runs finished: " }));
    body.replaceChildren(...list.map((r) => {
      const done = Object.entries(r.counts ?? {}).filter(([k]) => ["completed", "skipped", "failed", "cancelled", "upstream_failed"].includes(k))
        .reduce((a, [, n]) => a + n, 0);
      const row = h("tr", { dataset: { id: r.id }, "aria-label": `${r.id} ${r.status}` },
        h("td", {}, h("a", { href: runHash(r.id), tabindex: -1 }, r.id)),
        h("td", {}, r.name),
        h("td", {}, badge(r.status)),
        h("td", {}, h("progress", { max: r.total || 1, value: done, "aria-label": `${done} of ${r.total} tasks done` }), ` ${done}/${r.total}`),
        h("td", { title: new Date(r.created_at * 1000).toISOString() }, when(r.created_at)),
        h("td", {}, ago(r.updated_at)),
        h("td", {}, r.tenant || "—"),
        h("td", { class: "small" }, Object.entries(r.labels ?? {}).map(([k, v]) =>
          h("a", { class: "label", href: `#/runs${query({ ...filters, label: `${k}=${v}` })}` }, `${k}=${v}`))));
      return openable(row, () => { location.hash = runHash(r.id); });
    }));
    if (!list.length) body.append(h("tr", {}, h("td", { colspan: 8 }, notice("No runs match."))));
  };
  const redraw = coalesce(draw, 150);

  // Counted by the store's index, not from the rows listed: every run matching the
  // filters but the status one (each count links to that status).
  const recount = async () => {
    const { status, ...others } = apiFilters(filters);
    let found;
    try {
      found = await get(`/v1/workflows/counts${query(others)}`, { signal });
    } catch (error) {
      if (!signal.aborted) counts.replaceChildren(notice(`counts: ${error.message}`, "error"));
      return;
    }
    const order = (st) => { const i = RUN_STATES.indexOf(st); return i < 0 ? RUN_STATES.length : i; };
    const entries = Object.entries(found.counts).sort(([a], [b]) => order(a) - order(b));
    counts.replaceChildren(
      h("a", { href: `#/runs${query({ ...filters, status: "" })}`, class: "count total", "aria-current": status ? null : "true" }, `all ${found.total}`),
      ...entries.map(([st, n]) =>
        h("a", { href: `#/runs${query({ ...filters, status: st })}`, class: `count s-${st}`, "aria-current": st === status ? "true" : null, dataset: { status: st } }, badge(st), ` ${n}`)));
  };
  const recountSoon = coalesce(recount, 1000);
  const changed = () => { redraw(); recountSoon(); };

  const load = async () => {
    const page = await get(`/v1/workflows${query({ ...apiFilters(filters), limit: PAGE })}`, { signal });
    rows.clear();
    for (const r of page.items) rows.set(r.id, r);
    cursor = page.next_cursor;
    more.hidden = !cursor;
    draw();
    await recount();
  };
  more.addEventListener("click", async () => {
    more.disabled = true;
    try {
      const page = await get(`/v1/workflows${query({ ...apiFilters(filters), limit: PAGE, cursor })}`, { signal });
      for (const r of page.items) rows.set(r.id, r);
      cursor = page.next_cursor;
      more.hidden = !cursor;
      draw();
    } catch (error) {
      message.replaceChildren(notice(error.message, "error"));
    } finally {
      more.disabled = false;
    }
  });
  try {
    await load();
  } catch (error) {
    message.replaceChildren(notice(error.message, "error"));
    return;
  }
  bulkActions(bulk, filters, load, signal);
  live(filters, rows, changed, load, signal);
}

function matches(row, filters) {
  return (!filters.status || row.status === filters.status) && (!filters.name || row.name === filters.name)
    && (!filters.tenant || row.tenant === filters.tenant);
}

/** Follows /v1/stream; a server without it is polled instead. */
function live(filters, rows, redraw, load, signal) {
  const indicator = document.getElementById("live");
  const path = `/v1/stream${query(apiFilters(filters))}`;
  follow(path, (event) => {
    if (event.event !== "workflow" && event.event !== "message") return;
    const row = JSON.parse(event.data);
    if (!row?.id || !matches(row, filters)) return;
    rows.set(row.id, row);
    redraw();
  }, {
    signal,
    onState: async (state, error) => {
      indicator.textContent = state === "live" ? "● live" : state === "reconnecting" ? "reconnecting…" : "";
      if (state === "failed" && error instanceof ApiError && error.status === 404) {
        indicator.textContent = "● polling";
        while (!signal.aborted) {
          await pause(2000, signal);
          if (!signal.aborted) await load().catch(() => {});
        }
      }
    },
  });
  signal.addEventListener("abort", () => { indicator.textContent = ""; }, { once: true });
}

function bulkActions(section, filters, reload, signal) {
  const any = Object.values(filters).some(Boolean);
  const scope = any ? "every run matching the filters" : "every run";
  const start = (action) => async () => {
    const body = { ...apiFilters(filters), dry_run: true };
    for (const k of Object.keys(body)) if (body[k] === "") delete body[k];
    section.replaceChildren(notice(`Counting the runs a ${action} would touch…`));
    try {
      if (action === "cancel") body.reason = "cancelled from the console (by filter)";
      const dry = await post(`/v1/workflows/${action}`, body, { signal });
      const confirm = h("button", { type: "button", class: "danger" }, `${action === "cancel" ? "Cancel" : "Retry"} ${dry.matched} run${dry.matched === 1 ? "" : "s"}`);
      const back = h("button", { type: "button" }, "Back");
      section.replaceChildren(
        h("p", { class: "dry-run", role: "status" }, `Dry run: ${action} would act on `, h("strong", {}, String(dry.matched)), ` run${dry.matched === 1 ? "" : "s"} (${scope}).`),
        confirm, back);
      back.addEventListener("click", idle);
      confirm.addEventListener("click", async () => {
        confirm.disabled = true;
        const done = await post(`/v1/workflows/${action}`, { ...body, dry_run: false }, { signal });
        section.replaceChildren(h("p", { role: "status" }, `${action === "cancel" ? "Cancelled" : "Retried"} ${done.matched} run${done.matched === 1 ? "" : "s"}.`), h("button", { type: "button", onclick: idle }, "OK"));
        await reload();
      });
      confirm.focus();
    } catch (error) {
      section.replaceChildren(notice(`${action} by filter: ${error.message}`, "error"), h("button", { type: "button", onclick: idle }, "OK"));
    }
  };
  function idle() {
    section.replaceChildren(
      h("span", { class: "muted" }, `Act on ${scope}: `),
      h("button", { type: "button", onclick: start("cancel") }, "Cancel…"),
      h("button", { type: "button", onclick: start("retry") }, "Retry…"));
  }
  idle();
}
