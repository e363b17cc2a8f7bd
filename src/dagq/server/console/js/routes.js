// The console's addresses (the URL's fragment).

/** The fragment of a run (and one of its tasks). */
export function runHash(id, task) {
  const base = `#/runs/${encodeURIComponent(id)}`;
  return task ? `${base}/tasks/${task.split("/").map(encodeURIComponent).join("/")}` : base;
}

/** {page, params, query} from a fragment: #/runs, #/runs/<id>[/tasks/<name>], #/<page>. */
export function route(hash, pages) {
  const [path, search = ""] = hash.replace(/^#\/?/, "").split("?");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  const query = Object.fromEntries(new URLSearchParams(search));
  if (parts[0] === "runs" && parts[1]) {
    const task = parts[2] === "tasks" ? parts.slice(3).join("/") : null;
    return { page: "run", params: { id: parts[1], task }, query };
  }
  return { page: pages.includes(parts[0]) ? parts[0] : "runs", params: {}, query };
}
