// Small helpers to build DOM and SVG, and to show times and durations.

const SVG_NS = "http://www.w3.org/2000/svg";

function fill(el, attrs, children) {
  for (const [key, value] of Object.entries(attrs ?? {})) {
    if (value == null || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") {
      el.addEventListener(key.slice(2), value);
    } else if (key === "dataset") {
      Object.assign(el.dataset, value);
    } else if (key === "text") {
      el.textContent = value;
    } else {
      el.setAttribute(key === "className" ? "class" : key, value === true ? "" : String(value));
    }
  }
  for (const child of children.flat(Infinity)) {
    if (child == null || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
  return el;
}

/** An HTML element: h("a", {href: "#/runs"}, "Runs"). */
export function h(tag, attrs, ...children) {
  return fill(document.createElement(tag), attrs, children);
}

/** An SVG element. */
export function s(tag, attrs, ...children) {
  return fill(document.createElementNS(SVG_NS, tag), attrs, children);
}

/** A local date and time for epoch seconds. */
export function when(epoch) {
  if (epoch == null) return "—";
  const d = new Date(epoch * 1000);
  const today = new Date().toDateString() === d.toDateString();
  return today ? d.toLocaleTimeString() : d.toLocaleString();
}

/** A duration in seconds, short: 850 ms, 12.3 s, 4 min 5 s, 2 h 3 min. */
export function duration(seconds) {
  if (seconds == null || Number.isNaN(seconds)) return "—";
  if (seconds < 1) return `${Math.round(seconds * 1000)} ms`;
  if (seconds < 60) return `${seconds.toFixed(seconds < 10 ? 1 : 0)} s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min ${Math.round(seconds % 60)} s`;
  return `${Math.floor(seconds / 3600)} h ${Math.round((seconds % 3600) / 60)} min`;
}

/** How long ago epoch seconds were. */
export function ago(epoch) {
  return epoch == null ? "—" : `${duration(Math.max(0, Date.now() / 1000 - epoch))} ago`;
}

/** A state badge. */
export function badge(state) {
  return h("span", { class: `badge s-${state ?? "none"}` }, state ?? "—");
}

/** A message in place of content (loading, empty, error). */
export function notice(text, kind = "muted") {
  return h("p", { class: `notice ${kind}`, role: kind === "error" ? "alert" : null }, text);
}

/** Resolves after `ms` milliseconds, or at once when `signal` aborts. */
export function pause(ms, signal) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener("abort", () => { clearTimeout(timer); resolve(); }, { once: true });
  });
}

/** Calls `fn` at most once per `ms`, with the latest call's timing (trailing edge). */
export function coalesce(fn, ms) {
  let timer = null;
  return () => {
    if (timer !== null) return;
    timer = setTimeout(() => { timer = null; fn(); }, ms);
  };
}

/** Rows that open on Enter (and on click), for keyboard use of tables. */
export function openable(row, open) {
  row.tabIndex = 0;
  row.classList.add("openable");
  row.addEventListener("click", (e) => {
    if (e.target.closest("a, button, input, label, select")) return;
    open();
  });
  row.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && e.target === row) open();
  });
  return row;
}
