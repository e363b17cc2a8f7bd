"""Why a task is in its state: ``dagq explain`` and ``Client.explain`` (pure).

Built from the plan (its policy, condition, retry settings), the runtime state (where it
and its parents stand now) and the history (what happened to it, and why), plus a few
facts read beside them (:class:`Facts`: the queue's depth, dead letters, the
coordinator's lease, a quarantine). Nothing here does I/O or reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from dagq.history import HistoryEntry
from dagq.plan import POLICY_ALL, POLICY_ALL_SETTLED, POLICY_ANY, Plan, PlanTask
from dagq.registry import EXPIRY_BEATS, HEARTBEAT_S
from dagq.state import BAD, TERMINAL, UNSET, RunState, TaskStatus
from dagq.transitions import DISPATCH_WINDOW

#: How long a sent task may wait unstarted before explain suspects no worker serves its
#: queue (the same threshold as ``dagq doctor``'s oldest-message check).
QUEUE_WAIT_S = 300.0
_POLICY_NAMES = {POLICY_ALL: "all", POLICY_ANY: "any", POLICY_ALL_SETTLED: "all_settled"}
#: History kinds that tell an attempt's story.
_ATTEMPT_KINDS = frozenset(
    {
        "dispatched",
        "redelivered",
        "retried",
        "failed",
        "completed",
        "cancelled",
        "iterated",
        "exhausted",
    }
)


#: A running attempt that no live worker has reported this long after it started is
#: suspected lost (a worker record is rewritten every few seconds and lists it).
ORPHAN_AFTER_S = EXPIRY_BEATS * HEARTBEAT_S


@dataclass(frozen=True, slots=True)
class QueueFacts:
    """The depth of the task's queue, as ``dagq doctor`` reads it."""

    name: str
    visible: int
    invisible: int
    oldest_age_s: float
    #: Live workers on record that serve it (for this workflow); None: not known.
    workers: int | None = None


@dataclass(frozen=True, slots=True)
class Facts:
    """What explain reads beside the state: all optional, all read-only."""

    now: float
    queue: QueueFacts | None = None
    #: (dead-letter key, reason) of the task's current attempt, if its message died.
    dead_letter: tuple[str, str] | None = None
    #: Why the coordinator set the workflow aside, if it did.
    quarantine: str | None = None
    #: Whether a live coordinator holds the store's lease (None: not checked).
    coordinator: bool | None = None
    #: The rule set the workflow runs under: "dagq" or "jobq" (ai4s-jobq semantics).
    semantics: str | None = None
    #: For a running task: the live worker whose record lists its attempt
    #: (``name on host, pid N``), "" when no live worker does; None: not checked.
    runner: str | None = None


class Parent(msgspec.Struct, frozen=True, kw_only=True):
    """A direct parent, and how it counts for the task's policy."""

    name: str
    status: str
    #: "done" (completed), "skipped", "failed" (failed, upstream_failed, cancelled) or
    #: "open" (not finished yet).
    counts_as: str


class Dependencies(msgspec.Struct, frozen=True, kw_only=True):
    """The task's dependency policy, its parents, and whether they satisfy it."""

    policy: str
    parents: list[Parent]
    #: True: the policy let the task start; False: it never can; None: not decided yet.
    satisfied: bool | None
    summary: str


class Condition(msgspec.Struct, frozen=True, kw_only=True):
    """The task's condition and what its evaluation gave."""

    expression: str
    #: "true", "false", "error", or None when it has not been evaluated yet.
    result: str | None
    #: What the history recorded of the evaluation (values read, result or error).
    detail: str | None
    evaluated_at: float | None


class Event(msgspec.Struct, frozen=True, kw_only=True):
    """One history entry about the task (or one of its instances or its undo), or a
    request someone made of the run (``actor`` says who: a submit, cancel, retry,
    signal)."""

    at: float
    kind: str
    task: str | None
    attempt: int
    detail: str | None
    actor: str | None = None


class Retries(msgspec.Struct, frozen=True, kw_only=True):
    """The task's retry budget and policy, and what its attempts did."""

    max_attempts: int
    attempts_used: int
    backoff_s: float
    backoff_multiplier: float
    backoff_max_s: float
    retry_on: list[str]
    no_retry_on: list[str]
    non_retryable_exit_codes: list[int]
    #: The history of its attempts: sent, retried (error and delay), failed (and why
    #: not retried), completed.
    attempts: list[Event]


