// The DAG as SVG: nodes coloured by state (CSS classes s-<state>), pan (drag), zoom
// (wheel, + / − / fit), and keyboard use: Tab to a node, arrows to its parent (↑),
// child (↓) or neighbours (← →), Enter opens it, Space selects it.
import { s } from "../dom.js";
import { BIG, NODE_H, dagreLayout, nodeWidth, quickLayout } from "./layout.js";

/** Small graphs wait for dagre (milliseconds) rather than paint twice. */
const WAIT_FOR_DAGRE = 150;

/** The second line of a node: state, then what it does beyond running once. */
export function subline(node) {
  const parts = node.state ? [node.state] : [];
  for (const mark of node.marks ?? []) {
    if (mark.startsWith("foreach")) {
      const items = node.items;
      if (items) {
        const total = Object.values(items).reduce((a, b) => a + b, 0);
        const done = (items.completed ?? 0) + (items.skipped ?? 0);
        parts.push(`▦ ${done}/${total} items`);
      } else {
        parts.push("▦ foreach");
      }
    } else if (mark.startsWith("loop")) {
      const max = mark.replace("loop ≤", "");
      parts.push(node.iteration ? `↻ iteration ${node.iteration}/${max}` : `↻ loop ≤${max}`);
    } else if (mark.startsWith("wait_for")) {
      parts.push(`waits for '${node.signal ?? "signal"}'`);
    } else if (mark.startsWith("sleep")) {
      parts.push(`timer: ${mark}`);
    } else if (mark === "compensate") {
      parts.push("↺ undo");
    }
  }
  return parts.join(" · ");
}

function kinds(node) {
  const marks = node.marks ?? [];
  const has = (prefix) => marks.some((m) => m.startsWith(prefix));
  return { foreach: has("foreach"), loop: has("loop"), wait: has("wait_for"), timer: has("sleep") };
}

