"""The Python client: submit and inspect workflows from scripts and notebooks.

``Client`` is async; ``Client.sync()`` (or ``SyncClient``) gives the same methods as
plain blocking calls. Results are typed, frozen structs whose fields are the stable
``--json`` output of the CLI.
"""

from __future__ import annotations

import asyncio
import builtins
import functools
import time
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

from dagq import keys, quarantine, registry
from dagq.definition import WorkflowDef
from dagq.errors import DamagedData, TaskNotFound, UsageError, WorkflowNotFound
from dagq.history import HistoryEntry, read_history
from dagq.listing import (
    WORKFLOW_STATUSES,
    WorkflowSummary,
    check_status,
    list_workflows,
    row_summary,
)
from dagq.messages import decode_tasks
from dagq.payloads import decode_json, echo
from dagq.plan import Plan
from dagq.quarantine import QuarantineInfo
from dagq.snapshots import DAMAGED_HEADER, decode_header
from dagq.state import (
    BAD,
    QUARANTINED,
    TERMINAL,
    UNDO_DONE,
    UNDO_FAILED,
    UNSET,
    WORKFLOW_ACTIVE,
    WORKFLOW_TERMINAL,
    RunState,
    TaskStatus,
)
from dagq.stores import open_store
from dagq.stores.base import Document, Store, get_many
from dagq.stores.changes import ANY, INDEX_TOPIC
from dagq.submitted import Submitted
from dagq.views import LayerSummary, PlanCache, layer_summary, load_run

if TYPE_CHECKING:
    from dagq.builder import Workflow
    from dagq.dead_letters import DeadLetterInfo
    from dagq.explanation import Explanation

#: Names that moved to dagq.listing, still taken from here.
__all__ = ["WORKFLOW_STATUSES", "WorkflowSummary", "row_summary"]

T = TypeVar("T")
#: How many workflows ``find_tasks`` looks through when no ids are given: the unfinished
#: ones first, then the finished ones, newest first.
SCAN_WORKFLOWS = 1000
#: While waiting on a complete change feed: how often a run is looked at all the same.
FEED_POLL_S = 1.0
_UNDO_LABELS = {1: "queued", 2: "sent", 3: "done", 4: "failed"}
_TERMINAL_LABELS = frozenset(s.label for s in TERMINAL)
#: What decoding a damaged state header raises (``Client.status`` says what is wrong).


class TaskInfo(msgspec.Struct, frozen=True, kw_only=True):
    """One task of a run."""

    name: str
    status: str
    attempt: int
    queue: str
    started_at: float | None
    finished_at: float | None
    duration_s: float | None
    error: str | None
    output_ref: str | None
    #: Where the task's compensation stands, if one ran: queued, sent, done or failed.
    compensation: str | None = None
    #: A foreach task's instances per state, once it has expanded.
    items: dict[str, int] | None = None
    #: The indexes of its failed instances.
    failed_items: list[int] | None = None


class WorkflowStatus(msgspec.Struct, frozen=True, kw_only=True):
    """Where a run stands: its state, counts per task state, and what failed."""

    id: str
    name: str
    status: str
    total: int
    done: int
    counts: dict[str, int]
    created_at: float
    updated_at: float
    finished_at: float | None
    error: str | None
    failed: list[TaskInfo]

    @property
    def terminal(self) -> bool:
        """Has the run ended (completed, failed or cancelled)?"""
        return self.status in WORKFLOW_TERMINAL

    @property
    def quarantined(self) -> bool:
        """Did the coordinator set the run aside (see ``error`` for why)? It waits for
        a person: ``dagq quarantine release`` once the cause is fixed."""
        return self.status == QUARANTINED


class WorkflowTask(TaskInfo, frozen=True, kw_only=True):
    """A task found across workflows: a :class:`TaskInfo` with its workflow's id."""

    workflow: str


class Submission(msgspec.Struct, frozen=True, kw_only=True):
    """The id of a submitted workflow, and whether this call created it."""

    id: str
    created: bool


def _time(value: float) -> float | None:
    return None if value == UNSET else value


def task_info(plan: Plan, st: RunState, i: int) -> TaskInfo:
    """The public view of one task."""
    started, finished = st.started_at[i], st.task_finished_at[i]
    group = st.groups.get(i)
    return TaskInfo(
        name=plan.tasks[i].name,
        status=TaskStatus(st.task_status[i]).label,
        attempt=st.attempt[i],
        queue=plan.tasks[i].queue,
        started_at=_time(started),
        finished_at=_time(finished),
        duration_s=None if UNSET in (started, finished) else finished - started,
        error=st.errors.get(i),
        output_ref=st.output_refs.get(i),
        compensation=_UNDO_LABELS.get(st.undo_status.get(i, 0)),
        items=group.counts() if group else None,
        failed_items=group.failed() if group else None,
    )