class Wait(msgspec.Struct, frozen=True, kw_only=True):
    """One thing the task waits for now."""

    #: start, parents, coordinator, quarantine, parallelism, max_parallel, retry_delay, queue,
    #: no_worker, dead_letter, worker, lost_worker, signal, timer.
    kind: str
    detail: str
    #: What a person can do about it, if anything.
    fix: str | None = None


class Explanation(msgspec.Struct, frozen=True, kw_only=True):
    """Why a task is in its state (``dagq explain --json``)."""

    workflow_id: str
    workflow_status: str
    task: str
    status: str
    #: One line: the reason for the state.
    summary: str
    attempt: int
    queue: str
    semantics: str | None
    error: str | None
    dependencies: Dependencies
    condition: Condition | None
    retries: Retries
    waiting_for: list[Wait]
    events: list[Event]


@dataclass(slots=True)
class _Context:
    plan: Plan
    st: RunState
    i: int
    facts: Facts
    events: list[HistoryEntry] = field(default_factory=list)

    @property
    def task(self) -> PlanTask:
        return self.plan.tasks[self.i]

    @property
    def status(self) -> TaskStatus:
        return TaskStatus(self.st.task_status[self.i])


def explain(
    plan: Plan, st: RunState, history: list[HistoryEntry], task: int, facts: Facts
) -> Explanation:
    """Why task ``task`` of this run is in its state, and what it waits for now."""
    ctx = _Context(plan, st, task, facts, task_events(history, plan.tasks[task].name))
    waits = _waits(ctx)
    return Explanation(
        workflow_id=st.workflow_id,
        workflow_status=st.status,
        task=ctx.task.name,
        status=ctx.status.label,
        summary=_summary(ctx, waits),
        attempt=st.attempt[task],
        queue=ctx.task.queue,
        semantics=facts.semantics,
        error=st.errors.get(task),
        dependencies=dependencies(plan, st, task, facts.semantics),
        condition=condition(ctx),
        retries=_retries(ctx),
        waiting_for=waits,
        events=[_event(e) for e in _with_requests(history, ctx.task.name)],
    )


def _with_requests(history: list[HistoryEntry], name: str) -> list[HistoryEntry]:
    """The task's entries and, in their place in time, the requests people made of the
    run (who submitted, cancelled, retried or signalled it)."""
    variants = (f"{name}[", f"{name}#")
    return [
        e
        for e in history
        if e.actor is not None or e.task == name or (e.task or "").startswith(variants)
    ]


def task_events(history: list[HistoryEntry], name: str) -> list[HistoryEntry]:
    """The entries about a task, its foreach instances (``name[i]``) and its undo."""
    # '[' and '#' cannot appear in task names: these prefixes are this task's own.
    variants = (f"{name}[", f"{name}#")
    return [e for e in history if e.task == name or (e.task or "").startswith(variants)]


# --- dependencies ---------------------------------------------------------------------


def _counts_as(status: TaskStatus) -> str:
    if status is TaskStatus.COMPLETED:
        return "done"
    if status is TaskStatus.SKIPPED:
        return "skipped"
    if status in BAD:
        return "failed"
    return "open"


def dependencies(plan: Plan, st: RunState, i: int, semantics: str | None = None) -> Dependencies:
    """The task's policy, its parents' standing, and whether they satisfy it (under
    ai4s-jobq semantics a skipped parent counts as done for every policy; under dagq's,
    for ``all`` only)."""
    task = plan.tasks[i]
    parents = [
        Parent(
            name=plan.tasks[p].name,
            status=TaskStatus(st.task_status[p]).label,
            counts_as=_counts_as(TaskStatus(st.task_status[p])),
        )
        for p in task.parents
    ]
    policy = _POLICY_NAMES.get(task.policy, str(task.policy))
    status = TaskStatus(st.task_status[i])
    if not parents:
        return Dependencies(
            policy=policy, parents=[], satisfied=True, summary="a root task: no parents"
        )
    if status is TaskStatus.PENDING:
        satisfied = None
    elif status in (TaskStatus.UPSTREAM_FAILED,) or (
        status is TaskStatus.SKIPPED and all(p.counts_as == "skipped" for p in parents)
    ):
        satisfied = False
    elif status is TaskStatus.CANCELLED and st.attempt[i] == 0:
        satisfied = None if any(p.counts_as == "open" for p in parents) else False
    else:
        satisfied = True
    return Dependencies(
        policy=policy,
        parents=parents,
        satisfied=satisfied,
        summary=_policy_summary(task, parents, satisfied, semantics),
    )


