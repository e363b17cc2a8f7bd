// Runs dagre's layout off the main thread (see layout.js).
import { graphlib, layout } from "../../vendor/dagre.js";
import { NODE_GAP, RANK_GAP } from "./layout.js";

self.onmessage = ({ data }) => {
  const { ticket, nodes, edges, big } = data;
  try {
    const g = new graphlib.Graph();
    g.setGraph({
      rankdir: "TB",
      nodesep: NODE_GAP,
      ranksep: RANK_GAP,
      edgesep: 8,
      marginx: 0,
      marginy: 0,
      ranker: big ? "longest-path" : "network-simplex",
    });
    g.setDefaultEdgeLabel(() => ({}));
    for (const n of nodes) g.setNode(n.id, { width: n.w, height: n.h });
    for (const e of edges) g.setEdge(e.source, e.target);
    layout(g);
    self.postMessage({
      ticket,
      nodes: nodes.map((n) => {
        const p = g.node(n.id);
        return [n.id, p.x, p.y];
      }),
      edges: edges.map((e) => g.edge(e.source, e.target)?.points ?? []),
      width: g.graph().width,
      height: g.graph().height,
    });
  } catch (error) {
    self.postMessage({ ticket, error: String(error) });
  }
};
