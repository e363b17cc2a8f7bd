// The states a run and a task can be in, in the order the console lists them.

export const RUN_STATES = ["pending", "running", "compensating", "completed", "failed", "cancelled", "compensation_failed", "quarantined"];
export const FINAL_RUN_STATES = new Set(["completed", "failed", "cancelled", "compensation_failed"]);
export const TASK_STATES = ["pending", "ready", "running", "waiting", "completed", "failed", "skipped", "upstream_failed", "cancelled"];

/**
 * The state a task is in right after a history entry of `kind` (null: not a change).
 * Some changes write no entry (a foreach instance's progress, a store written by an older
 * dagq without `started`), so the run page also re-reads the states while the run goes on.
 */
export function stateAfter(kind) {
  switch (kind) {
    case "dispatched": case "retried": return "ready";
    case "started": return "running";
    case "waiting": return "waiting";
    case "completed": case "failed": case "skipped": case "upstream_failed": case "cancelled": return kind;
    default: return null;
  }
}