def _tally(parents: list[Parent]) -> str:
    order = ("done", "skipped", "failed", "open")
    counts = {kind: sum(p.counts_as == kind for p in parents) for kind in order}
    words = {"done": "completed", "skipped": "skipped", "failed": "failed", "open": "unfinished"}
    return ", ".join(f"{counts[k]} {words[k]}" for k in order if counts[k])


def _policy_summary(
    task: PlanTask, parents: list[Parent], satisfied: bool | None, semantics: str | None
) -> str:
    n = len(parents)
    skipped_counts = semantics == "jobq" or task.policy == POLICY_ALL
    every = "its parent" if n == 1 else f"all {n} parents"
    need = {
        POLICY_ALL: f"{every} to succeed (completed or skipped)",
        POLICY_ANY: "any one parent to complete",
        POLICY_ALL_SETTLED: f"{every} to finish, at least one completed",
    }.get(task.policy, f"{task.policy} of its {n} parents to complete")
    tally = _tally(parents)
    if satisfied is None:
        open_ = [p.name for p in parents if p.counts_as == "open"]
        shown = ", ".join(open_[:5]) + (f" and {len(open_) - 5} more" if len(open_) > 5 else "")
        return f"needs {need}; so far {tally}" + (f" (waiting for {shown})" if open_ else "")
    if satisfied:
        counted = ("done", "skipped") if skipped_counts else ("done",)
        by = [p.name for p in parents if p.counts_as in counted]
        shown = ", ".join(by[:5]) + (f" and {len(by) - 5} more" if len(by) > 5 else "")
        return f"needs {need}: satisfied by {shown or 'its parents'} ({tally})"
    return f"needs {need}: cannot be satisfied ({tally})"


# --- condition ------------------------------------------------------------------------


def condition_record(events: list[HistoryEntry]) -> HistoryEntry | None:
    """The latest history entry about the evaluation of a task's condition.

    The one place that knows how the coordinator records it: an entry of kind
    ``condition``, or one whose detail speaks of the condition (a skip because it is
    false, a failure or a skip because it could not be evaluated).
    """
    recorded = [e for e in events if e.kind == "condition"]
    if recorded:
        return recorded[-1]
    found = None
    for entry in events:
        if entry.detail is not None and "condition" in entry.detail:
            found = entry
    return found


def condition(ctx: _Context) -> Condition | None:
    """The task's condition, its result, and what the history says of its evaluation."""
    expr = ctx.task.condition
    if expr is None:
        return None
    record = condition_record(ctx.events)
    result = _condition_result(record, expr.text) if record is not None else None
    if result is None and ctx.st.attempt[ctx.i] > 0:
        result = "true"  # it was evaluated and let the task start
    return Condition(
        expression=expr.text,
        result=result,
        detail=record.detail if record is not None else None,
        evaluated_at=record.at if record is not None else None,
    )


def _condition_result(record: HistoryEntry, text: str) -> str | None:
    """What a recorded evaluation concluded. The coordinator writes ``'EXPR' is
    true|false; it read ...`` or ``error: WHY; it read ...`` (``transitions.evaluate``);
    the values read may themselves contain 'true' or 'false', so only the head counts."""
    detail = record.detail or ""
    if record.kind == "condition":
        if detail.startswith("error:"):
            return "error"
        head = f"{text!r} is "
        if detail.startswith(head):
            verdict = detail[len(head) :].split(";", 1)[0].strip()
            return verdict if verdict in ("true", "false") else None
        return None
    lowered = detail.lower()
    if "could not" in lowered or "cannot" in lowered:
        return "error"
    return "false" if record.kind == "skipped" else None


# --- retries ----------------------------------------------------------------------------


