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


class Outbox:
    """Posts events to the completion queue in batches."""

    def __init__(self, queues: Queues, queue: str) -> None:
        self._queues = queues
        self._queue = queue
        self._pending: list[_Pending] = []
        self._unsent_starts: dict[tuple[str, int, int], _Pending] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.sent_messages = 0

    def start(self) -> None:
        """Start the background flusher (idempotent)."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="dagq-outbox")

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

    async def close(self) -> None:
        """Send what is pending, then stop the flusher."""
        if self._task is None:
            return
        while self._pending:
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
            batch = [p for p in self._pending if not p.dropped]
            self._pending = []
            self._unsent_starts.clear()
            if not batch:
                continue
            try:
                await self._send(batch)
            except DagqError as exc:
                log.warning(
                    "posting %d event(s) failed, retrying in %.2fs: %s", len(batch), delay, exc
                )
                self._pending[:0] = batch
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                self._wake.set()
                continue
            delay = 0.05
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


class Deleter:
    """Deletes received messages in batches, per queue."""

    def __init__(self, queues: Queues) -> None:
        self._queues = queues
        self._pending: dict[str, list[tuple[str, asyncio.Future[None]]]] = defaultdict(list)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the background deleter (idempotent)."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="dagq-deleter")

    async def delete(self, queue: str, receipt: str) -> None:
        """Delete a message; returns once the delete was done (or found stale)."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending[queue].append((receipt, done))
        self._wake.set()
        await done

    async def close(self) -> None:
        """Finish pending deletes, then stop."""
        if self._task is None:
            return
        while self._pending:
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
            pending, self._pending = self._pending, defaultdict(list)
            for queue, items in pending.items():
                try:
                    await self._queues.delete(queue, [receipt for receipt, _ in items])
                except DagqError as exc:
                    log.warning("deleting %d message(s) failed, retrying: %s", len(items), exc)
                    self._pending[queue].extend(items)
                    self._wake.set()
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 5.0)
                    continue
                delay = 0.05
                for _, done in items:
                    if not done.done():
                        done.set_result(None)