def instance_infos(plan: Plan, st: RunState, i: int) -> list[TaskInfo]:
    """The public view of the instances of foreach task ``i`` (``name[k]``)."""
    group = st.groups.get(i)
    if group is None:
        return []
    infos = []
    for k in range(group.n):
        started, finished = group.started_at[k], group.finished_at[k]
        infos.append(
            TaskInfo(
                name=keys.attempt_name(plan.tasks[i].name, item=k),
                status=TaskStatus(group.status[k]).label,
                attempt=group.attempt[k],
                queue=plan.tasks[i].queue,
                started_at=_time(started),
                finished_at=_time(finished),
                duration_s=None if UNSET in (started, finished) else finished - started,
                error=group.errors.get(k),
                output_ref=group.output_refs.get(k),
            )
        )
    return infos


class AttemptState(msgspec.Struct, frozen=True, kw_only=True):
    """Where one attempt stands, for following its output."""

    #: The attempt's number (0: the task has not run yet).
    attempt: int
    #: None while it may still run; else how it ended: ``completed``, ``failed``, ...
    ended: str | None
    #: Where its live output is (:meth:`Client.live_output`).
    live_prefix: str


def workflow_status(name: str, plan: Plan, st: RunState) -> WorkflowStatus:
    """The public view of a run."""
    counts = st.count_map()
    failed: list[TaskInfo] = []
    if counts.get("failed"):  # a scan of every task only when there is one to find
        codes = st.task_status
        failed = [task_info(plan, st, i) for i, c in enumerate(codes) if c == TaskStatus.FAILED]
    if counts.get("upstream_failed"):
        upstream = (i for i, c in enumerate(st.task_status) if c == TaskStatus.UPSTREAM_FAILED)
        failed += [task_info(plan, st, i) for _, i in zip(range(20), upstream, strict=False)]
    return WorkflowStatus(
        id=st.workflow_id,
        name=name,
        status=st.status,
        total=st.n_tasks,
        done=st.n_terminal,
        counts=counts,
        created_at=st.created_at,
        updated_at=st.updated_at,
        finished_at=_time(st.finished_at),
        error=st.error,
        failed=failed,
    )