def _retries(ctx: _Context) -> Retries:
    policy = ctx.task.retry
    return Retries(
        max_attempts=ctx.task.max_attempts,
        attempts_used=ctx.st.attempt[ctx.i] - ctx.st.retry_base.get(ctx.i, 0),
        backoff_s=policy.backoff_s,
        backoff_multiplier=policy.backoff_multiplier,
        backoff_max_s=policy.backoff_max_s,
        retry_on=list(policy.retry_on),
        no_retry_on=list(policy.no_retry_on),
        non_retryable_exit_codes=list(policy.non_retryable_exit_codes),
        attempts=[_event(e) for e in ctx.events if e.kind in _ATTEMPT_KINDS],
    )


def _event(entry: HistoryEntry) -> Event:
    return Event(
        at=entry.at,
        kind=entry.kind,
        task=entry.task,
        attempt=entry.attempt,
        detail=entry.detail,
        actor=entry.actor,
    )


# --- what it waits for ----------------------------------------------------------------


def _waits(ctx: _Context) -> list[Wait]:
    """What keeps the task from moving on, most fundamental first."""
    waits: list[Wait] = []
    st, facts = ctx.st, ctx.facts
    if ctx.status in TERMINAL:
        return waits
    wid = st.workflow_id
    if facts.quarantine is not None:
        waits.append(
            Wait(
                kind="quarantine",
                detail=f"the workflow is quarantined: {facts.quarantine}",
                fix=f"once the cause is fixed: dagq quarantine release {wid}",
            )
        )
    if facts.coordinator is False:
        waits.append(
            Wait(
                kind="coordinator",
                detail="no coordinator is running, so nothing advances",
                fix="start one: dagq coordinator (dagq run starts its own)",
            )
        )
    status = ctx.status
    if status is TaskStatus.PENDING and not ctx.task.parents:
        waits.append(Wait(kind="start", detail="the workflow has not been started yet"))
    elif status is TaskStatus.PENDING:
        deps = dependencies(ctx.plan, st, ctx.i, facts.semantics)
        waits.append(Wait(kind="parents", detail=deps.summary))
    elif status is TaskStatus.READY:
        waits += _ready_waits(ctx)
    elif status is TaskStatus.RUNNING:
        waits += _running_waits(ctx)
    elif status is TaskStatus.WAITING:
        waits.append(_waiting(ctx))
    return waits


def _ready_waits(ctx: _Context) -> list[Wait]:
    st, i, now = ctx.st, ctx.i, ctx.facts.now
    sent = st.dispatched_at[i]
    limit = ctx.plan.max_parallelism
    if sent == UNSET:
        if limit is None or limit > DISPATCH_WINDOW:
            what = f"the dispatch window ({DISPATCH_WINDOW} attempts of a run at once)"
            limit = DISPATCH_WINDOW
        else:
            what = "the workflow's max_parallelism"
        return [
            Wait(
                kind="parallelism",
                detail=f"held by {what}: {st.in_flight} of {limit} slots in use; it is sent "
                "when one frees up",
            )
        ]
    if sent > now:
        return [
            Wait(
                kind="retry_delay",
                detail=f"attempt {st.attempt[i]} of {ctx.task.max_attempts} waits out its "
                f"retry delay: it is sent in {sent - now:.1f}s",
            )
        ]
    return _queue_waits(ctx, now - sent)


def _queue_waits(ctx: _Context, waited_s: float) -> list[Wait]:
    queue, facts = ctx.task.queue, ctx.facts
    depth = ""
    if facts.queue is not None:
        q = facts.queue
        depth = f" ({q.visible} waiting, {q.invisible} in flight, oldest {q.oldest_age_s:.0f}s)"
    waits = [
        Wait(
            kind="queue",
            detail=f"sent {waited_s:.0f}s ago to queue '{queue}'{depth}; "
            "waiting for a worker to take it",
        )
    ]
    if facts.dead_letter is not None:
        key, reason = facts.dead_letter
        waits.append(
            Wait(
                kind="dead_letter",
                detail=f"its message was dead-lettered: {reason}",
                fix=f"after fixing the cause: dagq dlq replay {key}",
            )
        )
    elif facts.queue is not None and facts.queue.workers == 0:
        waits.append(
            Wait(
                kind="no_worker",
                detail=f"no live worker serves queue '{queue}' (dagq workers lists them)",
                fix=f"start one: dagq worker -q {queue}",
            )
        )
    elif waited_s > QUEUE_WAIT_S or (
        facts.queue is not None and facts.queue.visible and facts.queue.oldest_age_s > QUEUE_WAIT_S
    ):
        waits.append(
            Wait(
                kind="no_worker",
                detail=f"no worker seems to serve queue '{queue}': its messages wait for "
                f"more than {QUEUE_WAIT_S:.0f}s",
                fix=f"start one: dagq worker -q {queue}",
            )
        )
    return waits


