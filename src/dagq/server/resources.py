"""What the API answers with: typed, frozen structs (their JSON Schema is the OpenAPI
document's) and the functions that build them from the client's views."""

from __future__ import annotations

import re
from typing import Any

import msgspec

from dagq import graph
from dagq.client import TaskInfo, WorkflowStatus, WorkflowSummary
from dagq.definition import WorkflowDef
from dagq.history import HistoryEntry
from dagq.server.problems import Problem, ProblemError


class Accepted(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A request taken up: what it is about and where to watch it."""

    id: str
    #: For a submission: whether this request created the workflow (False: it existed).
    created: bool | None = None
    #: For cancel, retry and signal: the id the coordinator acts on once.
    request_id: str | None = None
    #: For a retry: whether a coordinator took it up before the answer.
    taken_up: bool | None = None
    status_url: str


class WorkflowDetail(WorkflowStatus, frozen=True, kw_only=True):
    """A run: its status, counts, progress (0 to 1) and failed tasks."""

    progress: float


class WorkflowPage(msgspec.Struct, frozen=True, kw_only=True):
    """A page of runs, newest first; ``next_cursor`` fetches the next (None: the last)."""

    items: list[WorkflowSummary]
    next_cursor: str | None


class StatusCounts(msgspec.Struct, frozen=True, kw_only=True):
    """How many runs there are of each status (over the whole store, under the
    filters asked for; statuses with none left out), and in all."""

    counts: dict[str, int]
    total: int


class Event(msgspec.Struct, frozen=True, kw_only=True):
    """One entry of a run's history; ``id`` orders them and resumes a stream."""

    id: str
    at: float
    kind: str
    task: str | None
    attempt: int
    detail: str | None
    #: Who asked for it (submit, cancel, retry, signal): ``token:NAME:ID``,
    #: ``cli:USER``, ``python:USER``; null for what the run did by itself.
    actor: str | None = None


class Attempt(msgspec.Struct, frozen=True, kw_only=True):
    """One attempt of a task, from its history: when it was queued (``enqueued_at``,
    also ``sent_at``), started and ended (``finished_at``, also ``ended_at``), and how."""

    attempt: int
    sent_at: float | None
    ended_at: float | None
    outcome: str | None
    detail: str | None
    enqueued_at: float | None
    started_at: float | None
    finished_at: float | None


class TimelineItem(msgspec.Struct, frozen=True, kw_only=True):
    """One attempt of one task on a run's timeline (a Gantt bar: queued, then ran)."""

    task: str
    attempt: int
    enqueued_at: float | None
    started_at: float | None
    finished_at: float | None
    #: How it ended (completed, failed, retried, iterated, cancelled, ...), or the
    #: task's state while it has not.
    status: str
    #: A loop task's iteration this attempt ran (1, 2, ...); 0 for other tasks.
    iteration: int = 0


class Timeline(msgspec.Struct, frozen=True, kw_only=True):
    """Every attempt of a run, in the order they were first sent."""

    items: list[TimelineItem]


class TaskDetail(TaskInfo, frozen=True, kw_only=True):
    """A task with its attempts, its whole error text, its events, (while it waits)
    the reason it is not running, and (a foreach task) each instance as it stands."""

    attempts: list[Attempt]
    full_error: str | None
    events: list[Event]
    reason: str | None
    #: The first :data:`MAX_INSTANCES` instances of a foreach task (``name[k]``: state,
    #: attempt, times, error); ``items`` counts them all.
    instances: list[TaskInfo] = msgspec.field(default_factory=list)


#: The most instances a task's detail lists (``GET …/tasks?`` lists every one).
MAX_INSTANCES = 1000


class GraphNode(msgspec.Struct, frozen=True, kw_only=True):
    """A task as a node: policy, condition, queue, and state (for a submitted run);
    ``marks`` say what it does beyond running once (``foreach``, ``loop ≤3``,
    ``wait_for 'go'``, ``sleep 5s``, ``compensate``), ``signal`` the one it waits for."""

    name: str
    queue: str
    policy: str
    condition: str | None
    state: str | None
    marks: list[str] = msgspec.field(default_factory=list)
    signal: str | None = None


class GraphEdge(msgspec.Struct, frozen=True, kw_only=True):
    """A dependency: ``target`` depends on ``source`` (conditional: it has a condition)."""

    source: str
    target: str
    conditional: bool


class Graph(msgspec.Struct, frozen=True, kw_only=True):
    """A workflow's DAG: nodes, edges and (for a run) the count of tasks per state."""

    name: str
    id: str | None
    status: str | None
    nodes: list[GraphNode]
    edges: list[GraphEdge]
    counts: dict[str, int]


class Health(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A liveness or readiness answer."""

    status: str
    store: str | None = None


#: Every struct the OpenAPI document describes.
SCHEMAS: tuple[Any, ...] = (
    Accepted,
    WorkflowDetail,
    WorkflowPage,
    StatusCounts,
    Event,
    TaskDetail,
    TaskInfo,
    Timeline,
    Graph,
    Health,
    Problem,
)

#: Final workflow states that still hold nothing to do (terminal, for progress).
_ENDS = frozenset({"completed", "failed", "cancelled", "skipped", "upstream_failed", "iterated"})
_EVENT_ID = re.compile(r"^(\d{1,18})-(\d{1,9})\Z")


def status_url(workflow_id: str) -> str:
    """Where a run's status lives."""
    return f"/v1/workflows/{workflow_id}"


def detail(status: WorkflowStatus) -> WorkflowDetail:
    """The status with its progress."""
    progress = status.done / status.total if status.total else 1.0
    return WorkflowDetail(**msgspec.structs.asdict(status), progress=round(progress, 4))


def event_id(seq: int, index: int) -> str:
    """The id of the ``index``-th entry of history chunk ``seq``."""
    return f"{seq}-{index}"


def parse_event_id(text: str) -> tuple[int, int]:
    """(chunk, index) from an event id; 400 naming it if it is not one."""
    found = _EVENT_ID.match(text.strip())
    if found is None:
        raise ProblemError(
            "malformed-request", f"{text[:40]!r} is not an event id (chunk-index, as sent)"
        )
    return int(found[1]), int(found[2])


def events(
    chunks: list[tuple[int, list[HistoryEntry]]], after: tuple[int, int] | None
) -> list[Event]:
    """The entries of history chunks as events, those after position ``after`` only."""
    found = []
    for seq, entries in chunks:
        for i, e in enumerate(entries):
            if after is not None and (seq, i) <= after:
                continue
            found.append(
                Event(
                    id=event_id(seq, i),
                    at=e.at,
                    kind=e.kind,
                    task=e.task,
                    attempt=e.attempt,
                    detail=e.detail,
                    actor=e.actor,
                )
            )
    return found


#: (attempt, started_at, state) of a task's current attempt, as the run state has it.
Current = tuple[int, float | None, str]


def attempts(task: str, history: list[Event], current: Current | None = None) -> list[Attempt]:
    """A task's attempts as its history tells them (each ``dispatched`` opens one); the
    current attempt's start comes from the state when the history has none."""
    return [
        Attempt(
            attempt=t.attempt,
            sent_at=t.enqueued_at,
            ended_at=t.finished_at,
            outcome=outcome,
            detail=detail,
            enqueued_at=t.enqueued_at,
            started_at=t.started_at,
            finished_at=t.finished_at,
        )
        for t, outcome, detail in _attempts_of(history, {task: current} if current else {}, task)
    ]


def timeline(
    history: list[Event],
    current: dict[str, Current],
    instances: list[TimelineItem] | None = None,
    loops: frozenset[str] = frozenset(),
) -> Timeline:
    """Every attempt of a run (of each task, instance and compensation in the history),
    in the order they were first sent; ``current`` holds each task's current attempt.

    The history records a foreach instance only when an attempt of it fails, so the
    latest attempt of each instance comes from the state (``instances``), a bar of
    its own; each attempt of a loop task (in ``loops``) carries its iteration."""
    items = [t for t, _, _ in _attempts_of(history, current, None)]
    if instances:
        seen = {(t.task, t.attempt): n for n, t in enumerate(items)}
        for each in instances:
            n = seen.get((each.task, each.attempt))
            if n is None:
                items.append(each)
            else:  # the history's (a failure) with the times the state has
                items[n] = msgspec.structs.replace(
                    each, status=items[n].status, finished_at=items[n].finished_at
                )
        items.sort(key=lambda t: (_first(t), t.attempt))
    if loops:
        items = _iterations(items, history, loops)
    return Timeline(items=items)


def _iterations(
    items: list[TimelineItem], history: list[Event], loops: frozenset[str]
) -> list[TimelineItem]:
    """Number each attempt of a loop task by the iteration it ran: an ``iterated``
    entry ends an attempt and starts the next iteration."""
    ends: dict[str, list[int]] = {}  # task -> the attempts that ended an iteration
    for e in history:
        if e.kind == "iterated" and e.task in loops:
            ends.setdefault(e.task, []).append(e.attempt)
    return [
        msgspec.structs.replace(
            item, iteration=1 + sum(1 for a in ends.get(item.task, ()) if a < item.attempt)
        )
        if item.task in loops
        else item
        for item in items
    ]


def _attempts_of(
    history: list[Event], current: dict[str, Current], only: str | None
) -> list[tuple[TimelineItem, str | None, str | None]]:
    """(item, outcome, detail) of each attempt in the history (of task ``only``)."""
    found: dict[tuple[str, int], dict[str, Any]] = {}
    for e in history:
        if e.task is None or e.attempt < 1 or (only is not None and e.task != only):
            continue
        seen = found.setdefault(
            (e.task, e.attempt),
            {"enqueued_at": None, "started_at": None, "finished_at": None, "outcome": None},
        )
        if e.kind == "dispatched":
            seen["enqueued_at"] = seen["enqueued_at"] or e.at
        elif e.kind == "started":
            seen["started_at"] = seen["started_at"] or e.at
        elif e.kind in _ENDS or e.kind == "retried":
            seen.update(finished_at=e.at, outcome=e.kind, detail=e.detail)
    items = []
    for (task, number), seen in found.items():
        attempt, started, state = current.get(task) or (0, None, "unknown")
        if number == attempt and seen["started_at"] is None:
            seen["started_at"] = started
        status = seen["outcome"] or (state if number == attempt else "failed")
        item = TimelineItem(
            task=task,
            attempt=number,
            enqueued_at=seen["enqueued_at"],
            started_at=seen["started_at"],
            finished_at=seen["finished_at"],
            status=status,
        )
        items.append((item, seen["outcome"], seen.get("detail")))
    return sorted(items, key=lambda t: (t[0].task != only, _first(t[0]), t[0].attempt))


def _first(item: TimelineItem) -> float:
    return item.enqueued_at or item.started_at or item.finished_at or 0.0


def graph_of(
    definition: WorkflowDef,
    queues: list[str],
    *,
    states: list[str] | None = None,
    workflow_id: str | None = None,
    status: str | None = None,
) -> Graph:
    """A definition's DAG as nodes and edges (with task states for a run); ``queues``
    are the tasks' queues as the plan resolved them."""
    nodes = graph.nodes_of(definition, states)
    counts: dict[str, int] = {}
    for state in states or []:
        counts[state] = counts.get(state, 0) + 1
    return Graph(
        name=definition.name,
        id=workflow_id,
        status=status,
        nodes=[
            GraphNode(
                name=n.name,
                queue=queue,
                policy=n.policy,
                condition=n.condition,
                state=n.state,
                marks=list(n.marks),
                signal=task.wait_for.signal if task.wait_for else None,
            )
            for n, task, queue in zip(nodes, definition.tasks, queues, strict=True)
        ],
        edges=[
            GraphEdge(source=parent, target=n.name, conditional=n.condition is not None)
            for n in nodes
            for parent in n.parents
        ],
        counts=counts,
    )
