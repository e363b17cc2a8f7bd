"""Read-only views of a run for people: per-task rows, counts, the story so far.

Built from the runtime state (the truth) and the history (how it got there). Nothing
here writes.
"""

from __future__ import annotations

import zlib
from collections import Counter, OrderedDict

import msgspec

from dagq import keys
from dagq.compiled import plan_of
from dagq.errors import DamagedData, WorkflowNotFound
from dagq.history import HistoryEntry, read_history
from dagq.keys import check_workflow_id
from dagq.payloads import cut
from dagq.persistence import Stored, initial_state, read_state
from dagq.plan import Plan
from dagq.state import (
    TERMINAL,
    UNDO_DONE,
    UNDO_FAILED,
    UNDO_QUEUED,
    UNDO_SENT,
    UNSET,
    RunState,
    TaskStatus,
)
from dagq.stores.base import Document, Store
from dagq.submitted import Submitted, decode_document, require_submitted


class TaskRow(msgspec.Struct, frozen=True):
    """One task as the summary shows it."""

    name: str
    status: str
    #: Tries of the task itself: 1, plus one per retry (a loop's next iteration and a
    #: compensation are not attempts; they are counted below).
    attempts: int
    duration_s: float | None
    error: str | None
    queue: str
    #: The iterations a looping task has run (0: it does not loop).
    iterations: int = 0
    #: The attempts of its compensation (undo), if one ran.
    undos: int = 0
    #: Where its compensation stands: queued, sent, done or failed (None: none ran).
    compensation: str | None = None


class RunView(msgspec.Struct, frozen=True):
    """A whole run as the summary shows it."""

    workflow_id: str
    name: str
    status: str
    error: str | None
    counts: dict[str, int]
    total: int
    created_at: float
    finished_at: float | None
    tasks: list[TaskRow]


#: Where a compensation stands, by ``RunState.undo_status`` code.
UNDO_LABELS = {UNDO_QUEUED: "queued", UNDO_SENT: "sent", UNDO_DONE: "done", UNDO_FAILED: "failed"}


def task_rows(plan: Plan, st: RunState, history: list[HistoryEntry]) -> list[TaskRow]:
    """Per-task rows; attempts are counted from the history of dispatches (a
    compensation's dispatches and a loop's next iterations apart)."""
    dispatches = Counter(
        e.task for e in history if e.kind == "dispatched" and e.detail != "compensation"
    )
    rows = []
    for i, task in enumerate(plan.tasks):
        iterations = st.iteration.get(i, 0) if task.loop is not None else 0
        started, finished = st.started_at[i], st.task_finished_at[i]
        duration = None if UNSET in (started, finished) else finished - started
        group = st.groups.get(i)
        label = task.name
        if group is not None:
            settled = sum(1 for s in group.status if TaskStatus(s) in TERMINAL)
            label = f"{task.name} [{settled:,}/{group.n:,} items]"
        rows.append(
            TaskRow(
                name=label,
                status=TaskStatus(st.task_status[i]).label,
                attempts=dispatches.get(task.name, st.attempt[i]) - max(0, iterations - 1),
                duration_s=duration,
                error=st.errors.get(i),
                queue=task.queue,
                iterations=iterations,
                undos=st.undo_attempt.get(i, 0),
                compensation=UNDO_LABELS.get(st.undo_status.get(i, 0)),
            )
        )
    return rows


def run_view(
    submitted: Submitted, plan: Plan, st: RunState, history: list[HistoryEntry]
) -> RunView:
    """The view of a run from its parts."""
    return RunView(
        workflow_id=st.workflow_id,
        name=submitted.definition.name,
        status=st.status,
        error=st.error,
        counts=st.count_map(),
        total=st.n_tasks,
        created_at=st.created_at,
        finished_at=None if st.finished_at == UNSET else st.finished_at,
        tasks=task_rows(plan, st, history),
    )


#: What reading a damaged definition or state document raises before it is wrapped.
_DECODING = (ValueError, KeyError, IndexError, TypeError, zlib.error, msgspec.MsgspecError)