def _running_waits(ctx: _Context) -> list[Wait]:
    st, i, task, now = ctx.st, ctx.i, ctx.task, ctx.facts.now
    group = st.groups.get(i)
    if group is not None:
        counts = group.counts()
        done = sum(n for label, n in counts.items() if label not in ("pending", "ready", "running"))
        waits = [
            Wait(
                kind="items",
                detail=f"{done} of {group.n} items finished, {group.sent} sent to queue "
                f"'{task.queue}'",
            )
        ]
        limit = min(task.max_parallel or group.n, DISPATCH_WINDOW)
        if group.unsent and group.sent >= limit:
            held_by = (
                f"max_parallel={task.max_parallel}"
                if task.max_parallel is not None and task.max_parallel <= DISPATCH_WINDOW
                else f"the dispatch window ({DISPATCH_WINDOW} at once)"
            )
            waits.append(
                Wait(kind="max_parallel", detail=f"{len(group.unsent)} items held by {held_by}")
            )
        return waits
    started = st.started_at[i]
    since = f" for {now - started:.0f}s" if started != UNSET else ""
    runner = ctx.facts.runner
    where = f"worker {runner}" if runner else "a worker"
    detail = f"attempt {st.attempt[i]} of {task.max_attempts} is running on {where}{since}"
    if task.timeout_s is not None and started != UNSET:
        detail += f"; it times out in {max(0.0, started + task.timeout_s - now):.0f}s"
    if runner == "" and started != UNSET and now - started > ORPHAN_AFTER_S:
        return [
            Wait(
                kind="lost_worker",
                detail=f"{detail}, but no live worker reports running it: its worker "
                "seems to have died; the task is delivered again once its message's "
                "visibility timeout ends",
                fix="nothing: it is retried by itself (dagq workers lists the live ones)",
            )
        ]
    return [Wait(kind="worker", detail=detail)]


def _waiting(ctx: _Context) -> Wait:
    st, i, task, now = ctx.st, ctx.i, ctx.task, ctx.facts.now
    wake = st.wake_at.get(i)
    if task.wait is not None:
        signal = task.wait.signal
        detail = f"waits for signal '{signal}'"
        if wake is not None:
            detail += f"; after {max(0.0, wake - now):.0f}s it gives up ({task.wait.on_timeout})"
        return Wait(
            kind="signal",
            detail=detail,
            fix=f"dagq signal {st.workflow_id} {signal} [--data JSON]",
        )
    left = f" in {max(0.0, wake - now):.0f}s" if wake is not None else ""
    return Wait(kind="timer", detail=f"a durable timer; it fires{left}")


# --- the one line -----------------------------------------------------------------------


def _summary(ctx: _Context, waits: list[Wait]) -> str:
    status = ctx.status
    if status not in TERMINAL:
        chosen = next((w for w in waits if w.kind in ("quarantine", "coordinator")), None)
        main = next((w for w in waits if w.kind not in ("quarantine", "coordinator")), None)
        parts = [w.detail for w in (main, chosen) if w is not None]
        return f"{status.label}: " + "; ".join(parts) if parts else status.label
    last = next((e for e in reversed(ctx.events) if e.task == ctx.task.name), None)
    error = ctx.st.errors.get(ctx.i)
    if status is TaskStatus.COMPLETED:
        n = ctx.st.attempt[ctx.i]
        tries = f" after {n} attempt{'s' if n != 1 else ''}" if n > 1 else ""
        return f"completed{tries}"
    reason = error or (last.detail if last is not None and last.detail else None)
    if status is TaskStatus.FAILED and last is not None and last.kind == "failed" and last.detail:
        reason = last.detail
    return f"{status.label}: {reason}" if reason else status.label
