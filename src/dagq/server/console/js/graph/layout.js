// Layered layouts of a DAG, top to bottom. quickLayout() ranks tasks by their longest
// path from a root and orders each layer by its parents' positions: a 2,000-node graph
// takes milliseconds, so it paints at once. dagreLayout() runs @dagrejs/dagre (vendored)
// in a Web Worker: crossings minimised and edges routed; the view swaps it in when done.

export const NODE_H = 48;
export const RANK_GAP = 46;
export const NODE_GAP = 18;
/** Past this many nodes dagre ranks by longest path: network simplex takes minutes. */
export const BIG = 300;

/** A node's width from its label (the name, or its marks line if longer). */
export function nodeWidth(name, sub) {
  const chars = Math.max(name.length, (sub?.length ?? 0) * 0.85);
  return Math.round(Math.min(260, Math.max(110, chars * 7.2 + 28)));
}

/**
 * Positions (centres) for `nodes` ([{id, w, h}]) and straight edges ([{source, target}]):
 * {nodes: Map id → {x, y}, edges: [[{x, y}, …]], width, height}.
 */
export function quickLayout(nodes, edges) {
  const index = new Map(nodes.map((n, i) => [n.id, i]));
  const parents = nodes.map(() => []);
  const children = nodes.map(() => []);
  for (const e of edges) {
    const a = index.get(e.source);
    const b = index.get(e.target);
    if (a === undefined || b === undefined) continue;
    parents[b].push(a);
    children[a].push(b);
  }
  // Kahn's order; a task's rank is one more than its highest-ranked parent.
  const rank = new Array(nodes.length).fill(0);
  const waiting = parents.map((p) => p.length);
  const order = [];
  for (let i = 0; i < nodes.length; i++) if (waiting[i] === 0) order.push(i);
  for (let k = 0; k < order.length; k++) {
    for (const c of children[order[k]]) {
      rank[c] = Math.max(rank[c], rank[order[k]] + 1);
      if (--waiting[c] === 0) order.push(c);
    }
  }
  const layers = [];
  for (const i of order) (layers[rank[i]] ??= []).push(i);
  const slot = new Array(nodes.length).fill(0);
  for (const layer of layers) {
    const centre = (i) =>
      parents[i].length ? parents[i].reduce((sum, p) => sum + slot[p], 0) / parents[i].length : slot[i];
    layer.forEach((i, k) => { slot[i] = k; });
    layer.sort((a, b) => centre(a) - centre(b) || a - b);
    layer.forEach((i, k) => { slot[i] = k; });
  }
  const widths = layers.map((layer) => layer.reduce((sum, i) => sum + nodes[i].w + NODE_GAP, -NODE_GAP));
  const width = Math.max(0, ...widths);
  const placed = new Map();
  layers.forEach((layer, r) => {
    let x = (width - widths[r]) / 2;
    for (const i of layer) {
      placed.set(nodes[i].id, { x: x + nodes[i].w / 2, y: r * (NODE_H + RANK_GAP) + NODE_H / 2 });
      x += nodes[i].w + NODE_GAP;
    }
  });
  const routes = edges.map((e) => {
    const a = placed.get(e.source);
    const b = placed.get(e.target);
    return a && b ? [{ x: a.x, y: a.y + NODE_H / 2 }, { x: b.x, y: b.y - NODE_H / 2 }] : [];
  });
  return { nodes: placed, edges: routes, width, height: layers.length * (NODE_H + RANK_GAP) - RANK_GAP };
}

let worker = null;
let asked = 0;
const answers = new Map();

/** dagre's layout, computed off the main thread; same shape as quickLayout's. */
export function dagreLayout(nodes, edges) {
  if (worker === null) {
    worker = new Worker(new URL("./layout-worker.js", import.meta.url), { type: "module" });
    worker.onmessage = ({ data }) => {
      const settle = answers.get(data.ticket);
      answers.delete(data.ticket);
      settle?.(data);
    };
  }
  const ticket = ++asked;
  return new Promise((resolve, reject) => {
    answers.set(ticket, (data) => {
      if (data.error) {
        reject(new Error(data.error));
        return;
      }
      resolve({
        nodes: new Map(data.nodes.map(([id, x, y]) => [id, { x, y }])),
        edges: data.edges,
        width: data.width,
        height: data.height,
      });
    });
    worker.postMessage({ ticket, nodes, edges, big: nodes.length > BIG });
  });
}
