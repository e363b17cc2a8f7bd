"""How tasks move: deciding a pending task, starting it, finishing it and its cascade.

The event handlers in :mod:`dagq.machine` call these. Everything here is pure: it
changes the coordinator's working copy of the state and records what must happen
outside in an :class:`Effects`; it never does I/O or reads a clock.
"""

from __future__ import annotations

from typing import Any

import msgspec

from dagq import keys
from dagq.expression import ExpressionError, describe_reads, truthy
from dagq.group import INLINE_ITEMS_LIMIT, Group
from dagq.history import HistoryEntry
from dagq.messages import OUTPUT_INLINE_LIMIT
from dagq.plan import POLICY_ALL, POLICY_ALL_SETTLED, POLICY_ANY, Plan, PlanTask
from dagq.state import (
    BAD,
    TERMINAL,
    UNDO_FAILED,
    UNDO_QUEUED,
    UNDO_SENT,
    UNSET,
    RunState,
    TaskStatus,
)

WAIT, RUN, SKIP, UPSTREAM = 0, 1, 2, 3
#: Statuses a task leaves when it loses a race (or is cancelled) before finishing.
UNFINISHED = (TaskStatus.PENDING, TaskStatus.READY, TaskStatus.RUNNING, TaskStatus.WAITING)


class Dispatch(msgspec.Struct):
    """Send a task message for ``attempt`` of ``task``, visible after ``delay_s``."""

    task: int
    attempt: int
    delay_s: float = 0.0
    #: The task's compensation (its undo), not the task itself.
    undo: bool = False
    #: One instance (item index) of a foreach task; -1 for the task itself.
    item: int = -1


class Effects(msgspec.Struct):
    """What the coordinator must do once the new state is durable."""

    dispatch: list[Dispatch] = msgspec.field(default_factory=list)
    history: list[HistoryEntry] = msgspec.field(default_factory=list)
    #: (when, task): waiting tasks whose timer or wait timeout must be watched.
    timers: list[tuple[float, int]] = msgspec.field(default_factory=list)
    #: Workers must stop something: the whole run (cancel) or single attempts (a race).
    stop: bool = False
    finished: bool = False
    #: Documents to store with the state (foreach items, a large assembled output).
    documents: list[tuple[str, bytes]] = msgspec.field(default_factory=list)

    def note(
        self,
        at: float,
        kind: str,
        task: str | None = None,
        attempt: int = 0,
        detail: str | None = None,
        *,
        actor: str | None = None,
    ) -> None:
        """Append a history entry (``actor``: who asked for it, if someone did)."""
        self.history.append(HistoryEntry(at, kind, task, attempt, detail, actor))


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


def current(state: RunState, task: int, attempt: int) -> bool:
    """Is this event about the live attempt of a task that can still take it?

    Attempts count from 1; a foreach task is never sent itself (its instances are), so
    it stays at attempt 0 and no event about the task proper is ever live.
    """
    return (
        0 <= task < state.n_tasks
        and attempt >= 1
        and state.attempt[task] == attempt
        and state.task_status[task] in (TaskStatus.READY, TaskStatus.RUNNING)
    )


def decide(plan: Plan, state: RunState, task: int, now: float, fx: Effects) -> None:
    """Decide a pending task now, finishing it (and its cascade) if that is the verdict.

    A task that stopped being pending meanwhile (a race cancelled it) is left alone.
    """
    if state.task_status[task] != TaskStatus.PENDING:
        return
    outcome = evaluate(plan, state, task, now, fx)
    if outcome is not None:
        finish(plan, state, task, now, fx, status=outcome)


def evaluate(plan: Plan, state: RunState, i: int, now: float, fx: Effects) -> TaskStatus | None:
    """Start a pending task, or say which terminal status it must take (None: not now)."""
    task = plan.tasks[i]
    if plan.jobq:  # ai4s-jobq: a skipped parent is a done one, for every policy
        decision = verdict(
            task.policy, len(task.parents), state.n_done[i] + state.n_skip[i], 0, state.n_bad[i]
        )
    else:
        decision = verdict(
            task.policy, len(task.parents), state.n_done[i], state.n_skip[i], state.n_bad[i]
        )
    if decision == WAIT:
        return None
    if decision == SKIP:
        fx.note(now, "skipped", task.name, detail="all parents were skipped")
        return TaskStatus.SKIPPED
    if decision == UPSTREAM:
        state.errors[i] = upstream_error(_failed_parents(plan, state, i))
        fx.note(now, "upstream_failed", task.name, detail=state.errors[i])
        return TaskStatus.UPSTREAM_FAILED
    if task.condition is not None:
        decided = _condition(plan, state, task, now, fx)
        if decided is not None:
            return decided
    outcome = start(plan, state, i, now, fx)
    if task.cancel_remaining:
        if outcome is not None:  # done at once: settle it before the losers' cascade runs
            finish(plan, state, i, now, fx, status=outcome)
            outcome = None
        _cancel_losers(plan, state, i, now, fx)
    return outcome


