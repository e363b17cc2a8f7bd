"""New workflows as their submits in the coordinator's process stored them, kept until
the coordinator loads them (``Coordinator.preload``), under a bound.

A copy whose state is written (its etag known) only saves the load a read: dropped to
make room, the oldest first, it is read back. A copy whose state is *not* written (an
empty etag: the submit left the first write to the coordinator's first commit) is the
only copy of that state, and its wake-up is handed over with it: dropped, the
coordinator would find no state and drop the wake-up, the run left for the periodic
rescan. Such a copy is never dropped; while every copy kept is one, a new one is
declined, and its submit writes the state itself (as with no coordinator to hand to).
"""

from __future__ import annotations

from dagq.submitted import Created


class Preloads:
    """Kept copies by workflow id, oldest first, at most ``size``."""

    def __init__(self, size: int) -> None:
        self.size = max(1, size)
        self._copies: dict[str, Created] = {}
        #: How many of them are the only copy of their state (an empty etag).
        self._unwritten = 0

    def __len__(self) -> int:
        return len(self._copies)

    def __bool__(self) -> bool:
        return bool(self._copies)

    def __contains__(self, workflow_id: object) -> bool:
        return workflow_id in self._copies

    @property
    def unwritten(self) -> int:
        """How many copies kept are the only copy of their state."""
        return self._unwritten

    def keep(self, created: Created) -> bool:
        """Keep a copy, dropping the oldest written one if there is no room; False (not
        kept) when every copy kept is unwritten: none of them may go."""
        workflow_id = created.submitted.workflow_id
        self.take(workflow_id)  # a copy of a namesake (purged and submitted again)
        if len(self._copies) >= self.size and not self._drop_written():
            return False
        self._copies[workflow_id] = created
        if not created.etag:
            self._unwritten += 1
        return True

    def take(self, workflow_id: str) -> Created | None:
        """The copy of a workflow, no longer kept; None if there is none."""
        created = self._copies.pop(workflow_id, None)
        if created is not None and not created.etag:
            self._unwritten -= 1
        return created

    def clear(self) -> None:
        """Keep nothing (the coordinator stopped: its submits write their states)."""
        self._copies.clear()
        self._unwritten = 0

    def _drop_written(self) -> bool:
        """Drop the oldest copy whose state is written; False if there is none."""
        if self._unwritten >= len(self._copies):
            return False
        for workflow_id, created in self._copies.items():
            if created.etag:
                del self._copies[workflow_id]
                return True
        return False
