"""The state machine: how events move a workflow's runtime state. No I/O, no clock.

Every function takes the plan, the coordinator's working copy of the state, the
current time and an :class:`Effects` collector, changes the state and records what
must happen outside (task messages to send, workers to stop, history to append).
Applying an event twice, or an event of an older attempt, changes nothing
(DESIGN invariant 4). The state is changed in place rather than copied because a
100,000-task workflow must advance in time proportional to the event, not the run;
the coordinator discards the copy whenever a flush fails.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dagq import keys
from dagq.backoff import retry_delay
from dagq.expression import ExpressionError, truthy
from dagq.history import HistoryEntry
from dagq.messages import (
    CancelRequested,
    Event,
    RetryRequested,
    SubmitRequested,
    TaskFinished,
    TaskStarted,
)
from dagq.plan import POLICY_ALL, POLICY_ALL_SETTLED, POLICY_ANY, Plan
from dagq.state import BAD, TERMINAL, UNSET, WORKFLOW_TERMINAL, RunState, TaskStatus

WAIT, RUN, SKIP, UPSTREAM = 0, 1, 2, 3


@dataclass(slots=True)
class Dispatch:
    """Send a task message for ``attempt`` of ``task``, visible after ``delay_s``."""

    task: int
    attempt: int
    delay_s: float = 0.0


@dataclass(slots=True)
class Effects:
    """What the coordinator must do once the new state is durable."""

    dispatch: list[Dispatch] = field(default_factory=list)
    history: list[HistoryEntry] = field(default_factory=list)
    stop: bool = False
    finished: bool = False

    def note(
        self,
        at: float,
        kind: str,
        task: str | None = None,
        attempt: int = 0,
        detail: str | None = None,
    ) -> None:
        """Append a history entry."""
        self.history.append(HistoryEntry(at, kind, task, attempt, detail))


def verdict(policy: int, n_parents: int, done: int, skipped: int, bad: int) -> int:
    """Decide a pending task from its parents' tallies: WAIT, RUN, SKIP or UPSTREAM.

    A skipped parent counts as satisfied, except that a task whose parents were all
    skipped is skipped too (an untaken branch stays untaken).
    """
    if n_parents == 0:
        return RUN
    open_ = n_parents - done - skipped - bad
    if policy == POLICY_ALL:
        if bad:
            return UPSTREAM
        if open_:
            return WAIT
        return RUN if done else SKIP
    if policy in (POLICY_ANY, POLICY_ALL_SETTLED):
        if done and (policy == POLICY_ANY or not open_):
            return RUN
        if open_:
            return WAIT
        return UPSTREAM if bad else SKIP
    if done >= policy:
        return RUN
    if not open_:
        if done and done + skipped >= policy:
            return RUN
        return UPSTREAM if bad else SKIP
    return UPSTREAM if done + skipped + open_ < policy else WAIT


# --- entry points -----------------------------------------------------------------


def apply(plan: Plan, state: RunState, event: Event, now: float, fx: Effects) -> None:
    """Apply one event to the state."""
    _HANDLERS[type(event)](plan, state, event, now, fx)


def activate(plan: Plan, state: RunState, now: float, fx: Effects) -> None:
    """Start a submitted workflow: decide its roots. A no-op once started."""
    if state.status != "pending":
        return
    state.status = "running"
    state.updated_at = now
    state.dirty = True
    fx.note(state.created_at, "submitted", detail=f"{state.n_tasks} tasks")
    for root in plan.roots:
        _decide(plan, state, root, now, fx)
    _settle(plan, state, now, fx)


def cancel(
    plan: Plan, state: RunState, now: float, fx: Effects, reason: str, *, final: str = "cancelled"
) -> None:
    """Stop a run: unstarted tasks are cancelled at once, running ones told to stop.

    The workflow ends ``final`` (``cancelled``, or ``failed`` when a deadline passed)
    once no task is running.
    """
    if state.status in WORKFLOW_TERMINAL or state.status == "cancelling":
        return
    state.status = "cancelling"
    state.cancel_reason = reason
    state.cancelled_at = now
    state.final_on_cancel = final
    state.updated_at = now
    fx.stop = True
    fx.note(now, "cancel_requested", detail=reason)
    for i in range(state.n_tasks):
        if state.task_status[i] in (TaskStatus.PENDING, TaskStatus.READY):
            state.set_status(i, TaskStatus.CANCELLED)
            state.task_finished_at[i] = now
            fx.note(now, "cancelled", plan.tasks[i].name, state.attempt[i], reason)
    state.rebuild(plan)
    _settle(plan, state, now, fx)


def expire_attempt(
    plan: Plan, state: RunState, now: float, fx: Effects, *, task: int, attempt: int
) -> None:
    """Fail an attempt that outlived its timeout without a word from any worker."""
    timeout = plan.tasks[task].timeout_s
    event = TaskFinished(
        workflow_id=state.workflow_id,
        task=task,
        attempt=attempt,
        at=now,
        ok=False,
        error=f"no result from any worker within the {timeout:g}s timeout (worker lost?)",
    )
    _on_finished(plan, state, event, now, fx)


def abandon_running(plan: Plan, state: RunState, now: float, fx: Effects) -> None:
    """In a cancelling run, give up waiting for tasks whose workers did not answer."""
    if state.status != "cancelling":
        return
    for i in range(state.n_tasks):
        if state.task_status[i] == TaskStatus.RUNNING:
            state.set_status(i, TaskStatus.CANCELLED)
            state.task_finished_at[i] = now
            state.in_flight -= 1
            fx.note(now, "cancelled", plan.tasks[i].name, state.attempt[i], "no answer to stop")
    _settle(plan, state, now, fx)


# --- event handlers ---------------------------------------------------------------


def _on_submit(plan: Plan, state: RunState, event: Any, now: float, fx: Effects) -> None:
    activate(plan, state, now, fx)


def _on_cancel(plan: Plan, state: RunState, event: Any, now: float, fx: Effects) -> None:
    cancel(plan, state, now, fx, event.reason)


def _on_started(plan: Plan, state: RunState, event: Any, now: float, fx: Effects) -> None:
    i = event.task
    if not _current(state, i, event.attempt):
        return
    if state.task_status[i] == TaskStatus.READY:
        if state.dispatched_at[i] == UNSET:  # started before we knew it was sent
            state.held.remove(i)
            state.in_flight += 1
        state.set_status(i, TaskStatus.RUNNING)
    state.started_at[i] = event.at
    state.touch(i)


def _on_finished(plan: Plan, state: RunState, event: Any, now: float, fx: Effects) -> None:
    i = event.task
    if not _current(state, i, event.attempt):
        return
    task = plan.tasks[i]
    if state.task_status[i] == TaskStatus.READY and state.dispatched_at[i] == UNSET:
        state.held.remove(i)
    else:
        state.in_flight -= 1
    if state.started_at[i] == UNSET:
        state.started_at[i] = event.at - event.duration_s
    state.updated_at = now
    if event.ok:
        state.errors.pop(i, None)
        if event.output_ref is not None:
            state.output_refs[i] = event.output_ref
        elif event.output is not None:
            state.outputs[i] = event.output
        fx.note(event.at, "completed", task.name, event.attempt)
        _finish(plan, state, i, event.at, fx, status=TaskStatus.COMPLETED)
    else:
        _on_failure(plan, state, event, now, fx)
    _settle(plan, state, now, fx)


def _on_failure(plan: Plan, state: RunState, event: TaskFinished, now: float, fx: Effects) -> None:
    i = event.task
    task = plan.tasks[i]
    error = event.error or "failed without an error message"
    state.errors[i] = error
    used = event.attempt - state.retry_base.get(i, 0)
    if state.status == "cancelling":
        fx.note(event.at, "cancelled", task.name, event.attempt, error)
        _finish(plan, state, i, event.at, fx, status=TaskStatus.CANCELLED)
    elif event.retryable and used < task.max_attempts:
        key = keys.message_id(state.workflow_id, task.name, event.attempt)
        delay = event.retry_after_s
        if delay is None:
            delay = retry_delay(task.retry, used, key)
        fx.note(
            event.at,
            "retried",
            task.name,
            event.attempt,
            f"{error} (attempt {used + 1} of {task.max_attempts} in {delay:.1f}s)",
        )
        _make_ready(plan, state, i, now, fx, delay=delay)
    else:
        why = "" if event.retryable else " (not retryable)"
        fx.note(event.at, "failed", task.name, event.attempt, f"{error}{why}")
        _finish(plan, state, i, event.at, fx, status=TaskStatus.FAILED)


def _on_retry(plan: Plan, state: RunState, event: Any, now: float, fx: Effects) -> None:
    if state.status not in WORKFLOW_TERMINAL:
        fx.note(now, "retry_ignored", detail=f"the workflow is still {state.status}")
        return
    targets = _retry_targets(plan, state, event.tasks)
    if not targets:
        fx.note(now, "retry_ignored", detail="no failed, upstream_failed or cancelled task")
        return
    for i in targets:
        state.set_status(i, TaskStatus.PENDING)
        state.retry_base[i] = state.attempt[i]
        state.errors.pop(i, None)
        state.dispatched_at[i] = state.started_at[i] = state.task_finished_at[i] = UNSET
    state.status = "running"
    state.finished_at = UNSET
    state.error = state.cancel_reason = None
    state.cancelled_at = UNSET
    state.final_on_cancel = "cancelled"
    state.updated_at = now
    state.rebuild(plan)
    names = ", ".join(plan.tasks[i].name for i in targets[:10])
    more = f" and {len(targets) - 10} more" if len(targets) > 10 else ""
    fx.note(now, "retry_requested", detail=f"re-running {names}{more}")
    for i in targets:
        _decide(plan, state, i, now, fx)
    _settle(plan, state, now, fx)


def _retry_targets(plan: Plan, state: RunState, names: list[str]) -> list[int]:
    if not names:
        return [i for i in range(state.n_tasks) if state.task_status[i] in BAD]
    chosen = {plan.by_name[n] for n in names if n in plan.by_name}
    chosen = {i for i in chosen if state.task_status[i] in BAD}
    stack = list(chosen)
    while stack:  # their downstream casualties come back too
        for child in plan.tasks[stack.pop()].children:
            status = state.task_status[child]
            if child not in chosen and status in (TaskStatus.UPSTREAM_FAILED, TaskStatus.CANCELLED):
                chosen.add(child)
                stack.append(child)
    return sorted(chosen)


_HANDLERS: dict[type, Callable[[Plan, RunState, Any, float, Effects], None]] = {
    SubmitRequested: _on_submit,
    CancelRequested: _on_cancel,
    RetryRequested: _on_retry,
    TaskStarted: _on_started,
    TaskFinished: _on_finished,
}


# --- transitions ------------------------------------------------------------------


def _current(state: RunState, task: int, attempt: int) -> bool:
    """Is this event about the live attempt of a task that can still take it?"""
    return (
        0 <= task < state.n_tasks
        and state.attempt[task] == attempt
        and state.task_status[task] in (TaskStatus.READY, TaskStatus.RUNNING)
    )


def _decide(plan: Plan, state: RunState, task: int, now: float, fx: Effects) -> None:
    outcome = _evaluate(plan, state, task, now, fx)
    if outcome is not None:
        _finish(plan, state, task, now, fx, status=outcome)


def _evaluate(plan: Plan, state: RunState, i: int, now: float, fx: Effects) -> TaskStatus | None:
    """Make a pending task ready, or say which terminal status it must take (or wait)."""
    task = plan.tasks[i]
    decision = verdict(
        task.policy, len(task.parents), state.n_done[i], state.n_skip[i], state.n_bad[i]
    )
    if decision == WAIT:
        return None
    if decision == SKIP:
        fx.note(now, "skipped", task.name, detail="all parents were skipped")
        return TaskStatus.SKIPPED
    if decision == UPSTREAM:
        failed = [plan.tasks[p].name for p in task.parents if state.task_status[p] in BAD]
        state.errors[i] = f"upstream task(s) did not succeed: {', '.join(failed[:5])}"
        fx.note(now, "upstream_failed", task.name, detail=state.errors[i])
        return TaskStatus.UPSTREAM_FAILED
    if task.condition is not None:
        try:
            go = truthy(task.condition.evaluate(_condition_env(plan, state, i)))
        except ExpressionError as exc:
            state.errors[i] = f"condition could not be evaluated: {exc}"
            fx.note(now, "failed", task.name, detail=state.errors[i])
            return TaskStatus.FAILED
        if not go:
            fx.note(now, "skipped", task.name, detail="condition is false")
            return TaskStatus.SKIPPED
    _make_ready(plan, state, i, now, fx)
    return None


def _condition_env(plan: Plan, state: RunState, i: int) -> dict[str, Any]:
    return {"inputs": completed_outputs(plan, state, i), "params": plan.params}


def completed_outputs(plan: Plan, state: RunState, i: int) -> dict[str, Any]:
    """The outputs of the completed parents of task ``i``, by parent name.

    Outputs stored by reference must have been loaded into ``state.resolved``.
    """
    inputs: dict[str, Any] = {}
    for p in plan.tasks[i].parents:
        if state.task_status[p] != TaskStatus.COMPLETED:
            continue
        ref = state.output_refs.get(p)
        if ref is None:
            inputs[plan.tasks[p].name] = state.outputs.get(p)
        elif ref in state.resolved:
            inputs[plan.tasks[p].name] = state.resolved[ref]
        else:
            raise ExpressionError(f"the output of '{plan.tasks[p].name}' ({ref}) is not loaded")
    return inputs


def _make_ready(
    plan: Plan, state: RunState, i: int, now: float, fx: Effects, *, delay: float = 0.0
) -> None:
    state.attempt[i] += 1
    state.set_status(i, TaskStatus.READY)
    state.dispatched_at[i] = state.started_at[i] = state.task_finished_at[i] = UNSET
    limit = plan.max_parallelism
    if limit is not None and state.in_flight >= limit:
        state.held.append(i)
        return
    _dispatch(plan, state, i, now, fx, delay=delay)


def _dispatch(
    plan: Plan, state: RunState, i: int, now: float, fx: Effects, *, delay: float = 0.0
) -> None:
    state.dispatched_at[i] = now + delay
    state.in_flight += 1
    state.touch(i)
    fx.dispatch.append(Dispatch(i, state.attempt[i], delay))
    fx.note(now, "dispatched", plan.tasks[i].name, state.attempt[i])


def _finish(
    plan: Plan, state: RunState, i: int, at: float, fx: Effects, *, status: TaskStatus
) -> None:
    """Make ``i`` terminal and settle every descendant this decides, without recursion."""
    work = [(i, status)]
    while work:
        j, outcome = work.pop()
        state.set_status(j, outcome)
        state.task_finished_at[j] = at
        if outcome is TaskStatus.COMPLETED:
            counter = state.n_done
        elif outcome is TaskStatus.SKIPPED:
            counter = state.n_skip
        else:
            counter = state.n_bad
        for child in plan.tasks[j].children:
            counter[child] += 1
            if state.task_status[child] == TaskStatus.PENDING and state.status == "running":
                decided = _evaluate(plan, state, child, at, fx)
                if decided is not None:
                    work.append((child, decided))


def _settle(plan: Plan, state: RunState, now: float, fx: Effects) -> None:
    """Refill free parallelism slots, then end the run if every task is terminal."""
    limit = plan.max_parallelism
    while state.held and (limit is None or state.in_flight < limit):
        i = state.held.popleft()
        if state.task_status[i] == TaskStatus.READY and state.dispatched_at[i] == UNSET:
            _dispatch(plan, state, i, now, fx)
    if state.n_terminal == state.n_tasks and state.status in ("running", "cancelling"):
        _finalize(plan, state, now, fx)


def _finalize(plan: Plan, state: RunState, now: float, fx: Effects) -> None:
    if state.status == "cancelling":
        final = state.final_on_cancel
        state.error = state.cancel_reason
    else:
        culprits = [
            i
            for i in range(state.n_tasks)
            if state.task_status[i] in BAD and (plan.all_tasks_must_succeed or plan.is_sink[i])
        ]
        final = "failed" if culprits else "completed"
        state.error = _failure_summary(plan, state, culprits) if culprits else None
    state.status = final
    state.finished_at = now
    state.updated_at = now
    state.dirty = True
    fx.finished = True
    fx.note(now, f"workflow_{final}", detail=state.error)


def _failure_summary(plan: Plan, state: RunState, culprits: list[int]) -> str:
    """Name the root causes: failed tasks first, then what they took down."""
    failed = [i for i in range(state.n_tasks) if state.task_status[i] == TaskStatus.FAILED]
    first = failed or culprits
    i = first[0]
    status = TaskStatus(state.task_status[i]).label
    summary = f"task '{plan.tasks[i].name}' {status}: {state.errors.get(i, status)}"
    if len(first) > 1:
        summary += f" (and {len(first) - 1} more)"
    return summary


def is_terminal(status: int) -> bool:
    """Has a task with this status finished for good?"""
    return status in TERMINAL