def _condition(
    plan: Plan, state: RunState, task: PlanTask, now: float, fx: Effects
) -> TaskStatus | None:
    """Evaluate a task's condition: None (true: go on) or the status it decides.

    Every evaluation leaves a ``condition`` entry in the history: the expression, what
    it read and its result or error. One that cannot be evaluated fails the task under
    dagq's rules, and is false (the task skipped, the reason kept) under ai4s-jobq's.
    """
    condition = task.condition
    assert condition is not None
    env: dict[str, Any] = {}
    try:
        env = inputs_env(plan, state, task.index)
        go = truthy(condition.evaluate(env))
    except ExpressionError as exc:
        reads = describe_reads(condition, env)
        fx.note(now, "condition", task.name, detail=f"error: {exc}; {reads}")
        if not plan.jobq:
            return fail_now(state, task, now, fx, f"condition could not be evaluated: {exc}")
        state.errors[task.index] = (
            f"condition could not be evaluated (false under ai4s-jobq semantics): {exc}"
        )
        fx.note(now, "skipped", task.name, detail=state.errors[task.index])
        return TaskStatus.SKIPPED
    reads = describe_reads(condition, env)
    result = "true" if go else "false"
    fx.note(now, "condition", task.name, detail=f"{condition.text!r} is {result}; {reads}")
    if not go:
        fx.note(now, "skipped", task.name, detail="condition is false")
        return TaskStatus.SKIPPED
    return None


#: How many failed parents an upstream_failed task's error names before counting the rest.
PARENTS_NAMED = 5


def _failed_parents(plan: Plan, state: RunState, i: int) -> list[str]:
    return [plan.tasks[p].name for p in plan.tasks[i].parents if state.task_status[p] in BAD]


def upstream_error(failed: list[str]) -> str:
    """``3 parents did not succeed: a, b, c`` (the first few named, then how many more)."""
    shown = ", ".join(failed[:PARENTS_NAMED])
    if len(failed) > PARENTS_NAMED:
        shown += f" and {len(failed) - PARENTS_NAMED} more"
    if len(failed) == 1:
        return f"parent task did not succeed: {shown}"
    return f"{len(failed)} parent tasks did not succeed: {shown}"


#: At most this many attempts of one workflow (and instances of one foreach task) are
#: sent and unfinished at once, whatever ``max_parallelism`` allows: the others wait,
#: ready, and go out as these finish. A fan-out of 1,000,000 so never builds a million
#: task messages in one step (nor holds them in memory, nor queues them at once), and
#: the workers, which run far fewer at a time, never go without.
DISPATCH_WINDOW = 10_000


def in_flight_limit(plan: Plan) -> int:
    """How many attempts of a workflow may be in flight at once (docs/architecture.md)."""
    limit = plan.max_parallelism
    return DISPATCH_WINDOW if limit is None else min(limit, DISPATCH_WINDOW)


def start(plan: Plan, state: RunState, i: int, now: float, fx: Effects) -> TaskStatus | None:
    """Begin a task whose turn has come: dispatch it, or wait (signal, timer)."""
    task = plan.tasks[i]
    if task.kind == "wait":
        return _wait(plan, state, i, now, fx)
    if task.kind == "sleep":
        return _sleep(plan, state, i, now, fx)
    if task.foreach is not None:
        if state.in_flight >= in_flight_limit(plan):  # it takes a slot once expanded
            state.set_status(i, TaskStatus.READY)
            state.held.append(i)
            return None
        return expand(plan, state, i, now, fx)
    if task.loop is not None and i not in state.iteration:
        state.iteration[i] = 1
    make_ready(plan, state, i, now, fx)
    return None