const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" };
const esc = (text) => String(text).replace(/[&<>"]/g, (c) => ESCAPES[c]);

const ITEM_STATES = ["completed", "running", "ready", "pending", "failed", "skipped", "cancelled", "upstream_failed"];

export class GraphView {
  /** `onOpen(name)` on Enter or click; `onSelect(names)` when the selection changes. */
  constructor(container, { onOpen = () => {}, onSelect = () => {}, label = "Workflow graph" } = {}) {
    this.onOpen = onOpen;
    this.onSelect = onSelect;
    this.selected = new Set();
    this.k = 1;
    this.tx = 0;
    this.ty = 0;
    this.edgesG = s("g", { class: "edges" });
    this.nodesG = s("g", { class: "nodes" });
    this.viewport = s("g", { class: "viewport" }, this.edgesG, this.nodesG);
    this.svg = s(
      "svg",
      { class: "dag", role: "group", "aria-label": label },
      s("defs", {}, s("marker", {
        id: "arrow", viewBox: "0 0 8 8", refX: 8, refY: 4, markerWidth: 8, markerHeight: 8, markerUnits: "userSpaceOnUse", orient: "auto",
      }, s("path", { d: "M0,0 L8,4 L0,8 z", class: "arrow" }))),
      this.viewport,
    );
    const tool = (text, title, fn) => {
      const b = document.createElement("button");
      b.type = "button";
      b.textContent = text;
      b.title = title;
      b.setAttribute("aria-label", title);
      b.addEventListener("click", fn);
      return b;
    };
    const tools = document.createElement("div");
    tools.className = "dag-tools";
    tools.append(
      tool("+", "Zoom in", () => this.zoomBy(1.25)),
      tool("−", "Zoom out", () => this.zoomBy(0.8)),
      tool("Fit", "Fit the graph", () => this.fit()),
    );
    this.status = document.createElement("span");
    this.status.className = "muted small";
    tools.append(this.status);
    container.append(tools, this.svg);
    this.#interact();
  }

  /** Draws `graph` ({nodes, edges}); resolves once the final (dagre) layout is shown. */
  async setGraph(graph) {
    performance.mark("dag-start");
    this.graph = graph;
    this.byName = new Map(graph.nodes.map((n) => [n.name, n]));
    this.sizes = graph.nodes.map((n) => ({
      id: n.name,
      w: nodeWidth(n.name, `${subline({ ...n, state: "upstream_failed" })}`),
      h: NODE_H,
    }));
    const edges = graph.edges.map((e) => ({ source: e.source, target: e.target }));
    this.parents = new Map();
    this.children = new Map();
    for (const e of graph.edges) {
      (this.parents.get(e.target) ?? this.parents.set(e.target, []).get(e.target)).push(e.source);
      (this.children.get(e.source) ?? this.children.set(e.source, []).get(e.source)).push(e.target);
    }
    const dagre = dagreLayout(this.sizes, edges);
    if (graph.nodes.length <= WAIT_FOR_DAGRE) {
      let found;
      try {
        found = await dagre;
      } catch {
        found = quickLayout(this.sizes, edges);
      }
      this.#draw(found, true);
      await this.#painted();
      performance.mark("dag-first-paint");
      performance.mark("dag-layout");
      return;
    }
    const quick = quickLayout(this.sizes, edges);
    performance.mark("dag-quick");
    this.#draw(quick, true);
    performance.mark("dag-drawn");
    this.status.textContent = `${graph.nodes.length} tasks — arranging…`;
    await this.#painted();
    performance.mark("dag-first-paint");
    try {
      const found = await dagre;
      if (this.graph !== graph) return;
      this.#draw(found, false);
      this.status.textContent = `${graph.nodes.length} tasks`;
    } catch (error) {
      this.status.textContent = `${graph.nodes.length} tasks (quick layout: ${error.message})`;
    }
    performance.mark("dag-layout");
  }

  #painted() {
    return new Promise((resolve) => requestAnimationFrame(() => requestAnimationFrame(resolve)));
  }

  #draw(layout, first) {
    const focused = document.activeElement?.closest?.(".node")?.dataset.name;
    this.layout = layout;
    this.width = layout.width;
    this.height = layout.height;
    // Fitted before the nodes go in: measuring the view then costs nothing, and a large
    // graph shown from afar is inserted without its text to lay out.
    if (first) this.fit();
    // Markup parsed at once: far faster than an element at a time for thousands.
    let edges = "";
    const ends = [];
    this.graph.edges.forEach((e, i) => {
      const points = layout.edges[i];
      if (!points?.length) return;
      const d = points.map((p, k) => `${k ? "L" : "M"}${p.x.toFixed(1)},${p.y.toFixed(1)}`).join("");
      edges += `<path class="edge${e.conditional ? " conditional" : ""}" d="${d}" marker-end="url(#arrow)"/>`;
      ends.push(e);
    });
    this.edgesG.innerHTML = edges;
    this.edgeEls = new Map();
    [...this.edgesG.children].forEach((path, i) => {
      for (const end of [ends[i].source, ends[i].target]) {
        (this.edgeEls.get(end) ?? this.edgeEls.set(end, []).get(end)).push(path);
      }
    });
    let nodes = "";
    const drawn = [];
    this.graph.nodes.forEach((n, i) => {
      const p = layout.nodes.get(n.name);
      if (!p) return;
      nodes += this.#node(this.byName.get(n.name), this.sizes[i].w, p);
      drawn.push(n.name);
    });
    this.nodesG.innerHTML = nodes;
    this.nodeEls = new Map();
    [...this.nodesG.children].forEach((g, i) => this.nodeEls.set(drawn[i], g));
    if (focused) this.nodeEls.get(focused)?.focus({ preventScroll: true });
  }

  #node(n, w, p) {
    const look = this.#look(n, w);
    const chars = Math.floor((w - 20) / 7.2);
    const name = n.name.length > chars ? `${n.name.slice(0, chars - 1)}…` : n.name;
    const x = (p.x - w / 2).toFixed(1);
    const y = (p.y - NODE_H / 2).toFixed(1);
    const stack = look.cls.includes(" foreach") ? `<rect class="stack" x="5" y="5" width="${w}" height="${NODE_H}" rx="7"/>` : "";
    return `<g class="${look.cls}" tabindex="0" role="button" data-name="${esc(n.name)}" data-width="${w}" `
      + `transform="translate(${x},${y})" aria-label="${esc(look.label)}">${stack}`
      + `<rect class="box" width="${w}" height="${NODE_H}" rx="7"/>`
      + `<text class="name" x="10" y="19">${esc(name)}</text><text class="sub" x="10" y="36">${esc(look.sub)}</text>`
      + `<g class="items">${look.bars}</g><title>${esc(look.title)}</title></g>`;
  }

  /** How node `n` looks: its classes, second line, tooltip, label and item bar. */
  #look(n, w) {
    const kind = kinds(n);
    const sub = subline(n);
    let cls = `node s-${n.state ?? "none"}`;
    for (const k of ["foreach", "loop", "wait", "timer"]) if (kind[k]) cls += ` ${k}`;
    if (this.selected.has(n.name)) cls += " selected";
    let bars = "";
    if (n.items) {
      const total = Object.values(n.items).reduce((a, b) => a + b, 0) || 1;
      let x = 6;
      for (const state of ITEM_STATES) {
        const count = n.items[state] ?? 0;
        if (!count) continue;
        const part = ((w - 12) * count) / total;
        bars += `<rect class="seg s-${state}" x="${x.toFixed(1)}" y="${NODE_H - 7}" width="${part.toFixed(1)}" height="3"/>`;
        x += part;
      }
    }
    const title = [n.name, sub, n.condition ? `if ${n.condition}` : null, n.queue ? `queue ${n.queue}` : null].filter(Boolean).join("\n");
    return { cls, sub, title, label: `${n.name}: ${sub || "task"}`, bars };
  }

  #paint(g, n) {
    const look = this.#look(n, Number(g.dataset.width));
    g.setAttribute("class", look.cls);
    g.setAttribute("aria-label", look.label);
    g.querySelector(".sub").textContent = look.sub;
    g.querySelector("title").textContent = look.title;
    g.querySelector(".items").innerHTML = look.bars;
  }

  /** New states (and items, iterations) for the nodes named in `nodes`, in place. */
  update(nodes) {
    for (const n of nodes) {
      const old = this.byName?.get(n.name);
      if (!old) continue;
      const merged = { ...old, ...n };
      if (merged.state === old.state && merged.iteration === old.iteration
        && JSON.stringify(merged.items) === JSON.stringify(old.items)) continue;
      this.byName.set(n.name, merged);
      const g = this.nodeEls?.get(n.name);
      if (g) this.#paint(g, merged);
    }
  }

  setSelected(names) {
    this.selected = new Set(names);
    for (const [name, g] of this.nodeEls ?? []) g.classList.toggle("selected", this.selected.has(name));
  }

  focusNode(name) {
    const g = this.nodeEls?.get(name);
    if (!g) return;
    g.focus({ preventScroll: true });
    this.#reveal(name);
  }

  #reveal(name) {
    const p = this.layout?.nodes.get(name);
    if (!p) return;
    const r = this.svg.getBoundingClientRect();
    const x = p.x * this.k + this.tx;
    const y = p.y * this.k + this.ty;
    if (x < 40 || x > r.width - 40 || y < 40 || y > r.height - 40) {
      this.tx = r.width / 2 - p.x * this.k;
      this.ty = r.height / 2 - p.y * this.k;
      this.#apply();
    }
  }

  fit() {
    const r = this.svg.getBoundingClientRect();
    const w = Math.max(r.width, 200);
    const h = Math.max(r.height, 200);
    this.k = Math.max(0.2, Math.min(1.4, (w - 40) / (this.width || 1), (h - 40) / (this.height || 1)));
    this.tx = (w - this.width * this.k) / 2;
    this.ty = this.height * this.k < h ? (h - this.height * this.k) / 2 : 20;
    this.#apply();
  }

  zoomBy(factor, cx, cy) {
    const r = this.svg.getBoundingClientRect();
    const x = cx ?? r.width / 2;
    const y = cy ?? r.height / 2;
    const k = Math.max(0.05, Math.min(3, this.k * factor));
    this.tx = x - ((x - this.tx) * k) / this.k;
    this.ty = y - ((y - this.ty) * k) / this.k;
    this.k = k;
    this.#apply();
  }

  #apply() {
    this.viewport.setAttribute("transform", `translate(${this.tx.toFixed(1)},${this.ty.toFixed(1)}) scale(${this.k.toFixed(4)})`);
    this.svg.classList.toggle("far", this.k < 0.45);
  }

  #toggle(name) {
    if (this.selected.has(name)) this.selected.delete(name);
    else this.selected.add(name);
    this.nodeEls.get(name)?.classList.toggle("selected", this.selected.has(name));
    this.onSelect([...this.selected]);
  }

  #interact() {
    let drag = null;
    this.svg.addEventListener("pointerdown", (e) => {
      if (e.button !== 0 || e.target.closest(".node")) return;
      drag = { x: e.clientX, y: e.clientY, tx: this.tx, ty: this.ty };
      this.svg.setPointerCapture(e.pointerId);
      this.svg.classList.add("dragging");
    });
    this.svg.addEventListener("pointermove", (e) => {
      if (!drag) return;
      this.tx = drag.tx + e.clientX - drag.x;
      this.ty = drag.ty + e.clientY - drag.y;
      this.#apply();
    });
    const end = () => {
      drag = null;
      this.svg.classList.remove("dragging");
    };
    this.svg.addEventListener("pointerup", end);
    this.svg.addEventListener("pointercancel", end);
    this.svg.addEventListener("wheel", (e) => {
      e.preventDefault();
      const r = this.svg.getBoundingClientRect();
      this.zoomBy(Math.exp(-e.deltaY * 0.0015), e.clientX - r.left, e.clientY - r.top);
    }, { passive: false });
    this.svg.addEventListener("click", (e) => {
      const g = e.target.closest(".node");
      if (!g) return;
      if (e.shiftKey || e.ctrlKey || e.metaKey) this.#toggle(g.dataset.name);
      else this.onOpen(g.dataset.name);
    });
    this.svg.addEventListener("focusin", (e) => {
      const g = e.target.closest(".node");
      if (!g) return;
      for (const path of this.edgeEls.get(g.dataset.name) ?? []) path.classList.add("hi");
      this.#reveal(g.dataset.name);
    });
    this.svg.addEventListener("focusout", (e) => {
      const g = e.target.closest(".node");
      if (g) for (const path of this.edgeEls.get(g.dataset.name) ?? []) path.classList.remove("hi");
    });
    this.svg.addEventListener("keydown", (e) => {
      const g = e.target.closest(".node");
      if (!g) return;
      const name = g.dataset.name;
      if (e.key === "Enter") {
        e.preventDefault();
        this.onOpen(name);
      } else if (e.key === " ") {
        e.preventDefault();
        this.#toggle(name);
      } else if (e.key.startsWith("Arrow")) {
        e.preventDefault();
        const next = this.#neighbour(name, e.key);
        if (next) this.focusNode(next);
      }
    });
  }

  #neighbour(name, key) {
    if (key === "ArrowUp") return this.parents.get(name)?.[0];
    if (key === "ArrowDown") return this.children.get(name)?.[0];
    const p = this.layout.nodes.get(name);
    let best = null;
    let gap = Infinity;
    for (const [other, q] of this.layout.nodes) {
      if (Math.abs(q.y - p.y) > 1 || other === name) continue;
      const dx = key === "ArrowRight" ? q.x - p.x : p.x - q.x;
      if (dx > 0 && dx < gap) {
        gap = dx;
        best = other;
      }
    }
    return best;
  }
}