class PlanCache:
    """Compiled plans of the runs read most recently, up to ``max_tasks`` tasks in all.

    A definition never changes once submitted, and compiling a large one costs far more
    than reading its state (a 10,000-task plan: ~250 ms): a long-lived reader (the HTTP
    server) compiles each once. Keyed by id and fingerprint, so a run purged and
    submitted again with another definition is compiled afresh. The decoded definition
    document is kept beside its plan, by the document's etag (decoding that of a
    10,000-task run: ~35 ms), and so is the last state read, by the etag of its header:
    while a run does not change (every finished run), reading it again is one small
    read. Readers never change what they are given, so what is kept is shared.
    """

    def __init__(self, max_tasks: int = 200_000) -> None:
        self.max_tasks = max_tasks
        self._plans: OrderedDict[tuple[str, str], Plan] = OrderedDict()
        self._documents: dict[str, tuple[str, Submitted]] = {}
        self._states: dict[str, tuple[str, Submitted, Plan, RunState]] = {}
        self._tasks = 0

    def plan(self, submitted: Submitted) -> Plan:
        """The plan of a submitted workflow, compiled if not kept."""
        key = (submitted.workflow_id, submitted.fingerprint)
        found = self._plans.get(key)
        if found is not None:
            self._plans.move_to_end(key)
            return found
        found = plan_of(submitted.definition, submitted.params, submitted.fingerprint)
        self._plans[key] = found
        self._tasks += len(found.tasks)
        while self._tasks > self.max_tasks and len(self._plans) > 1:
            (dropped_id, _), dropped = self._plans.popitem(last=False)
            self._documents.pop(dropped_id, None)
            self._states.pop(dropped_id, None)
            self._tasks -= len(dropped.tasks)
        return found

    def run(self, workflow_id: str, etag: str) -> tuple[Submitted, Plan, RunState] | None:
        """The run as last read, if its state's header is still at ``etag``."""
        kept = self._states.get(workflow_id)
        return kept[1:] if kept is not None and kept[0] == etag else None

    def keep_run(self, workflow_id: str, etag: str, run: tuple[Submitted, Plan, RunState]) -> None:
        """Keep a run as read at state header ``etag`` (while its plan is kept)."""
        if (workflow_id, run[0].fingerprint) in self._plans:
            self._states[workflow_id] = (etag, *run)

    def holds(self, workflow_id: str) -> bool:
        """Whether a definition document of ``workflow_id`` is kept (a reader that
        finds none here will read it)."""
        return workflow_id in self._documents

    def submitted(self, workflow_id: str, etag: str, data: bytes) -> Submitted:
        """The definition document ``data`` (at ``etag``) decoded, or as kept."""
        kept = self._documents.get(workflow_id)
        if kept is not None and kept[0] == etag:
            return kept[1]
        found = decode_document(data, workflow_id)
        self._documents[workflow_id] = (etag, found)
        return found


async def load_run(
    store: Store,
    workflow_id: str,
    *,
    plans: PlanCache | None = None,
    header: Document | None = None,
    definition: Document | None = None,
) -> tuple[Submitted, Plan, RunState]:
    """Read a workflow's definition and current state from the store (its plan from
    ``plans`` if given); ``header`` and (with ``plans``) ``definition``: the state's
    header and the definition document, read by the caller a moment ago (None: read
    here).

    A document that cannot be decoded is DamagedData naming the workflow (one line
    for the user, never a traceback).
    """
    if plans is not None and header is None:
        header = await store.documents.get(keys.state(check_workflow_id(workflow_id)))
    if plans is not None:
        kept = None if header is None else plans.run(workflow_id, header.etag)
        if kept is not None:
            return kept
    try:
        if plans is None:
            submitted = await require_submitted(store, workflow_id)
            plan = plan_of(submitted.definition, submitted.params, submitted.fingerprint)
        else:
            doc = definition or await store.documents.get(
                keys.definition(check_workflow_id(workflow_id))
            )
            if doc is None:
                raise WorkflowNotFound(f"no workflow '{workflow_id}' in {store.url}")
            submitted = plans.submitted(workflow_id, doc.etag, doc.data)
            plan = plans.plan(submitted)
    except _DECODING as exc:
        raise DamagedData(
            f"the definition of workflow '{workflow_id}' cannot be read: {cut(str(exc), 300)}"
        ) from exc
    found = await read_checked(store, workflow_id, plan, header=header)
    if found is None:  # submitted, not started: its first state is the coordinator's to write
        return submitted, plan, initial_state(workflow_id, plan, submitted.created_at)
    if plans is not None:
        plans.keep_run(workflow_id, found[1].etag, (submitted, plan, found[0]))
    return submitted, plan, found[0]