def _wait(plan: Plan, state: RunState, i: int, now: float, fx: Effects) -> TaskStatus | None:
    task = plan.tasks[i]
    assert task.wait is not None
    signal = task.wait.signal
    kept = state.signals.get(signal)
    if kept:  # it came before the task was ready: kept, not lost; each wait takes one
        data = kept.pop(0)
        if not kept:
            del state.signals[signal]
        state.dirty = True
        return receive_signal(state, task, data, now, fx)
    state.set_status(i, TaskStatus.WAITING)
    detail = f"for signal '{signal}'"
    if task.wait.timeout_s is not None:
        state.wake_at[i] = now + task.wait.timeout_s
        fx.timers.append((state.wake_at[i], i))
        detail += f", at most {task.wait.timeout_s:g}s"
    fx.note(now, "waiting", task.name, detail=detail)
    return None


def receive_signal(
    state: RunState, task: PlanTask, data: Any, now: float, fx: Effects
) -> TaskStatus:
    """A waiting task's signal arrived: its data becomes the task's output."""
    state.wake_at.pop(task.index, None)
    if data is not None:
        state.outputs[task.index] = data
    state.started_at[task.index] = now
    fx.note(now, "completed", task.name, detail=f"signal '{task.wait.signal if task.wait else ''}'")
    return TaskStatus.COMPLETED


def _sleep(plan: Plan, state: RunState, i: int, now: float, fx: Effects) -> TaskStatus | None:
    task = plan.tasks[i]
    delay: Any = task.sleep
    if not isinstance(delay, float):
        try:
            delay = delay.evaluate(inputs_env(plan, state, i)) if delay is not None else 0.0
        except ExpressionError as exc:
            return fail_now(state, task, now, fx, f"sleep_s could not be evaluated: {exc}")
        if isinstance(delay, bool) or not isinstance(delay, int | float) or delay < 0:
            return fail_now(
                state, task, now, fx, f"sleep_s must be a number of seconds >= 0, got {delay!r}"
            )
    state.started_at[i] = now
    if delay <= 0:
        fx.note(now, "completed", task.name, detail="timer of 0s")
        return TaskStatus.COMPLETED
    state.set_status(i, TaskStatus.WAITING)
    state.wake_at[i] = now + float(delay)
    fx.timers.append((state.wake_at[i], i))
    fx.note(now, "waiting", task.name, detail=f"timer of {float(delay):g}s")
    return None


def _cancel_losers(plan: Plan, state: RunState, i: int, now: float, fx: Effects) -> None:
    """A race was won: its parents still going are cancelled (running ones stopped)."""
    winner = plan.tasks[i].name
    for p in plan.tasks[i].parents:
        status = state.task_status[p]
        if status not in UNFINISHED:
            continue
        if status == TaskStatus.RUNNING or (
            status == TaskStatus.READY and state.dispatched_at[p] != UNSET
        ):
            state.in_flight -= 1
            state.stop_requests[p] = state.attempt[p]
            fx.stop = True
        elif status == TaskStatus.READY:
            state.held.remove(p)
        state.wake_at.pop(p, None)
        detail = f"lost the race to {winner}"
        fx.note(now, "cancelled", plan.tasks[p].name, state.attempt[p], detail)
        finish(plan, state, p, now, fx, status=TaskStatus.CANCELLED)


def fail_now(state: RunState, task: PlanTask, now: float, fx: Effects, error: str) -> TaskStatus:
    """Record why a task fails without running (an expression that cannot be evaluated)."""
    state.errors[task.index] = error
    fx.note(now, "failed", task.name, detail=error)
    return TaskStatus.FAILED


def inputs_env(plan: Plan, state: RunState, i: int) -> dict[str, Any]:
    """What a task's expressions see: its parents' outputs and the params.

    Under dagq's rules, the completed parents'; under ai4s-jobq's, every direct
    parent's (:func:`parent_outputs`).
    """
    if plan.jobq:
        return {"inputs": parent_outputs(plan, state, i), "params": plan.params}
    return {"inputs": completed_outputs(plan, state, i), "params": plan.params}


