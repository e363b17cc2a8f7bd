"""Batching for workers: events go out many to a message, deletes many to a call.

A worker finishing hundreds of tasks a second must not pay one queue round trip per
event. Callers ``await`` their event or delete; a background flusher takes whatever
has piled up, sends it in as few operations as the size limit allows, and resolves
every waiter once its part is durable. Nothing is dropped: a failed send is retried
with backoff until it succeeds or the outbox is closed.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from dataclasses import dataclass

from dagq.errors import DagqError
from dagq.messages import Event, TaskFinished, TaskStarted, encode_event, join_events
from dagq.stores.base import MAX_MESSAGE_BYTES, OutgoingMessage, Queues

log = logging.getLogger("dagq.worker")

_FRAMING = 8


@dataclass(slots=True)
class _Pending:
    event: Event
    encoded: bytes
    done: asyncio.Future[None] | None
    dropped: bool = False


class _Flusher:
    """Runs ``_flush`` in the background whenever woken; a failure is retried with backoff."""

    name = "dagq-flusher"

    def __init__(self) -> None:
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the background flusher (idempotent)."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=self.name)

    async def close(self) -> None:
        """Flush what is pending, then stop."""
        if self._task is None:
            return
        while self._has_pending():
            self._wake.set()
            await asyncio.sleep(0.01)
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        self._task = None

    async def _run(self) -> None:
        delay = 0.05
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                await self._flush()
            except DagqError as exc:
                log.warning("%s failed, retrying in %.2fs: %s", self.name, delay, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                self._wake.set()
                continue
            delay = 0.05

    def _has_pending(self) -> bool:
        raise NotImplementedError

    async def _flush(self) -> None:
        """Do the pending work; on failure, put it back and raise."""
        raise NotImplementedError


class Outbox(_Flusher):
    """Posts events to the completion queue in batches."""

    name = "dagq-outbox"

    def __init__(self, queues: Queues, queue: str) -> None:
        super().__init__()
        self._queues = queues
        self._queue = queue
        self._pending: list[_Pending] = []
        self._unsent_starts: dict[tuple[str, int, int], _Pending] = {}
        self.sent_messages = 0

    def post_nowait(self, event: Event) -> None:
        """Queue an event without waiting for it (for progress signals)."""
        pending = _Pending(event, encode_event(event), None)
        if isinstance(event, TaskStarted):
            self._unsent_starts[(event.workflow_id, event.task, event.attempt)] = pending
        self._pending.append(pending)
        self._wake.set()

    async def post(self, event: Event) -> None:
        """Queue an event and return once it is durably in the completion queue."""
        if isinstance(event, TaskFinished):
            # A 'started' not yet sent says nothing the 'finished' does not.
            start = self._unsent_starts.pop((event.workflow_id, event.task, event.attempt), None)
            if start is not None:
                start.dropped = True
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append(_Pending(event, encode_event(event), done))
        self._wake.set()
        await done

    def _has_pending(self) -> bool:
        return bool(self._pending)

    async def _flush(self) -> None:
        batch = [p for p in self._pending if not p.dropped]
        self._pending = []
        self._unsent_starts.clear()
        if not batch:
            return
        try:
            await self._send(batch)
        except DagqError:
            self._pending[:0] = batch
            raise
        for p in batch:
            if p.done is not None and not p.done.done():
                p.done.set_result(None)

    async def _send(self, batch: list[_Pending]) -> None:
        messages: list[OutgoingMessage] = []
        chunk: list[bytes] = []
        size = _FRAMING
        for p in batch:
            if chunk and size + len(p.encoded) > MAX_MESSAGE_BYTES:
                messages.append(OutgoingMessage(join_events(chunk)))
                chunk, size = [], _FRAMING
            chunk.append(p.encoded)
            size += len(p.encoded)
        if chunk:
            messages.append(OutgoingMessage(join_events(chunk)))
        await self._queues.send(self._queue, messages)
        self.sent_messages += len(messages)


class Deleter(_Flusher):
    """Deletes received messages in batches, per queue."""

    name = "dagq-deleter"

    def __init__(self, queues: Queues) -> None:
        super().__init__()
        self._queues = queues
        self._pending: dict[str, list[tuple[str, asyncio.Future[None]]]] = defaultdict(list)

    async def delete(self, queue: str, receipt: str) -> None:
        """Delete a message; returns once the delete was done (or found stale)."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending[queue].append((receipt, done))
        self._wake.set()
        await done

    def _has_pending(self) -> bool:
        return bool(self._pending)

    async def _flush(self) -> None:
        pending, self._pending = self._pending, defaultdict(list)
        for queue, items in list(pending.items()):
            try:
                await self._queues.delete(queue, [receipt for receipt, _ in items])
            except DagqError:
                for left, waiting in pending.items():
                    self._pending[left][:0] = waiting
                raise
            del pending[queue]
            for _, done in items:
                if not done.done():
                    done.set_result(None)
