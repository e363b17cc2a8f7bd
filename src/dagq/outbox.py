"""Batching for workers: completion events go out many to a message, and the task
messages they report on are deleted in the same write.

A worker finishing hundreds of tasks a second must not pay one queue round trip per
event. Callers ``await`` their event; a background flusher takes whatever has piled
up and commits it as one batch — the events (in as few messages as the size limit
allows), then the deletes of the task messages they report on — so a task message is
never deleted before its completion is durable (docs/architecture.md, invariant 5). Nothing is
dropped: a failed write is retried with backoff until it succeeds.

On a store billed per request a completion may wait a little (``linger_s``) for those
of the worker's other running tasks, so that one message carries many of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from dagq.errors import DagqError
from dagq.messages import Event, TaskFinished, TaskStarted, encode_event, join_events
from dagq.stores.base import MAX_MESSAGE_BYTES, OutgoingMessage, Store

log = logging.getLogger("dagq.worker")

_FRAMING = 8
#: How long progress-only events ('started') may wait for company: a task that ends
#: within it never sends one (its 'finished' says it all).
LINGER_S = 0.005
#: A lingering batch goes out at once when it holds this many events.
FULL_BATCH = 64


class Received(Protocol):
    """A received message to delete once its completion is out (its receipt may change)."""

    @property
    def queue(self) -> str: ...

    @property
    def receipt(self) -> str: ...


@dataclass(slots=True)
class _Pending:
    event: Event | None  # None: only the delete of ``ack``
    encoded: bytes
    done: asyncio.Future[None] | None
    ack: Received | None = None
    dropped: bool = False


class Outbox:
    """Posts events to the completion queue in batches, with the deletes they allow."""

    def __init__(
        self,
        store: Store,
        queue: str,
        *,
        linger_s: float = 0.0,
        expecting: Callable[[], bool] = lambda: False,
    ) -> None:
        """``expecting`` says whether more completions are about to come (tasks are
        running); while it does, a completion waits up to ``linger_s`` for company."""
        self._store = store
        self._queue = queue
        self._linger_s = linger_s
        self._expecting = expecting
        self._pending: list[_Pending] = []
        self._unsent_starts: dict[tuple[str, int, int], _Pending] = {}
        self._wake = asyncio.Event()
        self._urgent = asyncio.Event()
        self._posted = asyncio.Event()
        self._committing = False
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

    async def post(self, event: Event, *, ack: Received | None = None) -> None:
        """Queue an event (and the delete of ``ack``); return once both are durable."""
        if isinstance(event, TaskFinished):
            # A 'started' not yet sent says nothing the 'finished' does not.
            start = self._unsent_starts.pop((event.workflow_id, event.task, event.attempt), None)
            if start is not None:
                start.dropped = True
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append(_Pending(event, encode_event(event), done, ack))
        self._wake.set()
        self._urgent.set()
        self._posted.set()
        await done

    def acknowledge(self, ack: Received) -> None:
        """Delete ``ack`` with the next batch: after every event posted before."""
        self._pending.append(_Pending(None, b"", None, ack))
        self._wake.set()

    async def close(self) -> None:
        """Flush what is pending, then stop."""
        if self._task is None:
            return
        while self._pending or self._committing:  # never cancel a commit under way
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
            if not any(p.done for p in self._pending):
                self._urgent.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._urgent.wait(), LINGER_S)
            await self._linger()
            batch = [p for p in self._pending if not p.dropped]
            self._pending = []
            self._unsent_starts.clear()
            if not batch:
                continue
            self._committing = True
            try:
                await self._commit(batch)
            except DagqError as exc:
                log.warning(
                    "posting %d event(s) failed, retrying in %.2fs: %s", len(batch), delay, exc
                )
                self._pending[:0] = batch
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                self._wake.set()
                continue
            else:
                delay = 0.05
                for p in batch:
                    if p.done is not None and not p.done.done():
                        p.done.set_result(None)
            finally:
                self._committing = False

    async def _linger(self) -> None:
        """Wait (up to ``linger_s``) for more completions while more are coming."""
        if self._linger_s <= 0:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._linger_s
        while self._expecting() and len(self._pending) < FULL_BATCH:
            left = deadline - loop.time()
            if left <= 0:
                return
            self._posted.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._posted.wait(), left)

    async def _commit(self, batch: list[_Pending]) -> None:
        messages: list[OutgoingMessage] = []
        chunk: list[bytes] = []
        size = _FRAMING
        for p in batch:
            if p.event is None:
                continue
            if chunk and size + len(p.encoded) > MAX_MESSAGE_BYTES:
                messages.append(OutgoingMessage(join_events(chunk)))
                chunk, size = [], _FRAMING
            chunk.append(p.encoded)
            size += len(p.encoded)
        if chunk:
            messages.append(OutgoingMessage(join_events(chunk)))
        acks: dict[str, list[str]] = defaultdict(list)
        for p in batch:
            if p.ack is not None:
                acks[p.ack.queue].append(p.ack.receipt)
        writes = self._store.batch()
        if messages:
            writes.send(self._queue, messages)
        for queue, receipts in acks.items():
            writes.ack(queue, receipts)
        await writes.commit()
        self.sent_messages += len(messages)