def parent_outputs(plan: Plan, state: RunState, i: int) -> dict[str, Any]:
    """Every direct parent of task ``i`` by name (ai4s-jobq semantics): the output of a
    completed or failed parent (a failed task keeps what it wrote), None for the rest
    (unfinished, skipped, upstream_failed, cancelled, or with no output)."""
    inputs: dict[str, Any] = {}
    for p in plan.tasks[i].parents:
        status = state.task_status[p]
        if status in (TaskStatus.COMPLETED, TaskStatus.FAILED):
            inputs[plan.tasks[p].name] = output_of(plan, state, p)
        else:
            inputs[plan.tasks[p].name] = None
    return inputs


def completed_outputs(plan: Plan, state: RunState, i: int) -> dict[str, Any]:
    """The outputs of the completed parents of task ``i``, by parent name.

    Outputs stored by reference must have been loaded into ``state.resolved``.
    """
    inputs: dict[str, Any] = {}
    for p in plan.tasks[i].parents:
        if state.task_status[p] != TaskStatus.COMPLETED:
            continue
        inputs[plan.tasks[p].name] = output_of(plan, state, p)
    return inputs


def output_of(plan: Plan, state: RunState, i: int) -> Any:
    """A task's output value (a reference must have been loaded into ``state.resolved``)."""
    ref = state.output_refs.get(i)
    if ref is None:
        return state.outputs.get(i)
    if ref in state.resolved:
        return state.resolved[ref]
    raise ExpressionError(f"the output of '{plan.tasks[i].name}' ({ref}) is not loaded")


def make_ready(
    plan: Plan, state: RunState, i: int, now: float, fx: Effects, *, delay: float = 0.0
) -> None:
    """A new attempt: dispatch it, or hold it while the workflow is at its in-flight
    limit (``max_parallelism``, the dispatch window)."""
    state.attempt[i] += 1
    state.set_status(i, TaskStatus.READY)
    state.dispatched_at[i] = state.started_at[i] = state.task_finished_at[i] = UNSET
    if state.in_flight >= in_flight_limit(plan):
        state.held.append(i)
        return
    dispatch(plan, state, i, now, fx, delay=delay)


def dispatch(
    plan: Plan, state: RunState, i: int, now: float, fx: Effects, *, delay: float = 0.0
) -> None:
    """Send the current attempt of a ready task."""
    if i not in state.round_started:
        # A task deadline counts from the first send, not from when the task became
        # ready: time held back by max_parallelism is not the task's to lose.
        state.round_started[i] = now
    state.dispatched_at[i] = now + delay
    state.in_flight += 1
    state.touch(i)
    fx.dispatch.append(Dispatch(i, state.attempt[i], delay))
    fx.note(now, "dispatched", plan.tasks[i].name, state.attempt[i])


def finish(
    plan: Plan, state: RunState, i: int, at: float, fx: Effects, *, status: TaskStatus
) -> None:
    """Make ``i`` terminal and settle every descendant this decides, without recursion.

    A descendant queued here may be settled otherwise before its turn (a race decided
    meanwhile cancels it); it is then left as it is.
    """
    work = [(i, status, False)]
    while work:
        j, outcome, queued = work.pop()
        if queued and state.task_status[j] != TaskStatus.PENDING:
            continue
        state.set_status(j, outcome)
        state.task_finished_at[j] = at
        state.wake_at.pop(j, None)
        if outcome is TaskStatus.COMPLETED:
            counter = state.n_done
        elif outcome is TaskStatus.SKIPPED:
            counter = state.n_skip
        else:
            counter = state.n_bad
        for child in plan.tasks[j].children:
            counter[child] += 1
            if state.task_status[child] == TaskStatus.PENDING and state.status == "running":
                kid = plan.tasks[child]
                if (
                    kid.policy == POLICY_ALL
                    and not state.n_bad[child]
                    and state.n_done[child] + state.n_skip[child] < len(kid.parents)
                ):
                    continue  # waits for more parents: what evaluate would say, found here
                decided = evaluate(plan, state, child, at, fx)
                if decided is not None:
                    work.append((child, decided, True))
            elif counter is state.n_bad and state.task_status[child] == TaskStatus.UPSTREAM_FAILED:
                # Decided when its first parent failed: its error names the later ones too.
                state.errors[child] = upstream_error(_failed_parents(plan, state, child))
                state.touch(child)  # stored with the next delta


