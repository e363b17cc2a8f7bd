"""The state machine: how events move a workflow's runtime state. No I/O, no clock.

Every function takes the plan, the coordinator's working copy of the state, the
current time and an :class:`Effects` collector, changes the state and records what
must happen outside (task messages to send, workers to stop, timers to watch,
history to append). Applying an event twice, or an event of an older attempt,
changes nothing (docs/architecture.md, invariant 4). The state is changed in place rather than
copied because a 100,000-task workflow must advance in time proportional to the
event, not the run; the coordinator discards the copy whenever a flush fails.

The task-level moves (decide, start, finish and the cascade) are in
:mod:`dagq.transitions`; this module turns events and sweeps into them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dagq import keys
from dagq.backoff import retry_delay
from dagq.expression import ExpressionError, truthy
from dagq.group import Group
from dagq.messages import (
    CancelRequested,
    DeadLetterHandled,
    Event,
    RetryRequested,
    SignalSent,
    SubmitRequested,
    TaskFinished,
    TaskStarted,
)
from dagq.plan import Plan
from dagq.retrying import Attempts, decide_retry
from dagq.state import (
    BAD,
    TERMINAL,
    UNDO_DONE,
    UNDO_FAILED,
    UNDO_SENT,
    UNSET,
    WORKFLOW_TERMINAL,
    RunState,
    TaskStatus,
)
from dagq.transitions import (
    RUN,
    SKIP,
    UPSTREAM,
    WAIT,
    Dispatch,
    Effects,
    completed_outputs,
    current,
    decide,
    finish,
    make_ready,
    next_undo,
    output_of,
    receive_signal,
    send_instance,
    send_undo,
    settle,
    settle_group,
    verdict,
)

__all__ = [
    "RUN",
    "SKIP",
    "UPSTREAM",
    "WAIT",
    "Dispatch",
    "Effects",
    "abandon_running",
    "activate",
    "apply",
    "cancel",
    "completed_outputs",
    "expire_attempt",
    "unplaceable",
    "verdict",
    "wake",
]


def apply(plan: Plan, state: RunState, event: Event, now: float, fx: Effects) -> None:
    """Apply one event to the state."""
    _HANDLERS[type(event)](plan, state, event, now, fx)


def unplaceable(state: RunState, event: Event) -> bool:
    """Does ``event`` speak of an attempt this state never dispatched?

    Then the state is stale: another coordinator moved the workflow on (a lease taken
    over while this one still ran). Applying the event would drop it as "old"; the
    caller must read the state again from the store instead.
    """
    if not isinstance(event, TaskStarted | TaskFinished):
        return False
    i = event.task
    if not 0 <= i < state.n_tasks:
        return False
    if event.undo:
        return event.attempt > state.undo_attempt.get(i, 0)
    if event.item >= 0:
        group = state.groups.get(i)
        if group is None or event.item >= group.n:
            return True
        return event.attempt > group.attempt[event.item]
    return event.attempt > state.attempt[i]


def activate(
    plan: Plan, state: RunState, now: float, fx: Effects, *, actor: str | None = None
) -> None:
    """Start a submitted workflow (by ``actor``): decide its roots. A no-op once started."""
    if state.status != "pending":
        return
    state.status = "running"
    state.updated_at = now
    state.dirty = True
    fx.note(state.created_at, "submitted", detail=f"{state.n_tasks} tasks", actor=actor)
    for root in plan.roots:
        decide(plan, state, root, now, fx)
    settle(plan, state, now, fx)


def cancel(
    plan: Plan,
    state: RunState,
    now: float,
    fx: Effects,
    reason: str,
    *,
    final: str = "cancelled",
    actor: str | None = None,
) -> None:
    """Stop a run: unstarted and waiting tasks are cancelled at once, running ones told to stop.

    The workflow ends ``final`` (``cancelled``, or ``failed`` when a deadline passed)
    once no task is running. ``actor``: who asked (None: the run's own deadline).
    """
    if state.status in WORKFLOW_TERMINAL or state.status in ("cancelling", "compensating"):
        return  # a compensation under way is never interrupted
    state.status = "cancelling"
    state.cancel_reason = reason
    state.cancelled_at = now
    state.final_on_cancel = final
    state.updated_at = now
    fx.stop = True
    fx.note(now, "cancel_requested", detail=reason, actor=actor)
    for i in range(state.n_tasks):
        if state.task_status[i] in (TaskStatus.PENDING, TaskStatus.READY, TaskStatus.WAITING):
            state.set_status(i, TaskStatus.CANCELLED)
            state.task_finished_at[i] = now
            state.wake_at.pop(i, None)
            fx.note(now, "cancelled", plan.tasks[i].name, state.attempt[i], reason)
    state.rebuild(plan)
    for i, group in list(state.groups.items()):  # items not sent yet never will be
        if state.task_status[i] == TaskStatus.RUNNING:
            for k in group.pending():
                group.settle(k, TaskStatus.CANCELLED)
            state.touch_group(i)
            settle_group(plan, state, i, now, fx)
    settle(plan, state, now, fx)


def wake(plan: Plan, state: RunState, now: float, fx: Effects, *, task: int) -> None:
    """A waiting task's time came: a timer completes, a wait for a signal times out."""
    if state.task_status[task] != TaskStatus.WAITING or state.wake_at.get(task, now + 1) > now:
        return
    spec = plan.tasks[task]
    state.wake_at.pop(task)
    if spec.kind == "sleep":
        fx.note(now, "completed", spec.name, detail="timer fired")
        finish(plan, state, task, now, fx, status=TaskStatus.COMPLETED)
    elif spec.wait is not None and spec.wait.on_timeout == "skip":
        fx.note(now, "skipped", spec.name, detail=f"no signal '{spec.wait.signal}' in time")
        finish(plan, state, task, now, fx, status=TaskStatus.SKIPPED)
    else:
        signal = spec.wait.signal if spec.wait else "?"
        timeout = spec.wait.timeout_s if spec.wait else 0
        state.errors[task] = f"no signal '{signal}' within {timeout:g}s"
        fx.note(now, "failed", spec.name, detail=state.errors[task])
        finish(plan, state, task, now, fx, status=TaskStatus.FAILED)
    settle(plan, state, now, fx)


def expire_attempt(
    plan: Plan, state: RunState, now: float, fx: Effects, *, task: int, attempt: int
) -> None:
    """Fail an attempt that outlived its timeout without a word from any worker."""
    timeout = plan.tasks[task].timeout_s or plan.tasks[task].task_deadline_s or 0
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
    settle(plan, state, now, fx)


# --- event handlers ---------------------------------------------------------------


def _on_submit(plan: Plan, state: RunState, event: Any, now: float, fx: Effects) -> None:
    activate(plan, state, now, fx, actor=event.actor or None)


def _on_cancel(plan: Plan, state: RunState, event: Any, now: float, fx: Effects) -> None:
    if state.first_delivery(event.request_id):
        cancel(plan, state, now, fx, event.reason, actor=event.actor or None)


def _on_dead_letter(plan: Plan, state: RunState, event: Any, now: float, fx: Effects) -> None:
    """Record that someone replayed or purged a dead letter of this run (an audit
    entry: the run's state does not change)."""
    if state.first_delivery(event.request_id):
        detail = f"{event.key}: {event.detail}" if event.detail else event.key
        fx.note(now, f"dead_letter_{event.action}", detail=detail, actor=event.actor or None)


def _on_signal(plan: Plan, state: RunState, event: Any, now: float, fx: Effects) -> None:
    """Complete the first task waiting for the signal, or keep it for the next that waits.

    Each wait takes one signal, in the order they came; one that no task can ever take
    (every task waiting for it has finished or has one kept for it) is recorded as
    ignored.
    """
    if not state.first_delivery(event.request_id):
        return
    name, actor = event.name, event.actor or None
    if state.status in WORKFLOW_TERMINAL:
        why = f"'{name}': the workflow is {state.status}"
        fx.note(now, "signal_ignored", detail=why, actor=actor)
        return
    takers = [t for t in plan.tasks if t.wait is not None and t.wait.signal == name]
    for task in takers:
        if state.task_status[task.index] == TaskStatus.WAITING:
            fx.note(now, "signal", detail=f"'{name}' received", actor=actor)
            outcome = receive_signal(state, task, event.data, now, fx)
            finish(plan, state, task.index, now, fx, status=outcome)
            settle(plan, state, now, fx)
            return
    kept = state.signals.setdefault(name, [])
    to_wait = sum(1 for t in takers if state.task_status[t.index] not in TERMINAL)
    if len(kept) >= to_wait:
        if not kept:
            del state.signals[name]
        why = "every task waiting for it has finished or has one kept for it"
        fx.note(now, "signal_ignored", detail=f"'{name}': {why}", actor=actor)
        return
    kept.append(event.data)
    state.dirty = True
    kept_for = "kept for the next task to wait for it"
    fx.note(now, "signal", detail=f"'{name}' received; {kept_for}", actor=actor)


def _on_started(plan: Plan, state: RunState, event: Any, now: float, fx: Effects) -> None:
    if event.item >= 0:
        _on_instance_started(state, event)
        return
    i = event.task
    if event.undo or not current(state, i, event.attempt):
        return
    if state.task_status[i] == TaskStatus.READY:
        if state.dispatched_at[i] == UNSET:  # started before we knew it was sent
            state.held.remove(i)
            state.in_flight += 1
        state.set_status(i, TaskStatus.RUNNING)
    if state.started_at[i] == UNSET:  # a message delivered again starts it again
        fx.note(event.at, "started", plan.tasks[i].name, event.attempt)
    if event.delivery > 1 and state.started_at[i] != event.at:  # not a repeat of this event
        worker = f" to worker {event.worker}" if event.worker else ""
        fx.note(
            now,
            "redelivered",
            plan.tasks[i].name,
            event.attempt,
            f"delivered again{worker} (delivery {event.delivery}): the delivery before did "
            "not finish it — its worker stopped or was killed",
        )
    state.started_at[i] = event.at
    state.touch(i)


def _on_finished(plan: Plan, state: RunState, event: Any, now: float, fx: Effects) -> None:
    if event.undo:
        _on_undo_finished(plan, state, event, now, fx)
        return
    if event.item >= 0:
        _on_instance_finished(plan, state, event, now, fx)
        settle(plan, state, now, fx)
        return
    i = event.task
    if not current(state, i, event.attempt):
        return
    task = plan.tasks[i]
    if state.task_status[i] == TaskStatus.READY and state.dispatched_at[i] == UNSET:
        state.held.remove(i)
    else:
        state.in_flight -= 1
    if state.started_at[i] == UNSET:  # its 'started' was not sent: it finished first
        state.started_at[i] = event.at - event.duration_s
        fx.note(state.started_at[i], "started", task.name, event.attempt)
    state.updated_at = now
    if event.warning is not None:  # e.g. an output file that is not JSON (ai4s-jobq)
        fx.note(event.at, "warning", task.name, event.attempt, event.warning)
    if event.ok or plan.jobq:  # ai4s-jobq: a failed attempt keeps the output it left
        _keep_output(state, i, event)
    if event.ok:
        state.errors.pop(i, None)
        if task.loop is None or _loop_done(plan, state, event, now, fx):
            fx.note(event.at, "completed", task.name, event.attempt)
            finish(plan, state, i, event.at, fx, status=TaskStatus.COMPLETED)
    else:
        _on_failure(plan, state, event, now, fx)
    settle(plan, state, now, fx)


def _keep_output(state: RunState, i: int, event: TaskFinished) -> None:
    """The attempt's output (inline, or the key of the document holding it) replaces
    what an earlier attempt left."""
    state.outputs.pop(i, None)
    state.output_refs.pop(i, None)
    if event.output_ref is not None:
        state.output_refs[i] = event.output_ref
    elif event.output is not None:
        state.outputs[i] = event.output


def _instance(state: RunState, event: TaskStarted | TaskFinished) -> Group | None:
    """The group of a live instance attempt the event is about, else None."""
    group = state.groups.get(event.task)
    k = event.item
    if group is None or not 0 <= k < group.n or group.attempt[k] != event.attempt:
        return None
    if group.status[k] not in (TaskStatus.READY, TaskStatus.RUNNING):
        return None
    return group


def _on_instance_started(state: RunState, event: TaskStarted) -> None:
    group = _instance(state, event)
    if group is not None:
        group.status[event.item] = TaskStatus.RUNNING
        group.started_at[event.item] = event.at
        state.touch_item(event.task, event.item)


def _on_instance_finished(
    plan: Plan, state: RunState, event: TaskFinished, now: float, fx: Effects
) -> None:
    """An instance of a foreach task ended: record it, retry it, or fail it."""
    group = _instance(state, event)
    if group is None:
        return
    i, k = event.task, event.item
    task = plan.tasks[i]
    name = keys.attempt_name(task.name, item=k)
    group.sent -= 1
    state.touch_item(i, k)
    group.finished_at[k] = event.at
    if group.started_at[k] == UNSET:
        group.started_at[k] = event.at - event.duration_s
    group.outputs.pop(k, None)
    group.output_refs.pop(k, None)
    if event.ok:
        group.settle(k, TaskStatus.COMPLETED)
        group.errors.pop(k, None)
        if event.output_ref is not None:
            group.output_refs[k] = event.output_ref
        elif event.output is not None:
            group.outputs[k] = event.output
    elif state.status == "cancelling":
        group.settle(k, TaskStatus.CANCELLED)
    else:
        error = event.error or "failed without an error message"
        group.errors[k] = error
        # The state keeps only an instance's latest attempt: a failed one's times go to
        # the history (as a task's are), so the timeline can draw every attempt.
        if group.dispatched_at[k] != UNSET:
            fx.note(group.dispatched_at[k], "dispatched", name, event.attempt)
        fx.note(group.started_at[k], "started", name, event.attempt)
        past = Attempts(
            used=event.attempt - group.retry_base.get(k, 0),
            delay_spent=0.0,
            round_started=state.round_started.get(i),
        )
        key = keys.message_id(state.workflow_id, name, event.attempt)
        why, delay = decide_retry(task, event, past, now, key)
        if why is None:
            fx.note(event.at, "retried", name, event.attempt, f"{error} (in {delay:.1f}s)")
            send_instance(plan, state, i, now, fx, item=k, delay=delay)
        else:
            group.settle(k, TaskStatus.FAILED)
            fx.note(event.at, "failed", name, event.attempt, f"{error} ({why})")
    settle_group(plan, state, i, now, fx)


def _on_undo_finished(
    plan: Plan, state: RunState, event: TaskFinished, now: float, fx: Effects
) -> None:
    """A compensation attempt ended: next undo, a retry, or an undo given up on."""
    i = event.task
    live = (
        state.status == "compensating"
        and 0 <= i < state.n_tasks
        and state.undo_status.get(i) == UNDO_SENT
        and state.undo_attempt.get(i) == event.attempt
    )
    undo = plan.tasks[i].undo if live else None
    if undo is None:
        return
    name = plan.tasks[i].name
    state.touch(i)
    if event.ok:
        state.undo_status[i] = UNDO_DONE
        fx.note(event.at, "compensated", name, event.attempt)
    elif event.retryable and event.attempt < undo.max_attempts:
        delay = event.retry_after_s
        if delay is None:
            key = keys.message_id(
                state.workflow_id, keys.attempt_name(name, undo=True), event.attempt
            )
            delay = retry_delay(undo.retry, event.attempt, key)
        fx.note(event.at, "undo_retried", name, event.attempt, f"{event.error} (in {delay:.1f}s)")
        send_undo(plan, state, i, now, fx, delay=delay)
        return
    else:
        state.undo_status[i] = UNDO_FAILED
        state.errors[i] = f"its compensation failed: {event.error or 'no error message'}"
        fx.note(event.at, "compensation_failed", name, event.attempt, event.error)
    next_undo(plan, state, now, fx)


def _loop_done(plan: Plan, state: RunState, event: TaskFinished, now: float, fx: Effects) -> bool:
    """After an iteration: done (True), or the next iteration dispatched / the loop failed."""
    i = event.task
    task = plan.tasks[i]
    assert task.loop is not None and task.until is not None
    iteration = state.iteration.get(i, 1)
    try:
        env = {
            "output": output_of(plan, state, i),
            "iteration": iteration,
            "inputs": completed_outputs(plan, state, i),
            "params": plan.params,
        }
        done = truthy(task.until.evaluate(env))
    except ExpressionError as exc:
        state.errors[i] = f"loop.until could not be evaluated: {exc}"
        fx.note(event.at, "failed", task.name, event.attempt, state.errors[i])
        finish(plan, state, i, event.at, fx, status=TaskStatus.FAILED)
        return False
    if done:
        return True
    if iteration < task.loop.max_iterations:
        fx.note(
            event.at,
            "iterated",
            task.name,
            event.attempt,
            f"iteration {iteration} did not satisfy 'until'; running iteration {iteration + 1}",
        )
        state.iteration[i] = iteration + 1
        state.retry_base[i] = event.attempt  # every iteration has its own retries
        state.delay_spent.pop(i, None)
        make_ready(plan, state, i, now, fx)
        return False
    if task.loop.on_exhausted == "complete":
        fx.note(
            event.at,
            "exhausted",
            task.name,
            event.attempt,
            f"'until' never held in {iteration} iterations; completing as configured",
        )
        return True
    state.errors[i] = f"loop did not satisfy 'until' within {iteration} iterations"
    fx.note(event.at, "failed", task.name, event.attempt, state.errors[i])
    finish(plan, state, i, event.at, fx, status=TaskStatus.FAILED)
    return False


def _on_failure(plan: Plan, state: RunState, event: TaskFinished, now: float, fx: Effects) -> None:
    i = event.task
    task = plan.tasks[i]
    error = event.error or "failed without an error message"
    state.errors[i] = error
    if state.status == "cancelling":
        fx.note(event.at, "cancelled", task.name, event.attempt, error)
        finish(plan, state, i, event.at, fx, status=TaskStatus.CANCELLED)
        return
    past = Attempts(
        used=event.attempt - state.retry_base.get(i, 0),
        delay_spent=state.delay_spent.get(i, 0.0),
        round_started=state.round_started.get(i),
    )
    key = keys.message_id(state.workflow_id, task.name, event.attempt)
    why, delay = decide_retry(task, event, past, now, key)
    if why is None:
        fx.note(
            event.at,
            "retried",
            task.name,
            event.attempt,
            f"{error} (attempt {event.attempt - state.retry_base.get(i, 0) + 1} of "
            f"{task.max_attempts} in {delay:.1f}s)",
        )
        state.delay_spent[i] = state.delay_spent.get(i, 0.0) + delay
        make_ready(plan, state, i, now, fx, delay=delay)
    else:
        fx.note(event.at, "failed", task.name, event.attempt, f"{error} ({why})")
        finish(plan, state, i, event.at, fx, status=TaskStatus.FAILED)


def _on_retry(plan: Plan, state: RunState, event: Any, now: float, fx: Effects) -> None:
    if not state.first_delivery(event.request_id):
        return
    actor = event.actor or None
    if state.status not in WORKFLOW_TERMINAL:
        fx.note(now, "retry_ignored", detail=f"the workflow is still {state.status}", actor=actor)
        return
    if state.undo_order:
        why = "its completed tasks were compensated (undone)"
        fx.note(now, "retry_ignored", detail=why, actor=actor)
        return
    targets = _retry_targets(plan, state, event.tasks)
    if not targets:
        why = "no failed, upstream_failed or cancelled task"
        fx.note(now, "retry_ignored", detail=why, actor=actor)
        return
    for i in targets:
        state.set_status(i, TaskStatus.PENDING)
        state.retry_base[i] = state.attempt[i]
        _retry_instances(state, i)
        for column in (
            state.errors,
            state.wake_at,
            state.iteration,
            state.round_started,
            state.delay_spent,
            state.stop_requests,
        ):
            column.pop(i, None)
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
    fx.note(now, "retry_requested", detail=f"re-running {names}{more}", actor=actor)
    state.epoch += 1  # attempts from now on are not covered by the earlier stop
    fx.stop = True
    for i in targets:
        if state.task_status[i] == TaskStatus.PENDING:
            decide(plan, state, i, now, fx)
    settle(plan, state, now, fx)


def _retry_instances(state: RunState, i: int) -> None:
    """A retried foreach task re-runs only its failed and cancelled items."""
    group = state.groups.get(i)
    if group is None:
        return
    for k, status in enumerate(group.status):
        if status in (TaskStatus.FAILED, TaskStatus.CANCELLED):
            group.status[k] = TaskStatus.PENDING
            group.retry_base[k] = group.attempt[k]
            group.errors.pop(k, None)
    group.recount()
    state.touch_group(i)


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
    SignalSent: _on_signal,
    DeadLetterHandled: _on_dead_letter,
    TaskStarted: _on_started,
    TaskFinished: _on_finished,
}
