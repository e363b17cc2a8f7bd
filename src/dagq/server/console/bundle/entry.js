// The one entry point of the vendored bundle: the graph layout the console uses.
export { layout, graphlib } from "@dagrejs/dagre";
