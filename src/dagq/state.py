"""The runtime state of one workflow: columns of per-task fields, and its compact encoding.

The state is held column-wise (one list per field) so that a 100,000-task workflow is
a handful of lists, not 100,000 objects, and encodes in one pass. Parent counters and
the other bookkeeping below ``--- derived`` are rebuilt on load, never stored.
"""

from __future__ import annotations

from array import array
from collections import deque
from enum import IntEnum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # not imported to run: `dagq list` reads states' names, not plans
    from dagq.group import Group
    from dagq.plan import Plan

UNSET = -1.0


class TaskStatus(IntEnum):
    """Where a task is in its life. Values are stored; never renumber."""

    PENDING = 0
    READY = 1
    RUNNING = 2
    WAITING = 3
    COMPLETED = 4
    FAILED = 5
    SKIPPED = 6
    UPSTREAM_FAILED = 7
    CANCELLED = 8

    @property
    def label(self) -> str:
        """The lower-case name users see."""
        return self.name.lower()


TERMINAL = frozenset(
    {
        TaskStatus.COMPLETED,
        TaskStatus.FAILED,
        TaskStatus.SKIPPED,
        TaskStatus.UPSTREAM_FAILED,
        TaskStatus.CANCELLED,
    }
)
#: Statuses that block an ``all`` child and count as "not succeeded" for result policies.
BAD = frozenset({TaskStatus.FAILED, TaskStatus.UPSTREAM_FAILED, TaskStatus.CANCELLED})

WORKFLOW_ACTIVE = frozenset({"pending", "running", "cancelling", "compensating"})
WORKFLOW_TERMINAL = frozenset({"completed", "failed", "cancelled", "compensation_failed"})
#: Not a state the machine gives: the coordinator set the workflow aside after its work
#: on it failed (see :mod:`dagq.quarantine`). Shown in the index, status and doctor.
QUARANTINED = "quarantined"

#: How many request ids a state remembers (the most recent ones): a copy of a request
#: delivered again within this many later requests to the same workflow is recognised.
MAX_REQUEST_IDS = 100

#: Where a task's compensation stands (``RunState.undo_status``).
UNDO_QUEUED, UNDO_SENT, UNDO_DONE, UNDO_FAILED = 1, 2, 3, 4