def settle(plan: Plan, state: RunState, now: float, fx: Effects) -> None:
    """Refill free parallelism slots, then end the run if every task is terminal."""
    limit = in_flight_limit(plan)
    while state.held and state.in_flight < limit:
        i = state.held.popleft()
        if state.task_status[i] == TaskStatus.READY and state.dispatched_at[i] == UNSET:
            if plan.tasks[i].foreach is not None:
                outcome = expand(plan, state, i, now, fx)
                if outcome is not None:
                    finish(plan, state, i, now, fx, status=outcome)
            else:
                dispatch(plan, state, i, now, fx)
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
    if final != "completed" and _start_compensation(plan, state, final, now, fx):
        return
    _end(state, final, now, fx)


def _start_compensation(plan: Plan, state: RunState, final: str, now: float, fx: Effects) -> bool:
    """A run that fails or is cancelled undoes its completed tasks' side effects first,
    one at a time, most recently completed first. False if there is nothing to undo."""
    if state.undo_order:  # compensated once already
        return False
    done = [
        i
        for i in range(state.n_tasks)
        if state.task_status[i] == TaskStatus.COMPLETED and plan.tasks[i].undo is not None
    ]
    if not done:
        return False
    done.sort(key=lambda i: (state.task_finished_at[i], i), reverse=True)
    state.status = "compensating"
    state.compensate_after = final
    state.undo_order = done
    # A cancel or a deadline told workers to stop every attempt of the run's epoch;
    # the undos go out in an epoch of their own, which that stop does not cover.
    state.epoch += 1
    for i in done:
        state.undo_status[i] = UNDO_QUEUED
        state.touch(i)
    names = ", ".join(plan.tasks[i].name for i in done[:10])
    fx.note(now, "compensating", detail=f"the run will end {final}; undoing {names}")
    next_undo(plan, state, now, fx)
    return True


def next_undo(plan: Plan, state: RunState, now: float, fx: Effects) -> None:
    """Send the next compensation, or end the run when every one has been tried."""
    if any(state.undo_status.get(i) == UNDO_SENT for i in state.undo_order):
        return  # one at a time
    queued = [i for i in state.undo_order if state.undo_status.get(i) == UNDO_QUEUED]
    if queued:
        send_undo(plan, state, queued[0], now, fx)
        return
    failed = any(state.undo_status.get(i) == UNDO_FAILED for i in state.undo_order)
    _end(state, "compensation_failed" if failed else state.compensate_after, now, fx)


def send_undo(
    plan: Plan, state: RunState, i: int, now: float, fx: Effects, *, delay: float = 0.0
) -> None:
    """Dispatch an attempt of task ``i``'s compensation."""
    attempt = state.undo_attempt.get(i, 0) + 1
    state.undo_attempt[i] = attempt
    state.undo_status[i] = UNDO_SENT
    state.touch(i)
    fx.dispatch.append(Dispatch(i, attempt, delay, undo=True))
    fx.note(now, "dispatched", plan.tasks[i].name, attempt, "compensation")


def _end(state: RunState, final: str, now: float, fx: Effects) -> None:
    """The run is over: record how it ended."""
    if final == "compensation_failed":
        state.error = f"a compensation failed after the run {state.compensate_after}: " + (
            state.error or "see its tasks"
        )
    state.status = final
    state.finished_at = now
    state.updated_at = now
    for i in state.stop_requests:  # nothing is left to stop; deltas must say so too
        state.touch(i)
    state.stop_requests.clear()
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


# --- foreach: dynamic fan-out -----------------------------------------------------------


def expand(plan: Plan, state: RunState, i: int, now: float, fx: Effects) -> TaskStatus | None:
    """Fan a foreach task out into one instance per item of its list (or resume its group)."""
    task = plan.tasks[i]
    group = state.groups.get(i)
    if group is None:
        assert task.foreach is not None
        try:
            items = task.foreach.evaluate(inputs_env(plan, state, i))
        except ExpressionError as exc:
            return fail_now(state, task, now, fx, f"foreach could not be evaluated: {exc}")
        if not isinstance(items, list):
            kind = type(items).__name__ if items is not None else "null"
            return fail_now(state, task, now, fx, f"foreach must give a list, got {kind}")
        if not items:
            state.outputs[i] = []
            state.started_at[i] = now
            fx.note(now, "completed", task.name, detail="foreach over an empty list")
            return TaskStatus.COMPLETED
        encoded = msgspec.json.encode(items)
        if len(encoded) > INLINE_ITEMS_LIMIT:
            ref = keys.foreach_items(state.workflow_id, i)
            fx.documents.append((ref, encoded))
            group = Group(len(items), None, ref)
        else:
            group = Group(len(items), items, None)
        state.groups[i] = group
        fx.note(now, "expanded", task.name, detail=f"{group.n} items")
    state.touch_group(i)
    state.set_status(i, TaskStatus.RUNNING)
    if state.started_at[i] == UNSET:
        state.started_at[i] = now
    if i not in state.round_started:  # its instances' deadline counts from here
        state.round_started[i] = now
    state.in_flight += 1
    fill_group(plan, state, i, now, fx)
    return None