class Client:
    """Operations on the workflows of one store."""

    def __init__(
        self, store: Store | str, *, create: bool = True, plans: PlanCache | None = None
    ) -> None:
        """``store`` is a Store or a URL; ``create=False`` refuses a store that does not
        exist; ``plans`` keeps compiled plans between calls (for a long-lived client)."""
        self.store = open_store(store, create=create) if isinstance(store, str) else store
        self._owns_store = isinstance(store, str)
        self.plans = plans

    async def _load(
        self,
        workflow_id: str,
        *,
        header: Document | None = None,
        definition: Document | None = None,
    ) -> tuple[Submitted, Plan, RunState]:
        return await load_run(
            self.store, workflow_id, plans=self.plans, header=header, definition=definition
        )

    async def close(self) -> None:
        """Release the store if this client opened it."""
        if self._owns_store:
            await self.store.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def sync(self) -> SyncClient:
        """A blocking facade over this client."""
        return SyncClient(self)

    async def submit(
        self,
        workflow: WorkflowDef | Workflow | str | Path,
        *,
        params: Mapping[str, Any] | None = None,
        workflow_id: str | None = None,
        tenant: str = "",
        labels: Mapping[str, str] | None = None,
        actor: str | None = None,
    ) -> Submission:
        """Store a workflow (a definition, a builder, or a YAML/JSON/Python file path),
        with ``labels`` (``key: value``) to find it by.

        ``actor`` names who submits, in the run's history (the audit trail); by
        default ``python:USER``, the OS user. So for cancel, retry and signal.
        """
        from dagq.submission import submit  # the submit path, imported when first used

        result = await submit(
            self.store,
            as_definition(workflow),
            params=params,
            workflow_id=workflow_id,
            tenant=tenant,
            labels=labels,
            actor=_actor(actor),
        )
        return Submission(id=result.workflow_id, created=result.created)

    async def status(self, workflow_id: str) -> WorkflowStatus:
        """The current status of a run, read from its runtime state.

        A quarantined run shows ``quarantined`` with the reason as its error (from its
        index row when its state cannot be read).
        """
        # The quarantine record, the state's header and, unless its plan cache keeps
        # it, the definition, in one read (where the store can).
        wanted = [keys.quarantine(workflow_id), keys.state(workflow_id)]
        if self.plans is not None and not self.plans.holds(workflow_id):
            wanted.append(keys.definition(workflow_id))
        record, header, *definition = await get_many(self.store.documents, wanted)
        try:
            held = None if record is None else quarantine.decode(record.data, workflow_id)
        except DamagedData as exc:  # still quarantined: the record says what to do
            reason, at = str(exc), time.time()
        else:
            if held is None or held.released_at is not None:
                submitted, plan, st = await self._load(
                    workflow_id, header=header, definition=definition[0] if definition else None
                )
                return workflow_status(submitted.definition.name, plan, st)
            reason, at = held.reason, held.at
        error = f"quarantined: {reason}"
        try:
            submitted, plan, st = await self._load(workflow_id)
        except DamagedData:
            return await self._quarantined_status(workflow_id, at, error)
        found = workflow_status(submitted.definition.name, plan, st)
        return msgspec.structs.replace(found, status=QUARANTINED, error=error)

    async def _quarantined_status(self, workflow_id: str, at: float, error: str) -> WorkflowStatus:
        row = await self.store.index.get(workflow_id)
        counts = dict(row.data.get("counts", {})) if row is not None else {}
        return WorkflowStatus(
            id=workflow_id,
            name=row.name if row is not None else "?",
            status=QUARANTINED,
            total=int(row.data.get("total", 0)) if row is not None else 0,
            done=sum(n for label, n in counts.items() if label in _TERMINAL_LABELS),
            counts=counts,
            created_at=row.created_at if row is not None else at,
            updated_at=row.updated_at if row is not None else at,
            finished_at=None,
            error=error,
            failed=[],
        )

    async def quarantined(self) -> builtins.list[QuarantineInfo]:
        """Every quarantined workflow: why, since when, how many events are kept."""
        return await quarantine.listing(self.store)

    async def release(self, workflow_id: str) -> QuarantineInfo:
        """Let the coordinator try a quarantined workflow again (after fixing the cause);
        its kept events are applied first."""
        return await quarantine.release(self.store, workflow_id)

    async def list(
        self,
        *,
        status: str | None = None,
        name: str | None = None,
        tenant: str | None = None,
        limit: int = 100,
    ) -> list[WorkflowSummary]:
        """Runs newest first, filtered by status, name and tenant."""
        return await list_workflows(
            self.store, status=status, name=name, tenant=tenant, limit=limit
        )

    async def list_page(
        self,
        *,
        status: str | None = None,
        name: str | None = None,
        tenant: str | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> tuple[builtins.list[WorkflowSummary], str | None]:
        """One page of runs, newest first, and the cursor of the next page (None: the
        last); ``cursor`` is one a previous page returned."""
        check_status(status)
        page = await self.store.index.query(
            status=[status] if status else None,
            name=name,
            tenant=tenant,
            limit=limit,
            cursor=cursor,
        )
        return [row_summary(row) for row in page.rows], page.cursor

    async def tasks(
        self, workflow_id: str, *, state: str | None = None, instances: bool = False
    ) -> builtins.list[TaskInfo]:
        """Every task of a run (or those in one state); with ``instances``, each
        foreach task is followed by its instances (``name[0]``, ``name[1]``, ...)."""
        _check_state(state)
        _, plan, st = await self._load(workflow_id)
        infos: builtins.list[TaskInfo] = []
        for i in range(st.n_tasks):
            infos.append(task_info(plan, st, i))
            if instances and i in st.groups:
                infos += instance_infos(plan, st, i)
        return [t for t in infos if state is None or t.status == state]

    async def find_tasks(
        self,
        workflow_ids: builtins.list[str] | None = None,
        *,
        state: str | None = None,
        queue: str | None = None,
        prefix: str | None = None,
        limit: int = 100,
    ) -> builtins.list[WorkflowTask]:
        """Tasks across workflows, filtered by state, queue and name prefix; at most
        ``limit`` (0: no limit).

        Without ``workflow_ids``, the workflows of the index are looked through, the
        unfinished ones first, then the finished ones, each newest first, at most
        :data:`SCAN_WORKFLOWS` of them; a workflow whose state cannot be read is passed
        over.
        """
        _check_state(state)
        found: builtins.list[WorkflowTask] = []
        explicit = workflow_ids is not None
        ids = workflow_ids if explicit else await self._scan_ids()
        for workflow_id in ids or []:
            try:
                _, plan, st = await self._load(workflow_id)
            except (DamagedData, WorkflowNotFound):
                if explicit:
                    raise
                continue
            if queue is not None and queue not in plan.queues:
                continue
            for i, task in enumerate(plan.tasks):
                if prefix is not None and not task.name.startswith(prefix):
                    continue
                if queue is not None and task.queue != queue:
                    continue
                if state is not None and TaskStatus(st.task_status[i]).label != state:
                    continue
                info = task_info(plan, st, i)
                found.append(WorkflowTask(workflow=workflow_id, **msgspec.structs.asdict(info)))
                if limit and len(found) >= limit:
                    return found
        return found

    async def _scan_ids(self) -> builtins.list[str]:
        """Unfinished workflows first, then finished ones, newest first; a bounded few."""
        ids: builtins.list[str] = []
        for statuses in (sorted(WORKFLOW_ACTIVE | {QUARANTINED}), sorted(WORKFLOW_TERMINAL)):
            cursor: str | None = None
            while len(ids) < SCAN_WORKFLOWS:
                page = await self.store.index.query(
                    status=statuses, limit=min(500, SCAN_WORKFLOWS - len(ids)), cursor=cursor
                )
                ids += [row.id for row in page.rows]
                cursor = page.cursor
                if cursor is None:
                    break
        return ids

    async def summary(self, workflow_id: str) -> LayerSummary:
        """A run's progress per layer of its DAG (the depth of a task: the longest path
        from a root to it), with counts per task state."""
        submitted, plan, st = await self._load(workflow_id)
        return layer_summary(submitted.definition.name, plan, st)

    async def explain(self, workflow_id: str, task: str) -> Explanation:
        """Why a task is in its state: its dependency policy and parents, its condition,
        its retries and their reasons, and what it waits for now."""
        from dagq.explanation import Facts, explain

        reason = await self._quarantine_reason(workflow_id)
        submitted, plan, st = await self._load(workflow_id)
        i = _task_index(plan, workflow_id, task)
        history = await read_history(self.store, workflow_id)
        facts = Facts(
            now=time.time(),
            quarantine=reason,
            coordinator=await self._coordinator_alive() if st.status in WORKFLOW_ACTIVE else None,
            semantics=_semantics(plan, submitted.definition),
            runner=await self._runner(plan, st, i),
            **await self._queue_facts(plan, st, i),
        )
        return explain(plan, st, history, i, facts)

    async def _runner(self, plan: Plan, st: RunState, i: int) -> str | None:
        """The live worker whose record lists the running attempt of task ``i``, "" when
        none does, None when that cannot be told (not running, a foreach task, or a
        worker running more attempts than its record lists)."""
        if st.task_status[i] != TaskStatus.RUNNING or i in st.groups:
            return None
        wanted = keys.message_id(st.workflow_id, plan.tasks[i].name, st.attempt[i])
        workers = await registry.live_workers(self.store.documents, now=time.time())
        for worker in workers:
            if wanted in worker.attempts:
                return f"{worker.id} on {worker.host}, pid {worker.pid}"
        if any(w.running > len(w.attempts) for w in workers):
            return None
        return ""

    async def _quarantine_reason(self, workflow_id: str) -> str | None:
        try:
            held = await quarantine.read(self.store, workflow_id)
        except DamagedData as exc:
            return str(exc)
        if held is None or held[0].released_at is not None:
            return None
        return held[0].reason

    async def _coordinator_alive(self) -> bool:
        from dagq.leasing import holder_is_dead_here

        lease = await self.store.leases.get(keys.COORDINATOR_LEASE)
        return lease is not None and not holder_is_dead_here(lease.owner)

    async def _queue_facts(self, plan: Plan, st: RunState, i: int) -> dict[str, Any]:
        """The depth of a sent task's queue and the dead letter of its attempt, if any."""
        from dagq.explanation import QueueFacts

        sent = st.task_status[i] == TaskStatus.READY and st.dispatched_at[i] != UNSET
        if not sent:
            return {}
        name = plan.tasks[i].queue
        depth = await self.store.queues.depth(name)
        workers = await registry.live_workers(self.store.documents, now=time.time())
        serving = sum(w.serves(name, st.workflow_id) for w in workers)
        facts: dict[str, Any] = {
            "queue": QueueFacts(
                name, depth.visible, depth.invisible, depth.oldest_age_s, workers=serving
            )
        }
        wanted = (st.workflow_id, plan.tasks[i].name, st.attempt[i])
        for letter in await self.store.queues.dead_letters(name, limit=1000):
            if wanted in _carried(letter.body):
                facts["dead_letter"] = (letter.key, letter.reason)
        return facts

    async def output(self, workflow_id: str, task: str, *, item: int = -1) -> Any:
        """The output of a completed task (fetched from its document if stored by
        reference); ``item`` names one instance of a foreach task."""
        _, plan, st = await self._load(workflow_id)
        i = _task_index(plan, workflow_id, task)
        if item >= 0:
            _variant_attempt(st, i, task, item=item, undo=False)  # it exists
            group = st.groups[i]
            status, ref = TaskStatus(group.status[item]), group.output_refs.get(item)
            inline = group.outputs.get(item)
            task = keys.attempt_name(task, item=item)
        else:
            status, ref = TaskStatus(st.task_status[i]), st.output_refs.get(i)
            inline = st.outputs.get(i)
        if status != TaskStatus.COMPLETED:
            raise UsageError(
                f"task '{echo(task)}' of {workflow_id} is {status.label}; it has no output"
            )
        if ref is None:
            return inline
        doc = await self.store.documents.get(ref)
        if doc is None:
            raise UsageError(f"the output of '{echo(task)}' ({ref}) is missing from the store")
        return decode_json(doc.data, f"the output of '{echo(task)}' ({ref})")

    async def logs(
        self,
        workflow_id: str,
        task: str,
        *,
        attempt: int | None = None,
        item: int = -1,
        undo: bool = False,
    ) -> str:
        """The kept stdout/stderr tail of an attempt (the latest by default); ``item``
        names one instance of a foreach task, ``undo`` the task's compensation."""
        _, plan, st = await self._load(workflow_id)
        i, number = _attempt(plan, st, workflow_id, task, attempt, item=item, undo=undo)
        key = keys.log(workflow_id, i, number, item=item, undo=undo)
        doc = await self.store.documents.get(key)
        return "" if doc is None else doc.data.decode("utf-8", "replace")

    async def error(
        self,
        workflow_id: str,
        task: str,
        *,
        attempt: int | None = None,
        item: int = -1,
        undo: bool = False,
    ) -> str | None:
        """The whole error text of a failed attempt (the latest by default), or None.

        Status, listings and events show an error longer than
        ``payloads.ERROR_INLINE_CHARS`` cut (head and tail); the whole text is kept,
        and this returns it. ``item`` names one instance of a foreach task, ``undo``
        the task's compensation.
        """
        _, plan, st = await self._load(workflow_id)
        i, number = _attempt(plan, st, workflow_id, task, attempt, item=item, undo=undo)
        key = keys.error(workflow_id, i, number, item=item, undo=undo)
        doc = await self.store.documents.get(key)
        if doc is not None:
            return doc.data.decode("utf-8", "replace")
        return _kept_error(st, i, number, item=item, undo=undo)

    async def events(
        self, workflow_id: str, *, task: str | None = None
    ) -> builtins.list[HistoryEntry]:
        """The run's history, oldest first; with ``task``, only what concerns it: a
        task's own entries and those of its instances and compensation, or one
        instance's (``square[2]``)."""
        _, plan, _ = await self._load(workflow_id)
        entries = await read_history(self.store, workflow_id)
        if task is None:
            return entries
        name, item, undo = keys.split_attempt_name(task)
        _task_index(plan, workflow_id, name)
        if item >= 0 or undo:
            return [e for e in entries if e.task == task]
        return [e for e in entries if e.task and keys.of_task(e.task, name)]

    async def attempt_state(
        self,
        workflow_id: str,
        task: str,
        *,
        attempt: int | None = None,
        item: int = -1,
        undo: bool = False,
    ) -> AttemptState:
        """Where an attempt stands (the latest by default; of one instance or of the
        task's undo if asked): not run yet, running, or how it ended."""
        _, plan, st = await self._load(workflow_id)
        i = _task_index(plan, workflow_id, task)
        latest, status = _latest(st, i, task, item=item, undo=undo)
        number = attempt or latest
        if number > latest and latest:
            raise UsageError(f"task '{echo(task)}' has no attempt {number} (it has {latest})")
        ended: str | None = None
        if number and number < latest:
            ended = "failed"  # another attempt followed it
        elif number and status in TERMINAL:
            ended = status.label
        elif number and status == TaskStatus.PENDING:
            ended = "failed"  # reset for a retry: that attempt is over
        elif not number and status in TERMINAL:
            ended = status.label  # it ended without an attempt (a timer, skipped, ...)
        elif st.status in WORKFLOW_TERMINAL or st.status == QUARANTINED:
            ended = "cancelled" if number else st.status  # it will not run (on)
        return AttemptState(
            attempt=number,
            ended=ended,
            live_prefix=keys.live_log_prefix(workflow_id, i, max(number, 1), item=item, undo=undo),
        )

    async def live_output(
        self, prefix: str, *, after: str | None = None
    ) -> builtins.list[tuple[str, bytes]]:
        """The chunks of an attempt's live output (``AttemptState.live_prefix``) sent
        since the chunk ``after``, in order, with their keys."""
        found = []
        for key in await self.store.documents.list(prefix, start_after=after, limit=1000):
            doc = await self.store.documents.get(key)
            if doc is not None:
                found.append((key, doc.data))
        return found

    async def signal(
        self,
        workflow_id: str,
        name: str,
        data: Any = None,
        *,
        request_id: str | None = None,
        actor: str | None = None,
    ) -> str:
        """Send a signal (an approval, a decision, with ``data``) to a workflow.

        Kept until a task waits for it, so a signal may come early; each wait takes one
        signal, in the order they were sent. Refused when no task waits for that signal,
        when those that do have finished or already have one kept for them, or when the
        run ended. Returns the request id; sending again with the same ``request_id``
        acts once.
        """
        _, plan, st = await self._load(workflow_id)
        if st.status in WORKFLOW_TERMINAL:
            raise UsageError(f"workflow {workflow_id} already {st.status}; signals no longer count")
        waiting = [t for t in plan.tasks if t.wait is not None and t.wait.signal == name]
        to_wait = [t.name for t in waiting if st.task_status[t.index] not in TERMINAL]
        if waiting and not to_wait:
            names = ", ".join(t.name for t in waiting)
            raise UsageError(f"task(s) {names} waiting for '{name}' already finished")
        kept = len(st.signals.get(name, ()))
        if waiting and kept >= len(to_wait):
            raise UsageError(
                f"workflow {workflow_id} already holds {kept} unused '{name}' signal(s) for "
                f"the {len(to_wait)} task(s) yet to wait for it ({', '.join(to_wait[:5])}); "
                "another one would never be used"
            )
        from dagq.submission import new_request_id, request_signal

        request_id = request_id or new_request_id()
        await request_signal(
            self.store, workflow_id, name, data, request_id=request_id, actor=_actor(actor)
        )
        return request_id

    async def cancel(
        self,
        workflow_id: str,
        reason: str = "cancelled by request",
        *,
        request_id: str | None = None,
        actor: str | None = None,
    ) -> str:
        """Ask the coordinator to cancel a run (an error if it has already ended).

        Returns the request id; sending again with the same ``request_id`` acts once.
        """
        status = await self.status(workflow_id)
        if status.terminal:
            raise UsageError(f"workflow {workflow_id} already {status.status}; nothing to cancel")
        from dagq.submission import new_request_id, request_cancel

        request_id = request_id or new_request_id()
        await request_cancel(
            self.store, workflow_id, reason, request_id=request_id, actor=_actor(actor)
        )
        return request_id

    async def retry(
        self,
        workflow_id: str,
        tasks: builtins.list[str] | None = None,
        *,
        ack_timeout_s: float = 10.0,
        request_id: str | None = None,
        actor: str | None = None,
    ) -> bool:
        """Re-run the failed, upstream_failed and cancelled tasks of a finished run.

        Returns once the coordinator has taken the request up (True), so that a
        ``wait`` or ``status`` right after sees the new run, not the old ending; False
        if no coordinator did within ``ack_timeout_s`` (the request stays queued).
        A retry the coordinator refused (the run changed meanwhile) is an error
        saying why. Sending again with the same ``request_id`` acts once.
        """
        _, plan, st = await self._load(workflow_id)
        if st.status not in WORKFLOW_TERMINAL:
            raise UsageError(f"workflow {workflow_id} is still {st.status}; retry it once it ends")
        _check_retryable(plan, st, workflow_id, tasks)
        from dagq.submission import new_request_id, request_retry

        request_id = request_id or new_request_id()
        await request_retry(
            self.store, workflow_id, tasks, request_id=request_id, actor=_actor(actor)
        )
        return await self._taken_up(workflow_id, st.updated_at, request_id, ack_timeout_s)

    async def dead_letters(
        self, queue: str | None = None, *, limit: int = 100
    ) -> builtins.list[DeadLetterInfo]:
        """Dead-lettered messages (of ``queue``, or every queue), oldest first."""
        from dagq import dead_letters

        found = await self.store.queues.dead_letters(queue, limit=limit)
        return [dead_letters.describe(d) for d in found]

    async def replay_dead_letters(
        self, which: builtins.list[str], *, actor: str | None = None
    ) -> int:
        """Send dead letters back to their queues (after a fix), then remove them; each
        is recorded, with ``actor``, in the history of the runs it concerns."""
        from dagq import dead_letters

        found = await dead_letters.find(self.store, which)
        return await dead_letters.replay(self.store, found, _actor(actor))

    async def purge_dead_letters(
        self, which: builtins.list[str], *, actor: str | None = None
    ) -> int:
        """Remove dead letters for good; recorded like :meth:`replay_dead_letters`."""
        from dagq import dead_letters

        found = await dead_letters.find(self.store, which)
        return await dead_letters.purge(self.store, found, _actor(actor))

    async def _taken_up(
        self, workflow_id: str, updated_at: float, request_id: str, timeout_s: float
    ) -> bool:
        """Wait until the coordinator applied a retry request (while one runs); an error
        if it applied it by refusing it."""
        deadline = time.monotonic() + timeout_s
        delay = 0.02
        while await self.store.leases.get(keys.COORDINATOR_LEASE) is not None:
            _, _, st = await self._load(workflow_id)
            if st.status not in WORKFLOW_TERMINAL or st.updated_at != updated_at:
                return True
            if request_id in st.requests:  # applied, yet the run did not re-open
                raise UsageError(
                    f"the coordinator did not retry {workflow_id}: "
                    f"{await self._refusal(workflow_id)}"
                )
            if time.monotonic() >= deadline:
                break
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.2)
        return False

    async def _refusal(self, workflow_id: str) -> str:
        """Why the coordinator last ignored a retry, from the run's history."""
        history = await read_history(self.store, workflow_id)
        ignored = [e.detail for e in history if e.kind == "retry_ignored"]
        return (ignored[-1] if ignored else None) or "see dagq events " + workflow_id

    async def wait(
        self, workflow_id: str, *, timeout_s: float | None = None, poll_s: float = 0.2
    ) -> WorkflowStatus:
        """Return the status once the run is terminal (or quarantined: it waits for a
        person); TimeoutError after ``timeout_s``.

        Where the store's change feed carries every process's changes (PostgreSQL's
        notifications), it looks when the listing rows change (a run's row is written
        in the commit that changes its status, quarantine included), with a poll every
        :data:`FEED_POLL_S` as a safety net. Where the coordinator of this process
        holds the run (it takes hand-overs: every status change of the run is its own,
        its end written with the run's index row), it goes by that coordinator's
        working copy, waking at this process's index writes or every
        :data:`FEED_POLL_S`, and reads the store only once that copy has ended (or is
        no longer held). Elsewhere (or on a broad change: SQLite says only that its
        file changed) it polls, every 20 ms at first, backing off to ``poll_s``."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        delay = 0.02
        current: str | None = None  # the status the state's header says, while running
        async with self.store.changes.watch(INDEX_TOPIC) as watcher:
            while True:
                held = self._held(workflow_id) if current is None else None
                if held is not None and held not in WORKFLOW_TERMINAL:
                    current = held  # running in the copy here: nothing to read yet
                ended = self._ended(workflow_id) if current is None else None
                if ended is not None:  # its end committed here: nothing to read
                    return ended
                if current is None:  # at first, or when it may have ended: read it all
                    status = await self.status(workflow_id)
                    if status.terminal or status.quarantined:
                        return status
                    current = status.status
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"workflow {workflow_id} is still {current}")
                if self._held(workflow_id) is not None:
                    # Coordinated here: its end is written with its index row, which
                    # this feed hears; nothing is read while the copy here runs on.
                    await watcher.wait(FEED_POLL_S if left is None else min(FEED_POLL_S, left))
                    held = self._held(workflow_id)
                    if held is None or held in WORKFLOW_TERMINAL:
                        current = None
                    continue
                if not watcher.complete:
                    await asyncio.sleep(delay)
                elif (
                    await watcher.wait(FEED_POLL_S if left is None else min(FEED_POLL_S, left))
                    == ANY
                ):
                    await asyncio.sleep(delay)  # a broad change: at the polling pace
                delay = min(delay * 2, poll_s)
                current = await self._running_status(workflow_id)

    def _ended(self, workflow_id: str) -> WorkflowStatus | None:
        """The status of a run whose end the coordinator of this process committed, from
        its working copy (:meth:`~dagq.stores.base.Handoff.ended_run`): what a read of the
        store would find, without the three reads (quarantine record, state, definition)."""
        handoff = self.store.handoff
        found = None if handoff is None else handoff.ended_run(workflow_id)
        return None if found is None else workflow_status(*found)

    def _held(self, workflow_id: str) -> str | None:
        """The status of the run in the working copy of the coordinator of this process
        (:meth:`~dagq.stores.base.Handoff.status_of`), if it holds one."""
        handoff = self.store.handoff
        return None if handoff is None else handoff.status_of(workflow_id)

    async def _running_status(self, workflow_id: str) -> str | None:
        """The status the run's state header says while the run goes on and is not
        quarantined; None when it may have ended (or cannot be told so: then the whole
        status is read, with its errors). Two small reads: no state is rebuilt nor
        plan compiled while a run is polled."""
        held, header = await get_many(
            self.store.documents, [keys.quarantine(workflow_id), keys.state(workflow_id)]
        )
        if held is not None or header is None:
            return None
        try:
            status = decode_header(header.data).status
        except DAMAGED_HEADER:
            return None
        return None if status in WORKFLOW_TERMINAL else status


class SyncClient:
    """Blocking versions of every :class:`Client` method, on a private event loop."""

    def __init__(self, client: Client | Store | str) -> None:
        self._client = client if isinstance(client, Client) else Client(client)
        self._runner = asyncio.Runner()

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._client, name)
        if not asyncio.iscoroutinefunction(attribute):
            return attribute
        return self._blocking(attribute)

    def _blocking(self, method: Callable[..., Coroutine[Any, Any, T]]) -> Callable[..., T]:
        @functools.wraps(method)
        def call(*args: Any, **kwargs: Any) -> T:
            return self._runner.run(method(*args, **kwargs))

        return call

    def close(self) -> None:
        """Close the client and its loop."""
        self._runner.run(self._client.close())
        self._runner.close()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _actor(given: str | None) -> str:
    """Who acts: as given, or the OS user of this Python process."""
    from dagq.submission import local_actor

    return local_actor("python") if given is None else given


def as_definition(workflow: WorkflowDef | Workflow | str | Path) -> WorkflowDef:
    """A definition from a definition, a builder, or a YAML/JSON/Python file path."""
    if isinstance(workflow, WorkflowDef):
        return workflow
    # What reads builders and files (PyYAML among it) is imported only for them: a
    # client that reads runs (`dagq status`) starts without it.
    from dagq.builder import Workflow, load_python_file
    from dagq.loading import load_file

    if isinstance(workflow, Workflow):
        return workflow.to_definition()
    path = Path(workflow)
    return load_python_file(path) if path.suffix == ".py" else load_file(path)


def _check_retryable(plan: Plan, st: RunState, workflow_id: str, tasks: list[str] | None) -> None:
    """Refuse a retry the coordinator would ignore: unknown tasks, none to re-run, or a
    run whose completed tasks were undone."""
    for name in tasks or []:
        _task_index(plan, workflow_id, name)
    if st.undo_order:
        raise UsageError(
            f"workflow {workflow_id} cannot be retried: it ended {st.status} after its "
            "completed tasks were compensated (undone); run it again under a new id"
        )
    names = tasks or [task.name for task in plan.tasks]
    if not any(st.task_status[plan.by_name[name]] in BAD for name in names):
        which = f"task(s) {', '.join(map(repr, names))} are not" if tasks else "no task is"
        raise UsageError(
            f"nothing to retry in {workflow_id}: {which} failed, upstream_failed or cancelled"
        )


def _attempt(
    plan: Plan,
    st: RunState,
    workflow_id: str,
    task: str,
    attempt: int | None,
    *,
    item: int = -1,
    undo: bool = False,
) -> tuple[int, int]:
    """A task's index and the number of its attempt (the latest by default; of one
    instance or of its undo if asked); a task attempt that never was is an error."""
    i = _task_index(plan, workflow_id, task)
    if item >= 0 or undo:  # an instance or an undo: its own attempts
        return i, attempt or _variant_attempt(st, i, task, item=item, undo=undo)
    if st.attempt[i] == 0:
        label = TaskStatus(st.task_status[i]).label
        raise UsageError(f"task '{echo(task)}' of {workflow_id} has never run (it is {label})")
    number = attempt or st.attempt[i]
    if number < 1 or number > st.attempt[i]:
        raise UsageError(f"task '{echo(task)}' has no attempt {number} (it has {st.attempt[i]})")
    return i, number


def _kept_error(st: RunState, i: int, number: int, *, item: int, undo: bool) -> str | None:
    """The error of the latest attempt as the state keeps it (whole, being short), if
    ``number`` is that attempt and it failed: of the task, one instance, or its undo."""
    if undo:
        failed = st.undo_status.get(i) == UNDO_FAILED and number == st.undo_attempt.get(i)
        return st.errors.get(i) if failed else None
    if item >= 0:
        group = st.groups.get(i)
        if group is None or number != max(group.attempt[item], 1):
            return None
        return group.errors.get(item)
    return st.errors.get(i) if number == st.attempt[i] else None


def _variant_attempt(st: RunState, i: int, task: str, *, item: int, undo: bool) -> int:
    """The latest attempt of an instance of a foreach task, or of a task's undo."""
    if undo:
        if not st.undo_attempt.get(i):
            raise UsageError(f"the compensation of task '{echo(task)}' has never run")
        return st.undo_attempt[i]
    group = st.groups.get(i)
    if group is None:
        raise UsageError(f"task '{echo(task)}' has no items (not a foreach task that expanded)")
    if item >= group.n:
        raise UsageError(f"task '{echo(task)}' has {group.n} items; there is no item {item}")
    return max(group.attempt[item], 1)


