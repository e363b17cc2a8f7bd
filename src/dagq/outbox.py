"""Batching for workers: completion events go out many to a message, and the task
messages they report on are deleted in the same write.

A worker finishing hundreds of tasks a second must not pay one queue round trip per
event. Callers ``await`` their event; a background flusher takes whatever has piled
up and commits it as one batch — the events (in as few messages as the size limit
allows), then the deletes of the task messages they report on — so a task message is
never deleted before its completion is durable (docs/architecture.md, invariant 5).

One bad event never holds the others: a write that fails with a transient error (the
store is unreachable) is retried with backoff, but one that fails with a permanent
error (an event over the message size limit, say) is split until the culprit is
alone, and only its poster gets the error; the rest go out. A delete that finds its
message no longer held is retried with the current receipt if a heartbeat renewed it
meanwhile (under the lock the heartbeat holds while it renews, so never with a
receipt a renewal is replacing), else counted and logged: that task may run again.

On a store billed per request a completion may wait a little (``linger_s``) for those
of the worker's other running tasks, so that one message carries many of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Protocol

import msgspec

from dagq.errors import DagqError, MessageTooLarge, PermanentError, StoreUnavailable
from dagq.keys import COMPLETIONS_QUEUE
from dagq.messages import Event, TaskFinished, TaskStarted, encode_event, join_events
from dagq.stores.base import MAX_MESSAGE_BYTES, AckOp, OutgoingMessage, Store
from dagq.supervision import Supervisor

log = logging.getLogger("dagq.worker")

_FRAMING = 8
#: How long progress-only events ('started') may wait for company: a task that ends
#: within it never sends one (its 'finished' says it all).
LINGER_S = 0.005
#: A lingering batch goes out at once when it holds this many events.
FULL_BATCH = 64
#: Waits between tries of a batch that failed for a transient reason.
_FIRST_RETRY_S = 0.05
_MAX_RETRY_S = 5.0


class Received(Protocol):
    """A received message to delete once its completion is out (its receipt may change)."""

    @property
    def queue(self) -> str: ...

    @property
    def receipt(self) -> str: ...

    @property
    def lock(self) -> asyncio.Lock:
        """Held while the receipt is being renewed (and while it is used to delete)."""
        ...

    #: Set once the delete is committed: there is nothing left to renew.
    deleted: bool


class _Pending(msgspec.Struct):
    event: Event | None  # None: only the delete of ``ack``
    encoded: bytes
    done: asyncio.Future[None] | None
    ack: Received | None = None
    dropped: bool = False
    #: A 'started' goes out from then on (loop time), with company or alone.
    due: float = 0.0
    #: Out, or refused for good: never to be tried again.
    settled: bool = False


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
        self._supervisor: Supervisor | None = None
        self._delay = _FIRST_RETRY_S
        self.sent_messages = 0
        #: Deletes that found their message no longer held (its task may run again).
        self.lost_acks = 0
        #: Events refused for good (their posters were told).
        self.rejected = 0
        #: Events handed to the coordinator of this process rather than posted.
        self.handed_off = 0

    def start(self, supervisor: Supervisor | None = None) -> None:
        """Start the background flusher (idempotent); under ``supervisor`` if given,
        which restarts it should it ever fail."""
        if self._task is not None or self._supervisor is not None:
            return
        if supervisor is None:
            self._task = asyncio.create_task(self.run(), name="dagq-outbox")
        else:
            self._supervisor = supervisor
            supervisor.start("outbox", self.run, restart=True)

    def post_nowait(self, event: Event) -> None:
        """Queue an event without waiting for it (for progress signals)."""
        pending = _Pending(event, encode_event(event), None)
        if isinstance(event, TaskStarted):
            pending.due = asyncio.get_running_loop().time() + LINGER_S
            self._unsent_starts[(event.workflow_id, event.task, event.attempt)] = pending
        self._pending.append(pending)
        self._wake.set()

    async def post(self, event: Event, *, ack: Received | None = None) -> None:
        """Queue an event (and the delete of ``ack``); return once both are durable.

        Raises the error that refused it for good (a :class:`PermanentError`, or an
        unexpected one): then neither the event nor the delete went out.
        """
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

    async def close(self, timeout_s: float | None = None) -> None:
        """Flush what is pending, then stop.

        Within ``timeout_s`` (None: however long it takes); past it, what is not out
        stays unsent — its task messages are not deleted, so they come back — and its
        posters get :class:`StoreUnavailable`.
        """
        if self._task is None and self._supervisor is None:
            return
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        while self._pending or self._committing:  # never cancel a commit under way ...
            if deadline is not None and loop.time() >= deadline:  # ... unless it never ends
                log.warning(
                    "stopping with %d event(s) not posted: their tasks' messages stay in "
                    "the queue and will be delivered again",
                    sum(p.event is not None for p in self._pending) or 1,
                )
                break
            self._wake.set()
            await asyncio.sleep(0.01)
        if self._supervisor is not None:
            await self._supervisor.stop("outbox")
            self._supervisor = None
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        unsent, self._pending = self._pending, []
        for p in unsent:
            if p.done is not None and not p.done.done():
                p.done.set_exception(StoreUnavailable("the worker stopped before it was posted"))

    async def run(self) -> None:
        """The flusher: commit what piles up, until cancelled."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not any(p.done for p in self._pending):
                self._urgent.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._urgent.wait(), LINGER_S)
            await self._linger()
            batch = self._take_due()
            if not batch:
                continue
            self._committing = True
            unsent = batch
            try:
                unsent = await self._commit_contained(batch)
            finally:
                # Cancelled or failed unexpectedly: nothing taken from the queue is lost.
                self._pending[:0] = [p for p in unsent if not p.settled]
                self._committing = False
            if unsent:
                await asyncio.sleep(self._delay)
                self._delay = min(self._delay * 2, _MAX_RETRY_S)
                self._wake.set()
            else:
                self._delay = _FIRST_RETRY_S

    def _take_due(self) -> list[_Pending]:
        """What goes out now: all but the 'started' events of tasks still within
        ``LINGER_S`` of their start, which wait (another task's completion going out
        does not take them along: a task that ends within it never sends one, and each
        one sent costs the coordinator a state write of its own)."""
        now = asyncio.get_running_loop().time()
        batch: list[_Pending] = []
        waiting: list[_Pending] = []
        for p in self._pending:
            if not p.dropped:
                (waiting if p.due > now else batch).append(p)
        self._pending = waiting
        if waiting:  # the flusher looks again once they are due
            self._wake.set()
            for p in batch:
                if isinstance(p.event, TaskStarted):
                    e = p.event
                    self._unsent_starts.pop((e.workflow_id, e.task, e.attempt), None)
        else:
            self._unsent_starts.clear()
        return batch

    async def _commit_contained(self, batch: list[_Pending]) -> list[_Pending]:
        """Commit ``batch``, isolating what is refused for good; what is left unsent by
        a transient failure (to be tried again), in order."""
        groups = [[p for p in batch if not self._oversized(p)]]
        while groups:
            group = groups.pop(0)
            if not group:
                continue
            try:
                await self._commit(group)
            except PermanentError as exc:
                self._isolate(group, exc, groups)
                continue
            except DagqError as exc:  # transient: the whole rest is tried again
                left = group + [p for g in groups for p in g]
                log.warning(
                    "posting %d event(s) failed, retrying in %.2fs: %s",
                    sum(p.event is not None for p in left),
                    self._delay,
                    exc,
                )
                return left
            except Exception as exc:  # a bug or an untranslated error: contain it too
                log.error("posting %d event(s) failed unexpectedly", len(group), exc_info=exc)
                self._isolate(group, exc, groups)
                continue
            for p in group:
                p.settled = True
                if p.done is not None and not p.done.done():
                    p.done.set_result(None)
        return []

    def _isolate(self, group: list[_Pending], exc: Exception, groups: list[list[_Pending]]) -> None:
        """A group was refused for good: split it (in order) until the culprit is alone."""
        if len(group) > 1:
            half = len(group) // 2
            groups[:0] = [group[:half], group[half:]]
        else:
            self._reject(group[0], exc)

    def _oversized(self, p: _Pending) -> bool:
        """Refuse at once an event no message can carry (it would fail every batch)."""
        if len(p.encoded) + _FRAMING <= MAX_MESSAGE_BYTES:
            return False
        self._reject(
            p,
            MessageTooLarge(
                f"an event of {len(p.encoded)} bytes is over the {MAX_MESSAGE_BYTES}-byte "
                "message limit"
            ),
        )
        return True

    def _reject(self, p: _Pending, exc: Exception) -> None:
        p.settled = True
        self.rejected += 1
        what = _describe(p.event)
        if p.done is not None and not p.done.done():
            log.warning("%s was refused: %s", what, exc)
            p.done.set_exception(exc)
        else:  # nobody waits for it: a progress event, or a bare delete
            log.warning("%s was dropped: %s", what, exc)

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
        if await self._hand_off(batch):
            return
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
        held, receipts, acks = _acks_by_queue(batch)
        writes = self._store.batch()
        if messages:
            writes.send(self._queue, messages)
        ops = [op for queue, rs in acks.items() if (op := writes.ack(queue, rs)) is not None]
        await writes.commit()
        self.sent_messages += len(messages)
        if held:
            await self._settle_acks(held, receipts, ops)

    async def _hand_off(self, batch: list[_Pending]) -> bool:
        """Give the batch to the coordinator of this process, if one takes it: its
        events then never go through the queue, and the task messages they report on
        are deleted in the commit that applies them (docs/architecture.md, "Hand-off").
        Whether it was committed so; if not, nothing of it was written."""
        handoff = self._store.handoff
        events = [p.event for p in batch if p.event is not None]
        if handoff is None or not events or self._queue != COMPLETIONS_QUEUE:
            return False
        held, receipts, acks = _acks_by_queue(batch)
        taken = handoff.deliver(events, acks)
        if taken is None:
            return False
        ops = await taken
        if ops is None:
            return False
        self.handed_off += len(events)
        if held:
            await self._settle_acks(held, receipts, ops)
        return True

    async def _settle_acks(
        self, held: list[Received], receipts: list[str], ops: list[AckOp]
    ) -> None:
        """After a commit: retry the deletes whose receipt a heartbeat renewed while they
        were on their way (the store ignored them), and count those that found their
        message gone for good."""
        missing = {op.queue: len(op.receipts) - sum(op.deleted) for op in ops if op.deleted}
        for ack, receipt in zip(held, receipts, strict=True):
            if missing.get(ack.queue, 0) <= 0:
                ack.deleted = True
                continue
            # A renewal under way ends first; if it replaced the receipt this delete
            # used, the store ignored the delete: try again with the current one.
            async with ack.lock:
                if ack.receipt != receipt and await self._delete(ack):
                    missing[ack.queue] -= 1
                ack.deleted = True
        for queue, lost in missing.items():
            if lost > 0:
                self.lost_acks += lost
                log.warning(
                    "%d finished task message(s) on %r were no longer held when deleted "
                    "(a heartbeat came too late): they may run again",
                    lost,
                    queue,
                )

    async def _delete(self, ack: Received) -> bool:
        try:
            return await self._store.queues.delete(ack.queue, [ack.receipt]) > 0
        except DagqError as exc:
            log.warning("deleting a finished task message failed: %s", exc)
            return False


def _describe(event: Event | None) -> str:
    if event is None:
        return "the delete of a finished task message"
    task = getattr(event, "task", "?")
    attempt = getattr(event, "attempt", "?")
    return f"the {type(event).__name__} event of {event.workflow_id}/{task}/{attempt}"


def _acks_by_queue(
    batch: list[_Pending],
) -> tuple[list[Received], list[str], dict[str, list[str]]]:
    """The batch's held task messages, their receipts as read now (a heartbeat may renew
    them while the commit is on its way), and those receipts grouped by queue."""
    held = [p.ack for p in batch if p.ack is not None]
    receipts = [ack.receipt for ack in held]
    acks: dict[str, list[str]] = {}
    for ack, receipt in zip(held, receipts, strict=True):
        acks.setdefault(ack.queue, []).append(receipt)
    return held, receipts, acks