class RunState:
    """The mutable working copy of one workflow's runtime state.

    Only the coordinator holds one, and only the state machine changes it. On any
    failed write the coordinator throws the copy away and reloads from the store.
    """

    __slots__ = (
        "attempt",
        "cancel_reason",
        "cancelled_at",
        "changed",
        "changed_groups",
        "changed_items",
        "compensate_after",
        "counts",
        "created_at",
        "delay_spent",
        "dirty",
        "dispatched_at",
        "epoch",
        "error",
        "errors",
        "final_on_cancel",
        "finished_at",
        "groups",
        "held",
        "history_seq",
        "history_tail",
        "in_flight",
        "iteration",
        "n_bad",
        "n_done",
        "n_skip",
        "n_terminal",
        "output_refs",
        "outputs",
        "requests",
        "resolved",
        "retry_base",
        "round_started",
        "signals",
        "started_at",
        "status",
        "stop_requests",
        "task_finished_at",
        "task_status",
        "unconfirmed",
        "undo_attempt",
        "undo_order",
        "undo_status",
        "updated_at",
        "wake_at",
        "workflow_id",
    )

    def __init__(self, workflow_id: str, n_tasks: int, created_at: float) -> None:
        self.workflow_id = workflow_id
        self.status = "pending"
        self.created_at = created_at
        self.updated_at = created_at
        self.finished_at = UNSET
        self.error: str | None = None
        self.cancel_reason: str | None = None
        self.cancelled_at = UNSET
        self.final_on_cancel = "cancelled"
        self.history_seq = 0
        #: The last history chunks, kept in the state document rather than each in a
        #: document of its own (docs/architecture.md): they are the chunks
        #: ``history_seq - len(history_tail)`` up to ``history_seq - 1``.
        self.history_tail: list[bytes] = []
        #: Bumped by every retry request: attempts sent before a stop carry an older one.
        self.epoch = 0
        self.task_status = bytearray(n_tasks)
        # Per-task numbers are arrays, not lists: the collector neither tracks nor walks
        # them (a full collection visited each entry of a 100,000-int list: 1-2 ms a
        # column). See docs/architecture.md (memory and the garbage collector).
        self.attempt = counters(n_tasks)
        # Times are arrays of doubles: they encode as raw bytes, with no per-task work.
        self.dispatched_at = array("d", [UNSET]) * n_tasks
        self.started_at = array("d", [UNSET]) * n_tasks
        self.task_finished_at = array("d", [UNSET]) * n_tasks
        self.outputs: dict[int, Any] = {}
        self.output_refs: dict[int, str] = {}
        self.errors: dict[int, str] = {}
        self.retry_base: dict[int, int] = {}
        #: When a waiting task's timer fires or its wait for a signal times out.
        self.wake_at: dict[int, float] = {}
        #: The loop iteration of a looping task's current attempt (1-based).
        self.iteration: dict[int, int] = {}
        #: When a task's current round of attempts began (for ``task_deadline_s``).
        self.round_started: dict[int, float] = {}
        #: Seconds of retry delay a task's current round has used (``max_total_delay_s``).
        self.delay_spent: dict[int, float] = {}
        #: Running attempts workers must stop (a lost race), by task.
        self.stop_requests: dict[int, int] = {}
        #: Signals received that no wait has taken yet, by name, oldest first: each task
        #: that starts waiting takes the next one of its signal.
        self.signals: dict[str, list[Any]] = {}
        #: The ids of the most recent requests applied (cancel, retry, signal), oldest
        #: first, at most MAX_REQUEST_IDS: a request delivered twice acts once.
        self.requests: list[str] = []
        #: Compensations (sagas): each task's undo progress and attempt, the order they
        #: run in (reverse completion), and the status the run ends with afterwards.
        self.undo_status: dict[int, int] = {}
        self.undo_attempt: dict[int, int] = {}
        self.undo_order: list[int] = []
        self.compensate_after = ""
        #: The instances of expanded foreach tasks, by task (see :mod:`dagq.group`).
        self.groups: dict[int, Group] = {}
        #: Attempts dispatched whose messages may not have gone out yet, as
        #: :func:`dispatch_key` of (task, item or -1, undo): a coordinator that loads
        #: this state re-sends only these. None: not known (a document from before this
        #: was kept): every ready task may be.
        self.unconfirmed: set[int] | None = set()
        # --- derived (rebuilt by ``rebuild``; never stored)
        self.n_done = counters(n_tasks)
        self.n_skip = counters(n_tasks)
        self.n_bad = counters(n_tasks)
        self.counts = [0] * len(TaskStatus)
        self.counts[TaskStatus.PENDING] = n_tasks
        self.n_terminal = 0
        self.in_flight = 0
        self.held: deque[int] = deque()
        self.resolved: dict[str, Any] = {}
        self.dirty = False
        #: Tasks (and foreach groups) changed since the last flush: what a delta carries.
        self.changed: set[int] = set()
        self.changed_groups: set[int] = set()
        self.changed_items: dict[int, set[int]] = {}

    @property
    def n_tasks(self) -> int:
        """How many tasks the workflow has."""
        return len(self.task_status)

    def status_of(self, task: int) -> TaskStatus:
        """The status of one task."""
        return TaskStatus(self.task_status[task])

    def indexes(self, status: TaskStatus) -> list[int]:
        """The tasks with this status, in index order (found by a scan in C: a
        100,000-task state with a few of them costs microseconds, not a Python loop)."""
        found: list[int] = []
        column, code = self.task_status, int(status)
        i = column.find(code)
        while i >= 0:
            found.append(i)
            i = column.find(code, i + 1)
        return found

    def set_status(self, task: int, status: TaskStatus) -> None:
        """Change a task's status, keeping the per-status counts right."""
        old = self.task_status[task]
        self.counts[old] -= 1
        self.counts[status] += 1
        if status in TERMINAL and old not in TERMINAL:
            self.n_terminal += 1
        elif old in TERMINAL and status not in TERMINAL:
            self.n_terminal -= 1
        self.task_status[task] = status
        self.changed.add(task)
        self.dirty = True

    def touch_group(self, task: int) -> None:
        """Note a change to a foreach task's group as a whole (expanded, reset)."""
        self.changed_groups.add(task)
        group = self.groups.get(task)
        if group is not None:
            group.stale_all()
        self.dirty = True

    def touch_item(self, task: int, item: int) -> None:
        """Note a change to one instance of a foreach task."""
        self.changed_items.setdefault(task, set()).add(item)
        group = self.groups.get(task)
        if group is not None:
            group.stale(item)
        self.dirty = True

    def touch(self, task: int) -> None:
        """Note a change to a task's fields other than its status."""
        self.changed.add(task)
        self.dirty = True

    def first_delivery(self, request_id: str) -> bool:
        """Remember a request's id; False if it was applied already (a redelivery).

        Requests without an id (sent by an older client) are always applied.
        """
        if not request_id:
            return True
        if request_id in self.requests:
            return False
        self.requests.append(request_id)
        del self.requests[:-MAX_REQUEST_IDS]
        self.dirty = True
        return True

    def count_map(self) -> dict[str, int]:
        """Counts per task status, by label, leaving out zeros."""
        return {TaskStatus(s).label: n for s, n in enumerate(self.counts) if n}

    def rebuild(self, plan: Plan) -> None:
        """Recompute everything derived from the stored columns."""
        n = self.n_tasks
        self.n_done = counters(n)
        self.n_skip = counters(n)
        self.n_bad = counters(n)
        self.counts = [0] * len(TaskStatus)
        self.n_terminal = 0
        self.in_flight = 0
        self.held = deque()
        for i, code in enumerate(self.task_status):
            status = TaskStatus(code)
            self.counts[status] += 1
            if status in TERMINAL:
                self.n_terminal += 1
                counter = self._counter_for(status)
                for child in plan.tasks[i].children:
                    counter[child] += 1
            elif status is TaskStatus.RUNNING or (
                status is TaskStatus.READY and self.dispatched_at[i] != UNSET
            ):
                self.in_flight += 1
            elif status is TaskStatus.READY:
                self.held.append(i)

    def _counter_for(self, status: TaskStatus) -> array[int]:
        if status is TaskStatus.COMPLETED:
            return self.n_done
        if status is TaskStatus.SKIPPED:
            return self.n_skip
        return self.n_bad


def counters(n: int) -> array[int]:
    """``n`` zeros, as a column of 64-bit ints (one object the collector never walks)."""
    return array("q", bytes(8 * n))


def dispatch_key(task: int, item: int = -1, undo: bool = False) -> int:
    """A dispatch (task, foreach item or -1, undo) as one int.

    After a fan-out a state lists 100,000 dispatches as unconfirmed: as tuples, the
    garbage collector would walk 100,000 objects (tens of milliseconds, holding the
    GIL); as ints, the set is one object.
    """
    return task << 33 | (item + 1) << 1 | undo


def dispatch_parts(key: int) -> tuple[int, int, bool]:
    """The (task, item or -1, undo) of a :func:`dispatch_key`."""
    return key >> 33, (key >> 1 & 0xFFFF_FFFF) - 1, bool(key & 1)