def _latest(
    st: RunState, i: int, task: str, *, item: int, undo: bool
) -> tuple[int, TaskStatus | None]:
    """The latest attempt of a task, an instance or an undo (0: none yet), and its
    status (None for an undo until it ended)."""
    if undo:
        ended = {UNDO_DONE: TaskStatus.COMPLETED, UNDO_FAILED: TaskStatus.FAILED}
        return st.undo_attempt.get(i, 0), ended.get(st.undo_status.get(i, 0))
    if item >= 0:
        group = st.groups.get(i)
        if group is None:
            if st.task_status[i] in TERMINAL:
                raise UsageError(f"task '{echo(task)}' has no items (not a foreach task)")
            return 0, None  # not expanded yet
        if item >= group.n:
            raise UsageError(f"task '{echo(task)}' has {group.n} items; there is no item {item}")
        return group.attempt[item], TaskStatus(group.status[item])
    return st.attempt[i], TaskStatus(st.task_status[i])


def _check_state(state: str | None) -> None:
    if state is not None and state.upper() not in TaskStatus.__members__:
        known = ", ".join(s.label for s in TaskStatus)
        raise UsageError(f"unknown task state {state!r} (known: {known})")


def _semantics(plan: Plan, definition: WorkflowDef) -> str:
    """The rule set a run follows: "jobq" (ai4s-jobq semantics) or "dagq"."""
    for value in (getattr(plan, "semantics", None), getattr(definition, "semantics", None)):
        if value in ("jobq", "dagq"):
            return str(value)
    return "jobq" if any(task.spec.jobq for task in plan.tasks) else "dagq"


def _carried(body: bytes) -> set[tuple[str, str, int]]:
    """(workflow, task, attempt) of each task a dead task message carried."""
    try:
        return {(t.workflow_id, t.name, t.attempt) for t in decode_tasks(body) if t.item_index < 0}
    except (msgspec.DecodeError, msgspec.ValidationError):
        return set()


def _task_index(plan: Plan, workflow_id: str, task: str) -> int:
    index = plan.by_name.get(task)
    if index is None:
        raise TaskNotFound(f"workflow {workflow_id} has no task named '{echo(task)}'")
    return index
