"""The coordinator's working copies of workflow states, under a hard bound.

At most ``size`` states are held, active ones included; the least recently used is
evicted first, preferring finished workflows, then active ones with nothing owed to
the store (no unsent task, no pending index write). A state not written yet (its
submit left the first write to this coordinator: ``Stored.absent``) is never evicted:
it is the only copy, and a reload would find nothing and drop the run's wake-up (the
bound is exceeded by at most the new workflows of one step, until its commit writes
them). An evicted workflow that is still
active stays known by its id alone, with the time its next sweep is due (a timeout,
a timer, a deadline): sweeps reload only those whose time has come, so memory
follows the bound, not the number of active workflows, and a store error drops only
the workflows it touched.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator

import msgspec

from dagq import machine
from dagq.dispatching import Outgoing
from dagq.messages import Event
from dagq.persistence import Stored
from dagq.plan import Plan
from dagq.state import RunState


class Entry(msgspec.Struct, eq=False):
    """A cached workflow: its plan, working state and the etag it was read at."""

    plan: Plan
    state: RunState
    stored: Stored
    name: str
    tenant: str
    #: The run's labels, as submitted (kept in its index row).
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    deadlines: list[tuple[float, int, int]] = msgspec.field(default_factory=list)
    repairs: list[tuple[float, int, machine.Dispatch]] = msgspec.field(default_factory=list)
    timers: list[tuple[float, int]] = msgspec.field(default_factory=list)
    unsent: list[tuple[machine.Dispatch, Outgoing]] = msgspec.field(default_factory=list)
    #: The stored state lists dispatches as unconfirmed that have been sent since: the
    #: next flush (or a sweep, from ``confirm_at``) writes it without them.
    confirm_owed: bool = False
    #: When a sweep writes the state only to confirm those sends (coordinator clock).
    confirm_at: float = 0.0
    #: The status and time of the last index write, and whether counts changed since.
    indexed_status: str = ""
    indexed_at: float = float("-inf")
    index_owed: bool = False
    #: Loaded from the store by the current unit of work (not an older cached copy).
    fresh: bool = False
    #: Released from quarantine: these kept events are applied before any other, and
    #: the next write deletes the quarantine record.
    replay: list[Event] = msgspec.field(default_factory=list)
    releasing: bool = False
    #: Who submitted it (the definition document says), for its ``submitted`` event.
    submitted_by: str = ""

    def owes(self) -> bool:
        """Would evicting it now lose something the store does not know yet?"""
        return (
            bool(self.unsent or self.confirm_owed or self.index_owed or self.releasing)
            or self.state.dirty
            or self.stored.absent
        )


class WorkflowCache:
    """Entries by workflow id (least recently used first) and the active ids."""

    def __init__(
        self,
        size: int,
        *,
        due: Callable[[Entry], float],
        busy: Callable[[str], bool] = lambda _: False,
    ) -> None:
        self.size = max(1, size)
        self._due = due
        #: Workflows whose working copy a thread is changing: never evicted meanwhile.
        self._busy = busy
        self._entries: OrderedDict[str, Entry] = OrderedDict()
        #: Entries held beyond which an add trims: the bound, or, after a trim that
        #: found too few to evict (states not written yet), a little above what it left.
        self._trim_at = self.size
        #: Every active workflow this coordinator advances, cached or not, with the
        #: time an evicted one must be reloaded for a sweep (ignored while cached).
        self._active: dict[str, float] = {}
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, workflow_id: object) -> bool:
        return workflow_id in self._entries

    @property
    def active_count(self) -> int:
        """How many active workflows are known, cached or not."""
        return len(self._active)

    def is_active(self, workflow_id: str) -> bool:
        """Is this workflow known to be active (cached or not)?"""
        return workflow_id in self._active

    def get(self, workflow_id: str) -> Entry | None:
        """The entry, now the most recently used."""
        entry = self._entries.get(workflow_id)
        if entry is not None:
            self._entries.move_to_end(workflow_id)
        return entry

    def peek(self, workflow_id: str) -> Entry | None:
        """The entry, without touching its place in the eviction order."""
        return self._entries.get(workflow_id)

    def add(self, workflow_id: str, entry: Entry, *, active: bool) -> None:
        """Hold a freshly loaded entry, evicting others to stay within the bound."""
        self._entries[workflow_id] = entry
        self._entries.move_to_end(workflow_id)
        self.mark(workflow_id, active=active)
        if len(self._entries) > self._trim_at:
            self._trim()

    def mark(self, workflow_id: str, *, active: bool) -> None:
        """Record whether a workflow is active (it started, finished or reopened)."""
        if active:
            self._active.setdefault(workflow_id, float("inf"))
        else:
            self._active.pop(workflow_id, None)

    def drop(self, workflow_id: str) -> None:
        """Forget the working copy (it may be wrong); an active workflow stays known and
        is reloaded at the next sweep."""
        if self._entries.pop(workflow_id, None) is not None and workflow_id in self._active:
            self._active[workflow_id] = float("-inf")

    def forget(self, workflow_id: str) -> None:
        """Forget a workflow entirely (it is gone, or set aside)."""
        self._entries.pop(workflow_id, None)
        self._active.pop(workflow_id, None)

    def clear(self) -> None:
        """Forget everything (a new term as coordinator: the store may have moved on)."""
        self._entries.clear()
        self._active.clear()
        self._trim_at = self.size

    def active_entries(self) -> list[Entry]:
        """The cached entries of active workflows."""
        return [self._entries[w] for w in self._active if w in self._entries]

    def due(self, now: float) -> list[str]:
        """Active workflows not cached whose sweep is due."""
        return [w for w, when in self._active.items() if when <= now and w not in self._entries]

    def ids(self) -> Iterator[str]:
        """The cached ids, least recently used first."""
        return iter(list(self._entries))

    def _trim(self) -> None:
        """Evict down to a little under the bound (so trims are not paid per load):
        finished workflows first, then active ones that owe nothing, then any but one
        whose state is not written yet (the only copy of it). Short of that (a step
        loading more new workflows than the bound), the next trim waits for as many
        more loads as the margin: a trim scans every entry."""
        margin = max(1, self.size // 32)
        self._evict(len(self._entries) - self.size + margin)
        self._trim_at = max(self.size, len(self._entries) + margin)

    def _evict(self, excess: int) -> None:
        excess = min(excess, len(self._entries) - 1)  # never the entry just added
        if excess <= 0:
            return
        newest = next(reversed(self._entries))
        for keep_active, keep_owing in ((True, True), (False, True), (False, False)):
            for workflow_id in list(self._entries):
                if excess <= 0:
                    return
                if workflow_id == newest or self._busy(workflow_id):
                    continue
                entry = self._entries[workflow_id]
                if entry.stored.absent:
                    continue
                active = workflow_id in self._active
                if (keep_active and active) or (keep_owing and active and entry.owes()):
                    continue
                del self._entries[workflow_id]
                if active:
                    self._active[workflow_id] = self._due(entry)
                self.evictions += 1
                excess -= 1
