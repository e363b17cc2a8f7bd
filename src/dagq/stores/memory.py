"""The in-memory backend: plain dicts in one process, for tests and examples.

It answers every call exactly like the durable backends (the conformance suite runs
on it too), so code tested against it behaves the same on sqlite.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import msgspec

from dagq.errors import LeaseHeld
from dagq.stores.base import (
    DEFAULT_MAX_DELIVERIES,
    Clock,
    DeadLetter,
    Document,
    IndexPage,
    IndexRow,
    Lease,
    Message,
    OutgoingMessage,
    QueueDepth,
    Store,
)
from dagq.stores.changes import INDEX_TOPIC, ChangeFeed
from dagq.stores.common import (
    Wakeups,
    check_limit,
    check_max_deliveries,
    check_outgoing,
    check_page_size,
    check_put,
    check_receive,
    check_statuses,
    check_ttl,
    check_visibility,
    conflict,
    count_statuses,
    decode_cursor,
    decode_row,
    encode_cursor,
    encode_row,
    lease_lost,
    new_message_id,
    new_token,
    stale_receipt,
    too_many_deliveries,
)
from dagq.stores.transfer import PendingMessage


class MemoryDocuments:
    """Documents in a dict."""

    def __init__(self) -> None:
        self._docs: dict[str, Document] = {}

    async def get(self, key: str) -> Document | None:
        return self._docs.get(key)

    async def put(
        self, key: str, data: bytes, *, if_match: str | None = None, if_none_match: bool = False
    ) -> str:
        check_put(if_match, if_none_match)
        current = self._docs.get(key)
        if (if_none_match and current is not None) or (
            if_match is not None and (current is None or current.etag != if_match)
        ):
            raise conflict(key, if_match)
        etag = new_token()
        self._docs[key] = Document(bytes(data), etag)
        return etag

    async def delete(self, key: str, *, if_match: str | None = None) -> bool:
        current = self._docs.get(key)
        if current is None:
            return False
        if if_match is not None and current.etag != if_match:
            raise conflict(key, if_match)
        del self._docs[key]
        return True

    async def list(
        self, prefix: str, *, start_after: str | None = None, limit: int | None = None
    ) -> list[str]:
        check_limit(limit)
        keys = sorted(
            key
            for key in self._docs
            if key.startswith(prefix) and (start_after is None or key > start_after)
        )
        return keys if limit is None else keys[:limit]


@dataclass
class _Queued:
    seq: int
    id: str
    body: bytes
    enqueued_at: float
    visible_at: float
    receipt: str | None = None
    dequeue_count: int = 0


class MemoryQueues:
    """Queues in dicts, with the same visibility and dead-letter rules as sqlite."""

    deduplicates = True
    bundle_size = 1
    #: One process only: every send wakes its waiters.
    wakes = True

    def __init__(self, clock: Clock, max_deliveries: int) -> None:
        self._clock = clock
        self._max_deliveries = max_deliveries
        self._queues: dict[str, dict[str, _Queued]] = {}
        self._dead: list[DeadLetter] = []
        self._dead_seq = 0
        self._seq = itertools.count()
        self._wakeups = Wakeups()
        self._seen: dict[str, int] = {}

    async def send(self, queue: str, messages: Sequence[OutgoingMessage]) -> None:
        check_outgoing(queue, messages)
        now = self._clock()
        queued = self._queues.setdefault(queue, {})
        for message in messages:
            message_id = message.id or new_message_id()
            if message_id not in queued:
                queued[message_id] = _Queued(
                    next(self._seq), message_id, bytes(message.body), now, now + message.delay_s
                )
        if messages:
            self._wakeups.notify(queue)

    async def receive(
        self, queue: str, *, max_messages: int, visibility_timeout_s: float
    ) -> list[Message]:
        check_receive(max_messages, visibility_timeout_s)
        self._seen[queue] = self._wakeups.sends(queue)
        now = self._clock()
        visible = sorted(
            (m for m in self._queues.get(queue, {}).values() if m.visible_at <= now),
            key=lambda m: (m.visible_at, m.seq),
        )
        taken: list[_Queued] = []
        for queued in visible:
            if queued.dequeue_count >= self._max_deliveries:
                self._bury(queue, queued, too_many_deliveries(queued.dequeue_count), now)
            elif len(taken) < max_messages:
                queued.visible_at = now + visibility_timeout_s
                queued.receipt = new_token()
                queued.dequeue_count += 1
                taken.append(queued)
        return [_received(queue, queued) for queued in sorted(taken, key=lambda m: m.seq)]

    async def delete(self, queue: str, receipts: Sequence[str]) -> int:
        deleted = 0
        for receipt in receipts:
            queued = self._find(queue, receipt)
            if queued is not None:
                del self._queues[queue][queued.id]
                deleted += 1
        return deleted

    async def extend(self, queue: str, receipt: str, visibility_timeout_s: float) -> str:
        check_visibility(visibility_timeout_s)
        queued = self._find(queue, receipt)
        if queued is None:
            raise stale_receipt(queue, receipt)
        queued.visible_at = self._clock() + visibility_timeout_s
        queued.receipt = new_token()
        return queued.receipt

    async def dead_letter(self, queue: str, receipt: str, reason: str) -> None:
        queued = self._find(queue, receipt)
        if queued is not None:  # a stale receipt is ignored, as by delete
            self._bury(queue, queued, reason, self._clock())

    async def dead_letters(self, queue: str | None, *, limit: int = 100) -> list[DeadLetter]:
        check_limit(limit)
        return [d for d in self._dead if queue is None or d.queue == queue][:limit]

    async def dead_letter_of(self, key: str) -> DeadLetter | None:
        return next((d for d in self._dead if d.key == key), None)

    async def remove_dead_letters(self, keys: Sequence[str]) -> int:
        gone = set(keys)
        before = len(self._dead)
        self._dead = [d for d in self._dead if d.key not in gone]
        return before - len(self._dead)

    async def depth(self, queue: str) -> QueueDepth:
        now = self._clock()
        queued = list(self._queues.get(queue, {}).values())
        visible = sum(1 for m in queued if m.visible_at <= now)
        oldest = min((m.enqueued_at for m in queued), default=now)
        return QueueDepth(visible, len(queued) - visible, max(0.0, now - oldest))

    async def wait(self, queue: str, timeout_s: float) -> None:
        await self._wakeups.wait(queue, timeout_s, seen=self._seen.get(queue))

    async def pending(self, *, after: int, limit: int) -> list[tuple[int, PendingMessage]]:
        """Queued messages of every queue after position ``after``, without receiving
        them (for :func:`~dagq.stores.transfer.copy_store`)."""
        found = sorted(
            (m.seq + 1, PendingMessage(queue, m.id, m.body))
            for queue, queued in self._queues.items()
            for m in queued.values()
            if m.seq + 1 > after
        )
        return found[:limit]

    def _find(self, queue: str, receipt: str) -> _Queued | None:
        for queued in self._queues.get(queue, {}).values():
            if queued.receipt == receipt:
                return queued
        return None

    def _bury(self, queue: str, queued: _Queued, reason: str, now: float) -> None:
        del self._queues[queue][queued.id]
        self._dead_seq += 1
        key = str(self._dead_seq)
        dead = DeadLetter(queue, queued.id, queued.body, queued.dequeue_count, reason, now, key)
        self._dead.append(dead)


def _received(queue: str, queued: _Queued) -> Message:
    assert queued.receipt is not None
    return Message(
        queue, queued.id, queued.body, queued.receipt, queued.dequeue_count, queued.enqueued_at
    )


class MemoryIndex:
    """Index rows in a dict, stored encoded so they behave exactly like persisted ones."""

    def __init__(self, changes: ChangeFeed | None = None) -> None:
        self._rows: dict[str, bytes] = {}
        self._changes = changes

    async def upsert(self, row: IndexRow) -> None:
        self._rows[row.id] = encode_row(row)
        if self._changes is not None:
            self._changes.notify([INDEX_TOPIC])

    async def get(self, workflow_id: str) -> IndexRow | None:
        data = self._rows.get(workflow_id)
        return None if data is None else decode_row(data)

    async def query(
        self,
        *,
        status: Sequence[str] | None = None,
        name: str | None = None,
        tenant: str | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> IndexPage:
        check_page_size(limit)
        check_statuses(status)
        after = decode_cursor(cursor) if cursor is not None else None
        rows = sorted(
            (
                row
                for row in map(decode_row, self._rows.values())
                if (status is None or row.status in status)
                and (name is None or row.name == name)
                and (tenant is None or row.tenant == tenant)
                and (after is None or (row.created_at, row.id) < after)
            ),
            key=lambda row: (row.created_at, row.id),
            reverse=True,
        )
        if len(rows) > limit:
            return IndexPage(rows[:limit], encode_cursor(rows[limit - 1]))
        return IndexPage(rows[:limit])

    async def changed(self, after: float, *, limit: int = 100) -> list[IndexRow]:
        check_page_size(limit)
        rows = [row for row in map(decode_row, self._rows.values()) if row.updated_at > after]
        return sorted(rows, key=lambda row: (row.updated_at, row.id))[:limit]

    async def count(
        self,
        *,
        name: str | None = None,
        tenant: str | None = None,
        labels: Mapping[str, str] | None = None,
        created_after: float | None = None,
        created_before: float | None = None,
    ) -> dict[str, int]:
        rows = (
            row
            for row in map(decode_row, self._rows.values())
            if (name is None or row.name == name) and (tenant is None or row.tenant == tenant)
        )
        return count_statuses(rows, labels, created_after, created_before)

    async def delete(self, workflow_id: str) -> bool:
        return self._rows.pop(workflow_id, None) is not None


class MemoryLeases:
    """Leases in a dict."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._leases: dict[str, Lease] = {}

    async def acquire(self, name: str, owner: str, ttl_s: float, *, force: bool = False) -> Lease:
        check_ttl(name, ttl_s)
        now = self._clock()
        held = self._leases.get(name)
        if held is not None and not force and held.owner != owner and held.expires_at > now:
            raise LeaseHeld(name, held.owner, now - held.acquired_at, held.expires_at - now)
        lease = Lease(name, owner, new_token(), now, now + ttl_s)
        self._leases[name] = lease
        return lease

    async def renew(self, lease: Lease, ttl_s: float) -> Lease:
        check_ttl(lease.name, ttl_s)
        held = self._leases.get(lease.name)
        if held is None or held.token != lease.token:
            raise lease_lost(lease)
        renewed = msgspec.structs.replace(held, expires_at=self._clock() + ttl_s)
        self._leases[lease.name] = renewed
        return renewed

    async def release(self, lease: Lease) -> None:
        held = self._leases.get(lease.name)
        if held is not None and held.token == lease.token:
            del self._leases[lease.name]

    async def get(self, name: str) -> Lease | None:
        held = self._leases.get(name)
        return held if held is not None and held.expires_at > self._clock() else None


def open_memory_store(
    url: str = "memory://",
    *,
    clock: Clock = time.time,
    max_deliveries: int = DEFAULT_MAX_DELIVERIES,
) -> Store:
    """A fresh, empty store that lives in this process only."""
    check_max_deliveries(max_deliveries)
    changes = ChangeFeed(complete=True)  # nothing outside this process writes to it
    return Store(
        url=url,
        documents=MemoryDocuments(),
        queues=MemoryQueues(clock, max_deliveries),
        index=MemoryIndex(changes),
        leases=MemoryLeases(clock),
        changes=changes,
    )