def fill_group(plan: Plan, state: RunState, i: int, now: float, fx: Effects) -> None:
    """Send instances while the group's ``max_parallel`` allows."""
    group = state.groups[i]
    limit = min(plan.tasks[i].max_parallel or group.n, DISPATCH_WINDOW)
    while group.unsent and group.sent < limit:
        k = group.unsent.popleft()
        if group.status[k] == TaskStatus.PENDING:
            send_instance(plan, state, i, now, fx, item=k)


def send_instance(
    plan: Plan, state: RunState, i: int, now: float, fx: Effects, *, item: int, delay: float = 0.0
) -> None:
    """Dispatch a new attempt of instance ``item`` of foreach task ``i``."""
    group = state.groups[i]
    k = item
    group.attempt[k] += 1
    group.status[k] = TaskStatus.READY
    group.dispatched_at[k] = now + delay
    group.started_at[k] = group.finished_at[k] = UNSET
    group.sent += 1
    state.touch_item(i, k)
    fx.dispatch.append(Dispatch(i, group.attempt[k], delay, item=k))


def settle_group(plan: Plan, state: RunState, i: int, now: float, fx: Effects) -> None:
    """Refill the group; once every instance finished, finish the task itself."""
    group = state.groups[i]
    if state.status == "running":
        fill_group(plan, state, i, now, fx)
    if not group.done() or state.task_status[i] != TaskStatus.RUNNING:
        return
    task = plan.tasks[i]
    state.in_flight -= 1
    failed = group.failed()
    if state.status == "cancelling" or any(s == TaskStatus.CANCELLED for s in group.status):
        fx.note(now, "cancelled", task.name, detail="its items were cancelled")
        finish(plan, state, i, now, fx, status=TaskStatus.CANCELLED)
        return
    allowed = _allowed_failures(task.allow_failures, group.n)
    if len(failed) > allowed:
        first = group.errors.get(failed[0], "failed")
        shown = ", ".join(str(k) for k in failed[:20]) + (" …" if len(failed) > 20 else "")
        state.errors[i] = (
            f"{len(failed)} of {group.n} items failed (allowed: {allowed}): items {shown}; "
            f"item {failed[0]}: {first}"
        )
        fx.note(now, "failed", task.name, detail=state.errors[i])
        finish(plan, state, i, now, fx, status=TaskStatus.FAILED)
        return
    _assemble(state, i, group, fx)
    detail = f"{group.n} items" + (f", {len(failed)} failed (allowed)" if failed else "")
    fx.note(now, "completed", task.name, detail=detail)
    finish(plan, state, i, now, fx, status=TaskStatus.COMPLETED)


def _allowed_failures(allow: float | None, n: int) -> int:
    if allow is None:
        return 0
    return int(allow * n) if allow < 1 else int(allow)


def _assemble(state: RunState, i: int, group: Group, fx: Effects) -> None:
    """The task's output: its instances' outputs in index order (None for failed ones)."""
    values = [
        {"$dagq_ref": group.output_refs[k]} if k in group.output_refs else group.outputs.get(k)
        for k in range(group.n)
    ]
    encoded = msgspec.json.encode(values)
    state.outputs.pop(i, None)
    if len(encoded) > OUTPUT_INLINE_LIMIT:
        ref = keys.foreach_output(state.workflow_id, i, state.attempt[i])
        fx.documents.append((ref, encoded))
        state.output_refs[i] = ref
        state.resolved[ref] = values  # a child's condition may read it in this very step
    else:
        state.output_refs.pop(i, None)
        state.outputs[i] = values