async def read_checked(
    store: Store, workflow_id: str, plan: Plan, *, header: Document | None = None
) -> tuple[RunState, Stored] | None:
    """:func:`~dagq.persistence.read_state`, with a damaged document as DamagedData."""
    try:
        return await read_state(store, workflow_id, plan, header=header)
    except _DECODING as exc:
        raise DamagedData(
            f"the state of workflow '{workflow_id}' cannot be read: {cut(str(exc), 300)}"
        ) from exc


async def load_view(store: Store, workflow_id: str) -> RunView:
    """Everything the summary needs, read from the store."""
    submitted, plan, st = await load_run(store, workflow_id)
    history = await read_history(store, workflow_id)
    return run_view(submitted, plan, st, history)


def to_json(view: RunView) -> bytes:
    """A stable JSON form of a view, for ``--json`` output."""
    return msgspec.json.encode(view)


# --- progress per layer -----------------------------------------------------------------


class Layer(msgspec.Struct, frozen=True, kw_only=True):
    """The tasks at one depth of the DAG (longest path from a root; roots are layer 0)."""

    layer: int
    total: int
    done: int
    counts: dict[str, int]
    #: The first few task names of the layer, to tell layers apart.
    tasks: list[str]


class LayerSummary(msgspec.Struct, frozen=True, kw_only=True):
    """A run's progress layer by layer (``dagq summary --json``)."""

    id: str
    name: str
    status: str
    total: int
    done: int
    layers: list[Layer]


#: How many task names a layer shows.
LAYER_NAMES_SHOWN = 5


def depths(plan: Plan) -> list[int]:
    """Each task's layer: the length of the longest path from a root to it."""
    depth = [0] * len(plan.tasks)
    waiting = [len(t.parents) for t in plan.tasks]
    ready = [t.index for t in plan.tasks if not t.parents]
    while ready:
        i = ready.pop()
        for child in plan.tasks[i].children:
            depth[child] = max(depth[child], depth[i] + 1)
            waiting[child] -= 1
            if waiting[child] == 0:
                ready.append(child)
    return depth


def layer_summary(name: str, plan: Plan, st: RunState) -> LayerSummary:
    """Counts per task state for every layer of the run."""
    depth = depths(plan)
    n_layers = max(depth, default=-1) + 1
    counts: list[Counter[str]] = [Counter() for _ in range(n_layers)]
    names: list[list[str]] = [[] for _ in range(n_layers)]
    labels = [s.label for s in TaskStatus]
    for i, code in enumerate(st.task_status):
        counts[depth[i]][labels[code]] += 1
        if len(names[depth[i]]) < LAYER_NAMES_SHOWN:
            names[depth[i]].append(plan.tasks[i].name)
    terminal = {s.label for s in TERMINAL}
    layers = [
        Layer(
            layer=k,
            total=sum(counts[k].values()),
            done=sum(n for label, n in counts[k].items() if label in terminal),
            counts=dict(sorted(counts[k].items(), key=lambda kv: labels.index(kv[0]))),
            tasks=names[k],
        )
        for k in range(n_layers)
    ]
    return LayerSummary(
        id=st.workflow_id,
        name=name,
        status=st.status,
        total=st.n_tasks,
        done=st.n_terminal,
        layers=layers,
    )
