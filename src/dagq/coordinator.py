"""The coordinator: the only writer of runtime state, one per store (by lease).

Each step drains a batch of events from the completion queue, groups them by
workflow, applies them to a cached working copy of each state, writes each touched
state ONCE under compare-and-swap, sends the task messages that became ready, writes
the index row, and only then acknowledges the events (docs/architecture.md §1, invariants 2-5).
Periodic sweeps handle what no event announces: timeouts, deadlines, lost sends and
workflows whose submit event was lost.

Containment (docs/architecture.md §9): the work on each workflow runs inside the
boundary of :mod:`dagq.containment`; a workflow whose work fails for good is
quarantined alone (:mod:`dagq.quarantine`) and its events kept, so the messages that
also carried other workflows' events are acknowledged. Transient store errors are
retried with backoff. Every write and acknowledgement is fenced by the lease
(:meth:`dagq.leasing.LeaseKeeper.check`, and inside the commit where the store can);
the lease keeper runs under a :class:`~dagq.supervision.Supervisor`. Working copies
are held in a bounded cache (:mod:`dagq.cache`).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import time
from collections import OrderedDict, defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from dagq import garbage, keys, machine, payloads, quarantine, switching
from dagq.cache import Entry, WorkflowCache
from dagq.compiled import PLANS, plan_of
from dagq.containment import Held, WorkflowFault, step
from dagq.dispatching import Outgoing, SharedInputs, bundle, bundle_sends, task_message
from dagq.errors import ConflictError, DagqError, DamagedData, LeaseLost, TransientError
from dagq.history import stage_chunk
from dagq.leasing import LeaseKeeper
from dagq.messages import (
    Event,
    RetryRequested,
    SignalSent,
    SubmitRequested,
    TaskFinished,
    TaskStarted,
    decode_events,
)
from dagq.observability.context import Concern, concerning
from dagq.observability.runs import RunTelemetry
from dagq.offload import Offload, heavy
from dagq.persistence import (
    OFF_LOOP_BYTES,
    Staged,
    Stored,
    create_state,
    off_loop,
    read_state,
    stage_state,
)
from dagq.persistence import settle as settle_state
from dagq.plan import Plan
from dagq.preloads import Preloads
from dagq.state import (
    UNDO_SENT,
    UNSET,
    WORKFLOW_ACTIVE,
    WORKFLOW_TERMINAL,
    RunState,
    TaskStatus,
    dispatch_key,
)
from dagq.stores.base import (
    AckOp,
    Batch,
    BatchOp,
    Document,
    IndexRow,
    Message,
    OutgoingMessage,
    PutOp,
    Store,
    get_many,
    takes_handoff,
    wakes_across_processes,
)
from dagq.submitted import (
    FIRST_STATE_HANDED,
    Created,
    decode_outline,
    decode_outlined,
    load_submitted,
)
from dagq.supervision import BackgroundFailed, Supervisor

__all__ = ["Coordinator", "CoordinatorOptions", "Entry", "Stats"]

log = logging.getLogger("dagq.coordinator")

_CAS_ATTEMPTS = 8
#: New workflows given by submits in this process and not loaded yet, kept at most
#: (:class:`~dagq.preloads.Preloads`: one whose state is not written is never dropped).
_PRELOADED = 4096
_FIRST_POLL_S = 0.005
#: The first poll where a send in another process wakes the wait too (the poll is
#: only a fallback then; see the worker's).
_WOKEN_FIRST_POLL_S = 0.05
#: Waits after a store error: doubling from the first, up to the last, reset on success.
_FIRST_BACKOFF_S = 0.5
#: While completions are handed over in this process, the completion queue (where
#: workers elsewhere post) is still received from at least this often (on a store
#: billed per request, which bundles task messages: as often as it is polled).
_QUEUE_TURN_S = 0.05
_MAX_BACKOFF_S = 10.0
#: New workflows whose documents one request reads at most (three documents each).
_READ_TOGETHER = 100


@dataclass(frozen=True, kw_only=True)
class CoordinatorOptions:
    """How the coordinator paces itself. Defaults suit a production store."""

    batch_size: int = 512
    #: How long a step may wait for more completions before it commits, while the
    #: workflows its events concern have other tasks in flight and completions come
    #: more than one at a time (a lone completion, as in a chain, never waits): one
    #: commit then carries many (docs/architecture.md, "Batching"). 0: never wait.
    linger_s: float = 0.005
    event_visibility_s: float = 15.0
    lease_ttl_s: float = 30.0
    sweep_interval_s: float = 1.0
    #: Longest sleep between polls of the completion queue when idle (the first are
    #: shorter, doubling from a few milliseconds, or from 50 ms where a send in another
    #: process wakes the wait too); in one process a send wakes it at once.
    poll_interval_s: float = 0.5
    rescan_interval_s: float = 30.0
    repair_grace_s: float = 5.0
    #: How long after its sends went out a state that lists them as unconfirmed is
    #: rewritten by a sweep to say they went out, when no event of the workflow has
    #: rewritten it meanwhile. Only a restart within it re-sends them (a duplicate the
    #: workers run as any redelivery); on a store that bills each write, a chain's
    #: steps and many small workflows do not pay a second state write per task.
    confirm_after_s: float = 5.0
    timeout_grace_s: float = 30.0
    cancel_grace_s: float = 30.0
    abandoned_submit_s: float = 600.0
    #: The most workflow states held in memory, active ones included (least recently
    #: used evicted first; an evicted one is read again when an event or sweep needs it).
    cache_size: int = 2000
    concurrency: int = 16
    #: Task messages per queue message (a bundle) when many go out at once; None: the
    #: store's choice (``queues.bundle_size``: 1 on memory and sqlite, 32 on azure).
    bundle_size: int | None = None
    #: A workflow's index row (status, counts) is rewritten when its status changes,
    #: and otherwise at most this often while its counts move.
    index_interval_s: float = 1.0
    #: While it runs, the process's GIL switch interval is at most this (seconds): the
    #: longest the loop waits for the GIL at each hand-over while a heavy step, a large
    #: decode or a store call runs in a thread (:mod:`dagq.switching`). None: unchanged.
    switch_interval_s: float | None = None

    def __post_init__(self) -> None:
        switching.check(self.switch_interval_s)


class _Swept(msgspec.Struct, frozen=True):
    """A light workflow's sweep, staged: its writes, and what to do once they commit."""

    entry: Entry
    ops: list[BatchOp]
    flush: _Flush | None
    #: Its index row alone is among the writes (no state was staged).
    indexed: bool


class _Flush(msgspec.Struct, frozen=True):
    """A workflow's writes staged in a batch, and what to do once it commits."""

    entry: Entry
    staged: Staged
    dispatched: int
    finished: bool
    indexed: bool
    #: Where this workflow's etags start among the batch's (several share a batch).
    offset: int = 0
    #: The task messages staged (kept only while tracing is on: their send spans), and when.
    outgoing: tuple[Outgoing, ...] = ()
    staged_at: float = 0.0
    #: The lists of messages the batch sends, let go of in a thread once committed.
    sent: tuple[list[OutgoingMessage], ...] = ()


class _Delivery(msgspec.Struct):
    """Completions a worker of this process handed over (:meth:`Coordinator.deliver`)."""

    events: list[Event]
    #: The receipts of the task messages they report on, by queue.
    acks: dict[str, list[str]]
    done: asyncio.Future[list[AckOp] | None]


def _decline(deliveries: Iterable[_Delivery]) -> None:
    """Not committed: their workers post them to the completion queue instead."""
    for d in deliveries:
        if not d.done.done():
            d.done.set_result(None)


class Stats(msgspec.Struct):
    """Running totals, for logs and benchmarks."""

    events: int = 0
    flushes: int = 0
    conflicts: int = 0
    dispatched: int = 0
    finished_workflows: int = 0
    quarantined: int = 0
    rereads: int = 0


class Coordinator:
    """Advances every workflow of one store."""

    def __init__(
        self,
        store: Store,
        options: CoordinatorOptions | None = None,
        *,
        owner: str | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.store = store
        self.options = options or CoordinatorOptions()
        self._bundle_size: int = self.options.bundle_size or store.queues.bundle_size
        billed = store.queues.bundle_size > 1
        self._queue_turn = max(_QUEUE_TURN_S, self.options.poll_interval_s if billed else 0.0)
        self.clock = clock or time.time
        self.lease = LeaseKeeper(
            store, keys.COORDINATOR_LEASE, ttl_s=self.options.lease_ttl_s, owner=owner
        )
        self.stats = Stats()
        self.changed = asyncio.Event()
        #: Set when a flush ends a workflow (``changed`` is set by every flush).
        self.ended = asyncio.Event()
        #: Large workflows' steps run in threads; readers wait for them (:mod:`dagq.offload`).
        self.offload = Offload()
        self._cache = WorkflowCache(self.options.cache_size, due=self._due, busy=self.offload.busy)
        self._plans: OrderedDict[str, Plan] = OrderedDict()
        #: Workflows this coordinator quarantined or found quarantined, with the reason.
        self._quarantined: dict[str, str] = {}
        #: New workflows as their submits in this process stored them (``preload``).
        self._preloaded = Preloads(_PRELOADED)
        self._next_sweep = 0.0
        self._backoff = _FIRST_BACKOFF_S
        self._stop = asyncio.Event()  # run() sets the real one
        #: Events a dead predecessor received stay invisible for the event visibility
        #: timeout: no repair before they are back (they may say a task already ran).
        self._repairs_from = self.clock() + self.options.event_visibility_s + 1.0
        self._next_rescan = 0.0
        self._poll_delay = self._first_poll()
        self.telemetry = RunTelemetry(store.url)
        self._last_ids: Iterable[str] = ()
        #: Events the previous step handled (more than one: completions come in company).
        self._last_events = 0
        #: Completions handed over by workers of this process, not yet taken by a step.
        self._inbox: list[_Delivery] = []
        #: Resolved by the next delivery (a wait for events waits for it too).
        self._arrival: asyncio.Future[None] | None = None
        #: The completion queue is owed a receive (a send announced, a full batch) ...
        self._queue_due = True
        #: ... and gets one by this time (monotonic) even while deliveries keep coming.
        self._queue_by = 0.0

    # --- running --------------------------------------------------------------------

    async def run(self, stop: asyncio.Event, *, break_lease: bool = False) -> None:
        """Hold the lease and advance workflows until ``stop`` is set.

        Raises LeaseLost when the lease was lost (or may have expired), and
        BackgroundFailed when the lease keeper died: either way nothing more is written.
        """
        await self.lease.acquire(force=break_lease)
        log.info("coordinator %s holds the lease on %s", self.lease.owner, self.store.url)
        # A new term: whatever was cached may have been advanced by another holder since.
        self._cache.clear()
        self._next_rescan = 0.0
        self._repairs_from = self.clock() + self.options.event_visibility_s + 1.0
        self._stop = stop
        supervisor = Supervisor("coordinator")
        supervisor.start("lease-keeper", self.lease.keep, restart=False)
        self.offload.start()
        if takes_handoff(self.store.committer):
            self.store.handoff = self  # workers here hand completions over (deliver)
        garbage.settle()
        switching.lower(self.options.switch_interval_s)
        # The last wait ended before its poll was due: a send in this process announced
        # what the step after it found, and the polls (for sends elsewhere) need not
        # quicken for it (on a store that bills receives, they found nothing mostly).
        announced = False
        # One wait for the stop, shared by every idle wait (not a task made and
        # cancelled at each one).
        stopping = asyncio.ensure_future(stop.wait())
        try:
            while not stop.is_set():
                supervisor.check()
                self.lease.check()
                handled = await self._guarded(self.step)
                if self.clock() >= self._next_sweep:
                    await self._guarded(self.sweep)
                if handled >= self.options.batch_size:
                    self._poll_delay = self._first_poll()
                    continue  # a full batch: there may be more waiting
                if handled and not announced:
                    self._poll_delay = self._first_poll()
                # The wait returns at once if an event arrived since the receive.
                announced = await self._idle(stopping)
                if not handled and not announced:
                    self._poll_delay = min(self._poll_delay * 2, self.options.poll_interval_s)
        finally:
            stopping.cancel()
            switching.restore(self.options.switch_interval_s)
            if self.store.handoff is self:
                self.store.handoff = None
            inbox, self._inbox = self._inbox, []
            _decline(inbox)
            self._preloaded.clear()
            self.offload.close()
            await supervisor.close()
            await self.lease.release()

    def deliver(
        self, events: list[Event], acks: dict[str, list[str]]
    ) -> asyncio.Future[list[AckOp] | None] | None:
        """Take completions from a worker of this process (the store's ``handoff``):
        they are applied with the next step, and the task messages they report on are
        deleted in its commit. The future: the acks once committed, or None (nothing
        of it written: the worker posts them). None: not coordinating now."""
        if self.store.handoff is not self or self._stop.is_set():
            return None
        done: asyncio.Future[list[AckOp] | None] = asyncio.get_running_loop().create_future()
        self._inbox.append(_Delivery(events, acks, done))
        if self._arrival is not None and not self._arrival.done():
            self._arrival.set_result(None)
        return done

    def preload(self, created: Created) -> bool:
        """Keep a new workflow as its submit in this process stored it (see
        :class:`~dagq.stores.base.Handoff`): its first load reads nothing."""
        workflow_id = created.submitted.workflow_id
        if self.store.handoff is not self or self._stop.is_set():
            return False
        if workflow_id in self._cache:  # read already (a rescan got there first): kept
            return False  # as read; this copy, used after an eviction, would be stale
        # Full of copies whose states are not written (a loop of submits while a
        # step is busy): declined, its submit writes the state (none of those may go).
        return self._preloaded.keep(created)

    def status_of(self, workflow_id: str) -> str | None:
        """The status of the working copy held here (see
        :class:`~dagq.stores.base.Handoff`): what a waiter in this process goes by
        before it reads the store."""
        if self.store.handoff is not self or self._stop.is_set():
            return None
        if workflow_id in self._quarantined:
            return None
        entry = self._cache.peek(workflow_id)
        return None if entry is None else entry.state.status

    def ended_run(self, workflow_id: str) -> tuple[str, Plan, RunState] | None:
        """A run held here whose end is committed (see :class:`~dagq.stores.base.Handoff`):
        its terminal state was written, and its index row after it, by this coordinator."""
        if self.store.handoff is not self or self._stop.is_set():
            return None
        if workflow_id in self._quarantined or self.offload.busy(workflow_id):
            return None
        entry = self._cache.peek(workflow_id)
        if entry is None:
            return None
        st = entry.state
        if st.status not in WORKFLOW_TERMINAL or entry.indexed_status != st.status or st.dirty:
            return None
        return entry.name, entry.plan, st

    def _decline(self, deliveries: list[_Delivery]) -> None:
        """Not committed: posted by their workers (submits) instead. A declined submit's
        copy goes too, if not loaded yet: its submit writes the state before it posts
        the wake-up, or, that failing as well, a rescan does (which passes a workflow
        by while a copy of it is kept)."""
        for delivery in deliveries:
            if delivery.done.done():
                continue
            for event in delivery.events:
                if isinstance(event, SubmitRequested):
                    self._preloaded.take(event.workflow_id)
        _decline(deliveries)

    def _arrived(self) -> asyncio.Future[None]:
        """A future the next delivery resolves (at once if one is waiting)."""
        arrival = asyncio.get_running_loop().create_future()
        if self._inbox:
            arrival.set_result(None)
        self._arrival = arrival
        return arrival

    def _first_poll(self) -> float:
        woken = wakes_across_processes(self.store.queues)
        return min(_WOKEN_FIRST_POLL_S if woken else _FIRST_POLL_S, self.options.poll_interval_s)

    async def _guarded(self, work: Callable[[], Awaitable[int]]) -> int:
        """Run one unit of work; a store outage (or a surprise outside any one
        workflow's work) is logged and retried with backoff, never fatal."""
        try:
            result = await work()
        except (LeaseLost, BackgroundFailed):
            raise
        except Exception as exc:
            delay = self._backoff
            self._backoff = min(delay * 2, _MAX_BACKOFF_S)
            if isinstance(exc, DagqError):
                log.warning("store error, retrying in %.1fs: %s", delay, exc)
            else:
                log.error("unexpected error, retrying in %.1fs", delay, exc_info=exc)
            # Events received but not applied come back after their visibility timeout.
            self._defer_repairs()
            with contextlib.suppress(TimeoutError):  # a stop cuts the wait short
                await asyncio.wait_for(self._stop.wait(), delay)
            return 0
        if self._backoff != _FIRST_BACKOFF_S:
            log.info("store reachable again")
            self._backoff = _FIRST_BACKOFF_S
        return int(result or 0)

    async def _idle(self, stopping: asyncio.Future[Any]) -> bool:
        """Wait for an event, a stop, the next poll or sweep; whether it ended well
        before its time (a send in this process, most likely)."""
        if self._inbox:
            return True
        timeout = max(0.0, min(self._next_sweep - self.clock(), self._poll_delay))
        loop = asyncio.get_running_loop()
        due = loop.time() + 0.9 * timeout
        waiter = asyncio.ensure_future(self.store.queues.wait(keys.COMPLETIONS_QUEUE, timeout))
        arrival = self._arrived()
        waits: set[asyncio.Future[Any]] = {waiter, stopping, arrival}
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        if waiter.done():  # a send (or the poll): the queue's turn
            self._queue_due = True
        waiter.cancel()
        arrival.cancel()
        self._arrival = None
        return loop.time() < due

    async def _commit(self, batch: Batch) -> list[str]:
        """Commit a batch, fenced by the lease: checked here, and inside the commit
        where the store can (a holder that lost the lease writes nothing)."""
        if not batch.ops:
            return []
        self.lease.check()
        if self.lease.lease is not None:
            batch.fence(self.lease.lease)
        bundle_sends(batch.ops, self._bundle_size)  # many workflows' tasks: few messages
        return await batch.commit()

    async def step(self) -> int:
        """Drain one batch of events (handed over, received) and advance the workflows
        they concern."""
        local = self._take_inbox()
        try:
            messages = await self._receive(bool(local))
            if not messages and not local:
                return 0
            started = self.clock()
            received = await self._decode_all(messages)
            received = await self._linger(received, local)
            try:
                return await self._handle(received, local)
            finally:
                self.telemetry.batch(
                    len(received) + len(local), list(self._last_ids), started, self.clock()
                )
        finally:
            self._decline(local)  # not committed (a failure, the lease lost): posted instead

    def _take_inbox(self) -> list[_Delivery]:
        """The hand-overs this step takes: the oldest, up to ``batch_size`` events (a
        loop of submits in this process may hand over thousands meanwhile); the rest
        wait for the next step, which comes at once (:meth:`_arrived`)."""
        events = taken = 0
        for delivery in self._inbox:
            if events >= self.options.batch_size:
                break
            events += len(delivery.events)
            taken += 1
        local, self._inbox = self._inbox[:taken], self._inbox[taken:]
        return local

    async def _receive(self, handed: bool) -> list[Message]:
        """Receive from the completion queue, unless this step has handed-over events
        and the queue is not owed a receive (no send announced since the last, and its
        turn not due): a receive that finds nothing still costs a store round trip."""
        now = time.monotonic()
        if handed and not self._queue_due and now < self._queue_by:
            return []
        self._queue_due = False
        self._queue_by = now + self._queue_turn
        messages = await self.store.queues.receive(
            keys.COMPLETIONS_QUEUE,
            max_messages=self.options.batch_size,
            visibility_timeout_s=self.options.event_visibility_s,
        )
        self._queue_due = len(messages) >= self.options.batch_size
        return messages

    async def _decode_all(self, messages: list[Message]) -> list[tuple[Message, list[Event]]]:
        """The events of each message (an unreadable one is dead-lettered and left out)."""
        decoded = []
        for message in messages:
            events = await self._decode(message)
            if events is not None:
                decoded.append((message, events))
        return decoded

    async def _linger(
        self, received: list[tuple[Message, list[Event]]], local: list[_Delivery]
    ) -> list[tuple[Message, list[Event]]]:
        """Wait up to ``linger_s`` for more completions while more are due (see
        :meth:`_expecting`), so that one commit carries them all: received (returned)
        or handed over (added to ``local``)."""
        linger = self.options.linger_s
        if linger <= 0:
            return received
        loop = asyncio.get_running_loop()
        deadline = loop.time() + linger
        while len(received) + len(local) < self.options.batch_size and self._expecting(
            received, local
        ):
            left = deadline - loop.time()
            if left <= 0:
                break
            waiter = asyncio.ensure_future(self.store.queues.wait(keys.COMPLETIONS_QUEUE, left))
            arrival = self._arrived()
            waits: set[asyncio.Future[Any]] = {waiter, arrival}
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            announced = waiter.done()
            waiter.cancel()
            arrival.cancel()
            self._arrival = None
            local += self._inbox
            self._inbox = []
            if not announced:  # a hand-over: the queue was not announced
                continue
            more = await self.store.queues.receive(
                keys.COMPLETIONS_QUEUE,
                max_messages=self.options.batch_size - len(received),
                visibility_timeout_s=self.options.event_visibility_s,
            )
            received += await self._decode_all(more)
        return received

    def _expecting(
        self, received: list[tuple[Message, list[Event]]], local: list[_Delivery]
    ) -> bool:
        """Are more completions due soon for the workflows these events concern? Only
        if completions come in company (this batch or the last had more than one
        event: a chain's lone completion never waits) and one of those workflows has
        tasks in flight beyond the ones finishing here."""
        batches = [e for _, e in received] + [d.events for d in local]
        events = sum(len(e) for e in batches)
        if events < 2 and self._last_events < 2:
            return False
        finishing: dict[str, int] = defaultdict(int)
        for batch in batches:
            for event in batch:
                if isinstance(event, TaskFinished):
                    finishing[event.workflow_id] += 1
        for workflow_id, n in finishing.items():
            entry = self._cache.peek(workflow_id)
            if entry is not None and entry.state.in_flight > n:
                return True
        return False

    async def _handle(
        self, received: list[tuple[Message, list[Event]]], local: list[_Delivery]
    ) -> int:
        grouped: dict[str, list[Event]] = defaultdict(list)
        touched: list[tuple[Message, set[str]]] = []
        for message, events in received:
            for event in events:
                grouped[event.workflow_id].append(event)
            touched.append((message, {e.workflow_id for e in events}))
        queued = {k: list(v) for k, v in grouped.items()} if local else grouped
        for delivery in local:
            for event in delivery.events:
                grouped[event.workflow_id].append(event)
        self._last_ids = grouped.keys()
        self._last_events = sum(len(v) for v in grouped.values())
        self.stats.events += self._last_events
        if await self._advance_together(grouped, [m.receipt for m, _ in touched], local):
            return len(received) + len(local)
        # One write for the whole batch failed (a lost race, an outage): go one by one;
        # what was handed over is posted by its workers instead (step declines it).
        if not received:
            return len(local)
        outcome = await self._advance_all(queued)
        done = [m.receipt for m, ids in touched if all(outcome[i] for i in ids)]
        if done:
            self.lease.check()
            await self.store.queues.delete(keys.COMPLETIONS_QUEUE, done)
        return len(received)

    async def _advance_together(
        self,
        grouped: dict[str, list[Event]],
        receipts: list[str],
        local: list[_Delivery],
    ) -> bool:
        """Apply a batch's events to every workflow, then commit all writes and acks at once
        (the deletes of handed-over events' task messages among them: each delivery is
        told its own once committed).

        On a transactional store this is one transaction per batch; False means it failed
        and nothing may be assumed written (the cached copies are dropped). A workflow
        whose own work fails is quarantined within the same batch, its events kept.
        """
        ids = list(grouped)
        # Load the workflows not held here concurrently: a task for each only where two
        # or more are missing (a batch of held ones, the usual case, creates none).
        missing = [i for i in ids if i not in self._cache]
        if len(missing) > 1:
            await self._prefetch_all(missing)
        with garbage.young_only(self._heavy(ids)):
            return await self._advance_loaded(grouped, receipts, local)

    async def _advance_loaded(
        self,
        grouped: dict[str, list[Event]],
        receipts: list[str],
        local: list[_Delivery],
    ) -> bool:
        ids = list(grouped)
        now = self.clock()
        batch = self.store.batch()
        flushes: list[_Flush] = []
        puts = 0
        try:
            for workflow_id in ids:
                own = self.store.batch()  # merged only once its work has succeeded
                flush = await self._prepare(own, workflow_id, grouped[workflow_id], now)
                if flush is not None:
                    flushes.append(msgspec.structs.replace(flush, offset=puts))
                puts += sum(isinstance(op, PutOp) for op in own.ops)
                batch.ops.extend(own.ops)
            batch.ack(keys.COMPLETIONS_QUEUE, receipts)
            acks = [  # after the states, as a worker's would be after its post
                [batch.ack(queue, rs) for queue, rs in delivery.acks.items()] for delivery in local
            ]
            etags = await self._commit(batch)
        except LeaseLost:
            raise
        except Exception as exc:  # whatever it was, one workflow's own commit tells
            if isinstance(exc, ConflictError):
                self.stats.conflicts += 1
            else:
                log.warning("writing a batch failed, retrying one workflow at a time: %s", exc)
            for workflow_id in ids:
                self._evict(workflow_id)
            return False
        for delivery, ops in zip(local, acks, strict=True):  # committed: said at once
            delivery.done.set_result([op for op in ops if op is not None])
        for flush in flushes:
            await self._settle_contained(flush, etags)
        return True

    def _heavy(self, ids: Iterable[str]) -> bool:
        """Is any of these (cached) workflows heavy (:func:`dagq.offload.heavy`)?"""
        entries = (self._cache.peek(i) for i in ids)
        return any(e is not None and heavy(e.plan, e.state) for e in entries)

    async def _prefetch_all(self, missing: list[str]) -> None:
        """Load workflows ahead of their turn. Where the store reads many documents in
        one request, the definitions, quarantine records and state headers of those not
        handed over are read together (one round trip for a step's new workflows, not
        one each; a loop of submits from another process brings hundreds)."""
        found: dict[str, Sequence[Document | None]] = {}
        if getattr(self.store.documents, "get_many", None) is not None:
            unread = [i for i in missing if i not in self._preloaded]
            for at in range(0, len(unread), _READ_TOGETHER):
                some = unread[at : at + _READ_TOGETHER]
                with contextlib.suppress(Exception):  # shows again when each is used
                    docs = await get_many(self.store.documents, _load_keys(some))
                    found.update((i, docs[3 * n : 3 * n + 3]) for n, i in enumerate(some))
        await asyncio.gather(*(self._prefetch(i, found.get(i)) for i in missing))

    async def _prefetch(
        self, workflow_id: str, found: Sequence[Document | None] | None = None
    ) -> None:
        """Load a workflow ahead of its turn; a failure shows again when it is used."""
        with contextlib.suppress(Exception):
            await self._entry(workflow_id, found)

    async def _decode(self, message: Message) -> list[Event] | None:
        try:
            return decode_events(message.body)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.error("unreadable completion message %s dead-lettered: %s", message.id, exc)
            self.lease.check()
            await self.store.queues.dead_letter(
                keys.COMPLETIONS_QUEUE, message.receipt, f"cannot be parsed: {exc}"
            )
            return None

    async def _advance_all(self, grouped: dict[str, list[Event]]) -> dict[str, bool]:
        ids = list(grouped)
        outcome: dict[str, bool] = {}
        width = self.options.concurrency
        for start in range(0, len(ids), width):
            chunk = ids[start : start + width]
            results = await asyncio.gather(*(self.advance(i, grouped[i]) for i in chunk))
            outcome.update(zip(chunk, results, strict=True))
        return outcome

    # --- advancing one workflow ------------------------------------------------------

    async def advance(self, workflow_id: str, events: list[Event]) -> bool:
        """Apply events to one workflow and make the result durable; False to retry later.

        True also when the events were kept for a quarantined workflow, or dropped
        because the workflow no longer exists.
        """
        await self._prefetch(workflow_id)
        with garbage.young_only(self._heavy([workflow_id])):
            return await self._advance_one(workflow_id, events)

    async def _advance_one(self, workflow_id: str, events: list[Event]) -> bool:
        with concerning(Concern(workflow_id)):
            return await self._advance_tries(workflow_id, events)

    async def _advance_tries(self, workflow_id: str, events: list[Event]) -> bool:
        for _ in range(_CAS_ATTEMPTS):
            batch = self.store.batch()
            try:
                with step("advance"):  # what fails outside the named steps
                    flush = await self._apply_and_stage(batch, workflow_id, events, self.clock())
                with step("commit"):
                    etags = await self._commit(batch)
            except ConflictError:
                self.stats.conflicts += 1
                self._evict(workflow_id)
                continue
            except LeaseLost:
                raise
            except TransientError as exc:
                log.warning("advancing %s failed, events will be retried: %s", workflow_id, exc)
                self._evict(workflow_id)
                return False
            except Held as held:
                return await self._keep_alone(workflow_id, events, held=held)
            except WorkflowFault as fault:
                self._evict(workflow_id)
                return await self._keep_alone(workflow_id, events, fault=fault)
            if flush is not None:
                await self._settle_contained(flush, etags)
            return True
        return False

    async def _prepare(
        self, batch: Batch, workflow_id: str, events: list[Event], now: float
    ) -> _Flush | None:
        """Stage one workflow's part of a shared batch: its new state, or, if its work
        fails for good (or it is quarantined already), its events kept aside."""
        try:
            with concerning(Concern(workflow_id)), step("advance"):
                return await self._apply_and_stage(batch, workflow_id, events, now)
        except Held as held:
            batch.ops.clear()
            await self._stage_keep(batch, workflow_id, events, held=held)
        except WorkflowFault as fault:
            batch.ops.clear()
            self._evict(workflow_id)  # the working copy may be half changed
            await self._stage_keep(batch, workflow_id, events, fault=fault)
        return None

    async def _apply_and_stage(
        self, batch: Batch, workflow_id: str, events: list[Event], now: float
    ) -> _Flush | None:
        """Load, apply and stage, each a step inside the workflow's boundary."""
        with step("load"):
            entry = await self._entry(workflow_id)
            if entry is not None and not entry.fresh and _stale(entry.state, events):
                # Another coordinator moved it on (a lease taken over): read it again
                # rather than drop the event as old.
                log.info("re-reading %s: an event shows the copy held here is stale", workflow_id)
                self.stats.rereads += 1
                self._cache.drop(workflow_id)
                entry = await self._entry(workflow_id)
        if entry is None:
            self._forget(workflow_id, len(events))
            return None
        entry.fresh = False
        if entry.replay:  # released from quarantine: its kept events come first
            events = [*entry.replay, *events]
            entry.replay = []
        with step("resolve"):
            await self._resolve_refs(entry, events)
        return await self.offload.run(
            workflow_id,
            heavy(entry.plan, entry.state),
            self._apply_staged,
            batch,
            entry,
            events,
            now,
        )

    def _apply_staged(
        self, batch: Batch, entry: Entry, events: list[Event], now: float
    ) -> _Flush | None:
        """Apply events and stage the writes: the CPU part of a step (in a thread for a
        heavy workflow, see :mod:`dagq.offload`)."""
        st = entry.state
        fx = machine.Effects()
        before = self.telemetry.before(st)
        with step("apply"):
            for event in events:
                machine.apply(entry.plan, st, event, now, fx)
            self._track_deadlines(entry, events)
            _track_timers(entry, fx.timers)
        self.telemetry.applied(entry.plan.name, st, before, fx, now)
        with step("stage"):
            return self._stage(batch, entry, fx)

    def _stage(self, batch: Batch, entry: Entry, fx: machine.Effects) -> _Flush | None:
        """Stage a workflow's writes, in the order that keeps a partial write safe:
        history, then the state (the commit point), then task messages, then the index.
        """
        st = entry.state
        if not (st.dirty or fx.history or fx.dispatch or fx.documents or entry.releasing):
            return None
        workflow_id = st.workflow_id
        if fx.history:  # in the state's tail, or spilled with it to documents before it
            stage_chunk(batch, st, fx.history)
        for key, data in fx.documents:  # foreach items, assembled outputs: before the state
            batch.put(key, data)
        st.unconfirmed = _unconfirmed(entry, fx.dispatch)
        staged = stage_state(batch, st, entry.stored)
        sent_at = self.clock() if self.telemetry.on() else None
        tracing_on = self.telemetry.traced()
        now = self.clock()
        shared: SharedInputs = {}
        outgoing = [
            task_message(
                entry.plan,
                st,
                d,
                sent_at=sent_at,
                traced=tracing_on,
                dispatched_at=now,
                shared=shared,
            )
            for d in fx.dispatch
        ]
        documents = {key: data for o in outgoing for key, data in o.documents}
        for key, data in documents.items():
            batch.put(key, data)
        by_queue: dict[str, list[OutgoingMessage]] = defaultdict(list)
        for o in outgoing:
            by_queue[o.queue].append(o.message)
        # Bundled at the commit (bundle_sends).
        sent = [batch.send(queue, messages) for queue, messages in by_queue.items()]
        # A purged namesake's marker may still be there: it names its own run, which
        # workers tell from this one's (deleting it at every start cost a request a run).
        if fx.stop or (fx.finished and not nothing_to_stop(st)):
            batch.put(keys.control(workflow_id), control_document(st))
        if entry.releasing:  # its kept events are in this state: the record goes
            batch.delete(keys.quarantine(workflow_id))
        indexed = self._index_due(entry) or entry.releasing
        if indexed:
            batch.upsert(index_row(entry))
        traced = tuple(outgoing) if tracing_on else ()  # for their send spans
        flush = _Flush(
            entry,
            staged,
            len(outgoing),
            fx.finished,
            indexed,
            outgoing=traced,
            staged_at=sent_at or 0.0,
            sent=tuple(op.messages for op in sent if op and isinstance(op.messages, list)),
        )
        # A fan-out's 100,000 dispatches and messages: freed a chunk at a time here
        # (in the step thread, for a heavy workflow), not all at once on return.
        garbage.release(fx.dispatch, outgoing, *by_queue.values())
        return flush

    def _index_due(self, entry: Entry) -> bool:
        """Is the index row to be written with this flush? At once for a new status,
        but for a run's start (``pending`` to ``running``), which waits, as changed
        counts do, for ``index_interval_s`` after the row's last write: a short run's
        row goes from ``pending`` to its end in one write (a rescan reads both)."""
        status, indexed = entry.state.status, entry.indexed_status
        if status != indexed and not (status == "running" and indexed == "pending"):
            return True
        return self.clock() - entry.indexed_at >= self.options.index_interval_s

    def _indexed(self, entry: Entry) -> None:
        entry.indexed_status = entry.state.status
        entry.indexed_at = self.clock()
        entry.index_owed = False

    async def _settle_contained(self, flush: _Flush, etags: list[str]) -> None:
        """Settle a committed flush; a failure here quarantines its workflow (whose
        events are durable already: nothing is kept)."""
        try:
            with step("settle"):
                await self._settle(flush, etags[flush.offset :] if flush.offset else etags)
        except WorkflowFault as fault:
            workflow_id = flush.entry.state.workflow_id
            self._evict(workflow_id)
            await self._keep_alone(workflow_id, [], fault=fault)

    async def _settle(self, flush: _Flush, etags: list[str]) -> None:
        """After the commit: remember the new version; count; announce a finished run."""
        entry, st = flush.entry, flush.entry.state
        self.offload.release(*flush.sent)  # committed: the step thread frees them
        entry.stored = await settle_state(self.store, st, flush.staged, etags)
        st.dirty = False
        entry.confirm_owed = flush.dispatched > 0  # sent now; the stored state says not
        entry.confirm_at = self.clock() + self.options.confirm_after_s
        if flush.indexed:
            self._indexed(entry)
        else:
            entry.index_owed = True
        if entry.releasing:
            entry.releasing = False
            self._quarantined.pop(st.workflow_id, None)
            log.info("workflow %s is out of quarantine", st.workflow_id)
        self.stats.flushes += 1
        self.stats.dispatched += flush.dispatched
        if flush.outgoing:
            now = self.clock()
            self.telemetry.committed(entry.plan.name, st, flush.outgoing, flush.staged_at, now)
        if st.status in WORKFLOW_ACTIVE:  # e.g. a finished run that a retry reopened
            self._cache.mark(st.workflow_id, active=True)
        if flush.finished:
            self._cache.mark(st.workflow_id, active=False)
            self.stats.finished_workflows += 1
            self.telemetry.finished(entry.plan.name, st, self.clock())
            log.info("workflow %s %s", st.workflow_id, st.status)
            self.ended.set()
        self.changed.set()

    async def _send(self, entry: Entry, pending: list[tuple[machine.Dispatch, Outgoing]]) -> None:
        """Send task messages; a failure keeps them for the next sweep (state is durable)."""
        if not pending:
            return
        self.lease.check()
        outgoing = [o for _, o in pending]
        try:
            for key, data in (doc for o in outgoing for doc in o.documents):
                await self.store.documents.put(key, data)
            by_queue: dict[str, list[OutgoingMessage]] = defaultdict(list)
            for o in outgoing:
                by_queue[o.queue].append(o.message)
            started = self.clock()
            for queue, batch in by_queue.items():
                await self.store.queues.send(queue, bundle(batch, self._bundle_size))
            self.stats.dispatched += len(outgoing)
            if self.telemetry.on():
                name = entry.plan.name
                self.telemetry.committed(name, entry.state, outgoing, started, self.clock())
            entry.confirm_owed = True
            entry.confirm_at = self.clock() + self.options.confirm_after_s
        except TransientError as exc:
            log.warning("sending %d task(s) failed, will retry: %s", len(outgoing), exc)
            entry.unsent.extend(pending)

    # --- quarantine -------------------------------------------------------------------

    async def _stage_keep(
        self,
        batch: Batch,
        workflow_id: str,
        events: list[Event],
        *,
        held: Held | None = None,
        fault: WorkflowFault | None = None,
    ) -> None:
        """Stage the quarantine record of a workflow with ``events`` kept in it (and,
        when newly quarantined, its index row); the workflow leaves the cache."""
        self._cache.forget(workflow_id)
        if held is not None:
            record, etag = held.record, held.etag
        else:
            record, etag = await self._read_record(workflow_id)
        damaged = record is None and bool(etag)
        if fault is None and not damaged and (record is None or record.released_at is not None):
            # Released (or gone) since it was read: the events must be applied, not
            # kept; they come back after their visibility timeout.
            raise ConflictError(f"the quarantine of {workflow_id} changed meanwhile")
        now = self.clock()
        new = quarantine.keep(
            record,
            workflow_id,
            events,
            step=fault.step if fault else "load",
            reason=fault.reason if fault else "its quarantine record was damaged (replaced)",
            now=now,
        )
        key = keys.quarantine(workflow_id)
        if etag:
            batch.put(key, quarantine.encode(new), if_match=etag)
        else:
            batch.put(key, quarantine.encode(new), if_none_match=True)
        fresh = record is None or record.released_at is not None
        if fresh:
            row = await self.store.index.get(workflow_id)
            batch.upsert(quarantine.quarantined_row(row, workflow_id, new.reason, now))
            log.error(
                "workflow %s quarantined (other workflows go on): %s; once the cause is "
                "fixed: dagq quarantine release %s",
                workflow_id,
                new.reason,
                workflow_id,
            )
            self.stats.quarantined += 1
        self._quarantined[workflow_id] = new.reason

    async def _read_record(self, workflow_id: str) -> tuple[quarantine.Record | None, str]:
        """The quarantine record and its etag ('' if none); a damaged one is replaced."""
        doc = await self.store.documents.get(keys.quarantine(workflow_id))
        if doc is None:
            return None, ""
        try:
            return quarantine.decode(doc.data, workflow_id), doc.etag
        except DagqError as exc:
            log.error("%s; writing a new one", exc)
            return None, doc.etag

    async def _keep_alone(
        self,
        workflow_id: str,
        events: list[Event],
        *,
        held: Held | None = None,
        fault: WorkflowFault | None = None,
    ) -> bool:
        """Quarantine a workflow (or keep more events for it) in a write of its own.

        False if that write failed: the events stay unacknowledged and come back.
        """
        for _ in range(_CAS_ATTEMPTS):
            batch = self.store.batch()
            try:
                await self._stage_keep(batch, workflow_id, events, held=held, fault=fault)
                await self._commit(batch)
                return True
            except LeaseLost:
                raise
            except ConflictError:
                held = None  # read the record again
            except Exception as exc:
                log.error("cannot keep the events of quarantined %s: %s", workflow_id, exc)
                return False
        return False

    def quarantine_reason(self, workflow_id: str) -> str | None:
        """Why this coordinator set the workflow aside, if it did."""
        return self._quarantined.get(workflow_id)

    # --- the cache ------------------------------------------------------------------

    @property
    def active_count(self) -> int:
        """How many unfinished workflows this coordinator is advancing."""
        return self._cache.active_count

    @property
    def cached_count(self) -> int:
        """How many workflow states are held in memory (at most ``cache_size``)."""
        return len(self._cache)

    def status_counts(self) -> dict[str, int]:
        """How many unfinished workflows this coordinator advances, by status (and
        how many it holds in quarantine), for the ``dagq_workflows`` metric."""
        counts: dict[str, int] = defaultdict(int)
        for entry in self._cache.active_entries():
            counts[entry.state.status] += 1
        counts["quarantined"] = len(self._quarantined)
        return dict(counts)

    @property
    def holds_lease(self) -> bool:
        """Does this coordinator hold the lease right now?"""
        return self.lease.lease is not None

    def state_of(self, workflow_id: str) -> RunState | None:
        """The cached working state of a workflow (read-only for callers).

        A large workflow's state may be changing in a thread right now: code running
        beside the coordinator reads it through :meth:`settled_state` instead.
        """
        entry = self._cache.peek(workflow_id)
        return entry.state if entry else None

    async def settled_state(self, workflow_id: str) -> RunState | None:
        """The cached working state, once no thread is changing it: what a reader on the
        coordinator's loop (progress display, ``dagq run``) may read until its next await."""
        await self.offload.idle(workflow_id)
        return self.state_of(workflow_id)

    def plan_of(self, workflow_id: str) -> Plan | None:
        """The cached plan of a workflow."""
        entry = self._cache.peek(workflow_id)
        return entry.plan if entry else None

    def remember_plan(self, fingerprint: str, plan: Plan) -> None:
        """Keep a compiled plan for workflows with this definition and params."""
        self._plans[fingerprint] = plan
        while len(self._plans) > 64:
            self._plans.popitem(last=False)

    def _evict(self, workflow_id: str) -> None:
        """Drop a working copy after a failure: it may differ from the store."""
        self._cache.drop(workflow_id)
        self._defer_repairs()

    def _forget(self, workflow_id: str, n_events: int) -> None:
        """The workflow no longer exists (purged): stop tracking it."""
        if self._cache.is_active(workflow_id) or workflow_id in self._cache:
            log.info("forgetting workflow %s: it no longer exists (purged?)", workflow_id)
        elif n_events:
            log.debug("dropping %d event(s) for unknown workflow %s", n_events, workflow_id)
        self._cache.forget(workflow_id)
        self._quarantined.pop(workflow_id, None)

    def _defer_repairs(self) -> None:
        """Events this coordinator received but did not apply (a failed write) stay
        invisible for the event visibility timeout: reloads wait for them to repair."""
        later = self.clock() + self.options.event_visibility_s + 1.0
        self._repairs_from = max(self._repairs_from, later)

    def _due(self, entry: Entry) -> float:
        """When an evicted active workflow must be swept next (reloaded for it)."""
        st, plan, options = entry.state, entry.plan, self.options
        times = [float("inf")]
        for heap in (entry.deadlines, entry.timers, entry.repairs):
            if heap:
                times.append(heap[0][0])
        if entry.unsent:
            times.append(float("-inf"))
        if entry.index_owed:
            times.append(entry.indexed_at + options.index_interval_s)
        if entry.confirm_owed:
            times.append(entry.confirm_at)
        if plan.deadline_s and st.status == "running":
            times.append(st.created_at + plan.deadline_s)
        if st.status == "cancelling":
            times.append(st.cancelled_at + options.cancel_grace_s)
        return min(times)

    async def _entry(
        self, workflow_id: str, read: Sequence[Document | None] | None = None
    ) -> Entry | None:
        """The workflow's working copy: cached, handed over, else read (``read``: its
        definition, quarantine record and state header, read already)."""
        created = self._preloaded.take(workflow_id) if self._preloaded else None
        entry = self._cache.get(workflow_id)
        if entry is not None:
            return entry
        if created is not None:  # as stored: what a read would find
            created.state.rebuild(created.plan)
            stored = Stored(created.etag, absent=not created.etag)  # "": to be written
            entry = await self._loaded(created.plan, created.state, stored, created)
            entry.indexed_status, entry.indexed_at = "pending", self.clock()  # the submit's row
        else:
            entry = await self._load(workflow_id, read)
        if entry is None:
            return None
        entry.fresh = True
        self._cache.add(workflow_id, entry, active=entry.state.status in WORKFLOW_ACTIVE)
        return entry

    async def _load(
        self, workflow_id: str, read: Sequence[Document | None] | None = None
    ) -> Entry | None:
        # One read of the three (one statement where the store can), unless ``read``
        # holds them: the state's header is used if the workflow is neither quarantined
        # nor unknown.
        if read is None:
            read = await get_many(self.store.documents, _load_keys([workflow_id]))
        definition, held, header = read
        replay: list[Event] = []
        if held is not None:
            try:
                record = quarantine.decode(held.data, workflow_id)
            except DagqError:
                raise Held(None, held.etag) from None
            if record.released_at is None:
                raise Held(record, held.etag)
            replay = quarantine.kept_events(record)
        if definition is None:
            return None
        # A large definition builds a great many objects at once, dead again on return.
        with garbage.young_only(len(definition.data) > OFF_LOOP_BYTES):
            compiled = await self._compiled(definition.data)
        plan = compiled.plan
        found = await read_state(self.store, workflow_id, plan, header=header)
        if found is None:
            return None
        entry = await self._loaded(plan, *found, compiled)
        entry.replay = replay
        entry.releasing = held is not None
        return entry

    async def _loaded(
        self, plan: Plan, st: RunState, stored: Stored, about: _Compiled | Created
    ) -> Entry:
        """The cache entry of a workflow read (or given by its submit) just now."""
        if isinstance(about, Created):
            submitted = about.submitted
            name, tenant = submitted.definition.name, submitted.tenant
            labels, submitted_by = submitted.labels, submitted.submitted_by
        else:
            name, tenant, labels = about.name, about.tenant, about.labels
            submitted_by = about.submitted_by
        entry = Entry(plan, st, stored, name, tenant, labels, submitted_by=submitted_by)
        if st.status in WORKFLOW_ACTIVE:
            self._schedule_repairs(entry)
            self._track_deadlines(entry, ())
            _track_timers(entry, [(when, i) for i, when in st.wake_at.items()])
            await self._resolve_all(entry)
        return entry

    async def _compiled(self, data: bytes) -> _Compiled:
        """The name, tenant, labels, submitter and plan of a definition document; a large
        one is decoded (a task at a time) and compiled off the loop."""
        compiled = await off_loop(len(data), _compile, data, self._plans.get)
        if compiled.new:
            self.remember_plan(compiled.fingerprint, compiled.plan)
        return compiled

    def _schedule_repairs(self, entry: Entry) -> None:
        """A fresh load may follow a crash between flush and send: re-send what is due.

        Only what the state lists as unconfirmed is re-sent (what its last flush
        dispatched, sends that had failed): a message still queued would otherwise be
        sent twice where queues cannot deduplicate (Azure). Sends carry deterministic
        ids, so where they can, a message still queued is not duplicated; the grace
        period leaves time for 'started' events already on their way, and no repair
        comes before the events a crashed coordinator had received are visible again
        (a task whose completion is among them must not run twice).
        """
        st = entry.state
        grace = self.options.repair_grace_s
        now = self.clock()
        earliest = self._repairs_from
        known = st.unconfirmed

        def maybe_unsent(task: int, item: int = -1, undo: bool = False) -> bool:
            return known is None or dispatch_key(task, item, undo) in known

        sent: list[tuple[float, machine.Dispatch]] = []
        for i in st.indexes(TaskStatus.READY):
            if st.dispatched_at[i] != UNSET and maybe_unsent(i):
                sent.append((st.dispatched_at[i], machine.Dispatch(i, st.attempt[i])))
        for i, undo in st.undo_status.items():  # a compensation in flight
            if undo == UNDO_SENT and maybe_unsent(i, undo=True):
                sent.append((now, machine.Dispatch(i, st.undo_attempt[i], undo=True)))
        for i, group in st.groups.items():  # foreach instances in flight
            for k, code in enumerate(group.status):
                ready = code == TaskStatus.READY and group.dispatched_at[k] != UNSET
                if ready and maybe_unsent(i, k):
                    dispatch = machine.Dispatch(i, group.attempt[k], item=k)
                    sent.append((group.dispatched_at[k], dispatch))
        entry.repairs = [
            (max(max(when, now - grace) + grace, earliest), n, dispatch)
            for n, (when, dispatch) in enumerate(sent)
        ]
        heapq.heapify(entry.repairs)

    def _track_deadlines(self, entry: Entry, events: Iterable[Event]) -> None:
        """Remember when running attempts must have answered (the timeout backstop)."""
        st, plan = entry.state, entry.plan
        if events:
            started = [
                e.task for e in events if isinstance(e, TaskStarted) and not e.undo and e.item < 0
            ]
        else:
            started = st.indexes(TaskStatus.RUNNING)
        for i in started:
            if not 0 <= i < len(plan.tasks) or st.task_status[i] != TaskStatus.RUNNING:
                continue
            if plan.tasks[i].foreach is not None:  # its instances are timed by workers
                continue
            limit = attempt_limit(plan, st, i)
            if limit is not None:
                due = limit + self.options.timeout_grace_s
                heapq.heappush(entry.deadlines, (due, i, st.attempt[i]))

    async def _resolve_refs(self, entry: Entry, events: list[Event]) -> None:
        """Load outputs stored by reference that a condition is about to read, and
        signal data sent by reference (replaced, in ``events``, by the data itself)."""
        for k, e in enumerate(events):
            if isinstance(e, SubmitRequested) and e.actor != entry.submitted_by:
                # The definition names who submitted: a rescan's submit event does not.
                events[k] = msgspec.structs.replace(e, actor=entry.submitted_by)
            elif isinstance(e, TaskFinished) and e.output_ref and _value_needed(entry.plan, e.task):
                await self._resolve(entry.state, e.output_ref)
            elif isinstance(e, RetryRequested):
                if e.tasks_ref is not None:
                    names = await self._request_data(e.tasks_ref, "the tasks to retry")
                    try:
                        names = msgspec.convert(names, list[str])
                    except msgspec.ValidationError as exc:
                        raise DamagedData(f"{e.tasks_ref} is not a list of names: {exc}") from None
                    events[k] = msgspec.structs.replace(e, tasks=names, tasks_ref=None)
                await self._resolve_all(entry)
            elif isinstance(e, SignalSent) and e.data_ref is not None:
                data = await self._request_data(e.data_ref, f"the data of signal '{e.name}'")
                events[k] = msgspec.structs.replace(e, data=data, data_ref=None)

    async def _request_data(self, ref: str, what: str) -> Any:
        """The data of a request sent by reference (:mod:`dagq.payloads`)."""
        doc = await self.store.documents.get(ref)
        if doc is None:  # stored before the request was sent: only damage removes it
            raise DamagedData(f"{what} ({ref}) is missing")
        return await off_loop(len(doc.data), payloads.decode_json, doc.data, what)

    async def _resolve_all(self, entry: Entry) -> None:
        for i, ref in list(entry.state.output_refs.items()):
            if _value_needed(entry.plan, i):
                await self._resolve(entry.state, ref)

    async def _resolve(self, st: RunState, ref: str) -> None:
        if ref in st.resolved:
            return
        doc = await self.store.documents.get(ref)
        if doc is not None:  # an output: up to 64 MiB, so a large one in a thread
            st.resolved[ref] = await off_loop(len(doc.data), payloads.decode_json, doc.data, ref)

    # --- sweeps ---------------------------------------------------------------------

    async def sweep(self) -> int:
        """Timeouts, deadlines, cancel grace, repairs, and a periodic rescan of the index.

        Cached active workflows are swept when something is due (:meth:`_sweep_due`);
        evicted ones only when their next sweep is due (they are loaded one at a time,
        never all at once).
        """
        now = self.clock()
        self._next_sweep = now + self.options.sweep_interval_s
        if now >= self._next_rescan:
            self._next_rescan = now + self.options.rescan_interval_s
            await self.rescan()
        size = self.options.batch_size
        for ids in (
            [e.state.workflow_id for e in self._cache.active_entries() if self._sweep_due(e, now)],
            self._cache.due(now),
        ):
            for start in range(0, len(ids), size):  # one commit a batch_size of workflows
                await self._sweep_all(ids[start : start + size], now)
        return 0

    def _sweep_due(self, entry: Entry, now: float) -> bool:
        """Has a sweep anything to do for this cached workflow now? (What :meth:`_due`
        says of an evicted one, and what is owed at once: kept events to apply, a
        quarantine record to delete, an unwritten change, an index row.) Thousands of
        active workflows waiting on their tasks cost a sweep nothing each."""
        if entry.replay or entry.releasing or entry.state.dirty:
            return True
        if entry.index_owed and self._index_due(entry):
            return True
        return self._due(entry) <= now

    async def _sweep_all(self, ids: list[str], now: float) -> None:
        """Sweep these workflows, the writes of the light ones in one commit (one
        transaction on a transactional store, as a step's: each state its own
        conditional put, see docs/architecture.md, "Batching"); if that commit fails,
        each workflow's writes are committed alone, as they were before batching. A
        heavy workflow is swept and committed on its own."""
        swept: list[_Swept] = []
        for workflow_id in ids:
            own = self.store.batch()
            found = await self._sweep_staged(own, workflow_id, now)
            if found is not None:
                entry, flush, indexed = found
                swept.append(_Swept(entry, own.ops, flush, indexed))
        batch = self.store.batch()
        offsets: list[_Flush | None] = []
        for s in swept:
            offset = sum(isinstance(op, PutOp) for op in batch.ops)
            offsets.append(s.flush and msgspec.structs.replace(s.flush, offset=offset))
            batch.ops.extend(s.ops)
        settling: list[tuple[_Swept, _Flush | None, list[str]]]
        try:
            etags = await self._commit(batch)
            settling = [(s, f, etags) for s, f in zip(swept, offsets, strict=True)]
        except LeaseLost:
            raise
        except Exception as exc:  # whatever it was, one workflow's own commit tells
            if isinstance(exc, ConflictError):
                self.stats.conflicts += 1
            else:
                log.warning("writing a sweep failed, retrying one workflow at a time: %s", exc)
            settling = [(s, s.flush, etags) async for s, etags in self._commit_each(swept)]
        for s, flush, etags in settling:
            if flush is not None:
                await self._settle_contained(flush, etags)
            elif s.indexed:
                self._indexed(s.entry)
        for s, _, _ in settling:
            workflow_id = s.entry.state.workflow_id
            if self._cache.peek(workflow_id) is not s.entry:
                continue  # quarantined or evicted as it settled
            async with self._sweep_boundary(workflow_id):
                await self._resend_due(s.entry, now)

    async def _commit_each(self, swept: list[_Swept]) -> AsyncIterator[tuple[_Swept, list[str]]]:
        """Commit each workflow's sweep writes alone; one whose write fails is evicted
        (read again when next needed), or quarantined if it failed for good (as a sweep
        committed alone was); the others are yielded with their etags."""
        for s in swept:
            batch = self.store.batch()
            batch.ops = list(s.ops)
            etags: list[str] | None = None
            async with self._sweep_boundary(s.entry.state.workflow_id):
                with step("commit"):
                    etags = await self._commit(batch)
            if etags is not None:
                yield s, etags

    async def _sweep_staged(
        self, batch: Batch, workflow_id: str, now: float
    ) -> tuple[Entry, _Flush | None, bool] | None:
        """Stage a light workflow's sweep in ``batch``: the workflow, its flush, and
        whether its index row is staged alone; None if there is nothing more to do
        (gone, failed, or heavy and swept on its own)."""
        async with self._sweep_boundary(workflow_id):
            with step("load"):
                entry = await self._entry(workflow_id)
            if entry is None:
                self._forget(workflow_id, 0)
                return None
            entry.fresh = False
            if heavy(entry.plan, entry.state):
                with step("sweep"):
                    await self._sweep_one(entry, now)
                return None
            with step("sweep"):
                if entry.replay:  # released from quarantine while no event came
                    await self._resolve_refs(entry, entry.replay)
                flush = self._swept(batch, entry, now)
                indexed = flush is None and entry.index_owed and self._index_due(entry)
                if indexed:  # counts that moved since
                    batch.upsert(index_row(entry))
            return entry, flush, indexed
        batch.ops.clear()
        return None

    @contextlib.asynccontextmanager
    async def _sweep_boundary(self, workflow_id: str) -> AsyncIterator[None]:
        """A workflow's failure in a sweep stays its own: retried, or quarantined."""
        try:
            yield
        except LeaseLost:
            raise
        except ConflictError:
            self.stats.conflicts += 1
            self._evict(workflow_id)
        except TransientError as exc:
            log.warning("sweeping %s failed, will retry: %s", workflow_id, exc)
            self._evict(workflow_id)
        except Held as held:
            self._cache.forget(workflow_id)
            self._quarantined[workflow_id] = held.record.reason if held.record else "?"
        except WorkflowFault as fault:
            self._evict(workflow_id)
            await self._keep_alone(workflow_id, [], fault=fault)

    async def _sweep_one(self, entry: Entry, now: float) -> None:
        st = entry.state
        if entry.replay:  # released from quarantine while no event came: apply its kept ones
            await self._resolve_refs(entry, entry.replay)
        off_loop = heavy(entry.plan, st)
        batch = self.store.batch()
        with garbage.young_only(off_loop):
            flush = await self.offload.run(st.workflow_id, off_loop, self._swept, batch, entry, now)
            if flush is not None:
                await self._settle(flush, await self._commit(batch))
        if entry.index_owed and self._index_due(entry):  # counts that moved since
            self.lease.check()
            await self.store.index.upsert(index_row(entry))
            self._indexed(entry)
        await self._resend_due(entry, now)

    async def _resend_due(self, entry: Entry, now: float) -> None:
        """Send again the task messages whose send failed or whose repair is due."""
        st = entry.state
        repairing = heavy(entry.plan, st) and bool(entry.repairs or entry.unsent)
        pending = await self.offload.run(st.workflow_id, repairing, self._repairs_due, entry, now)
        if pending:
            log.info("re-sending %d task message(s) of %s", len(pending), st.workflow_id)
            await self._send(entry, pending)

    def _swept(self, batch: Batch, entry: Entry, now: float) -> _Flush | None:
        """What a sweep finds due (kept events, deadlines, timeouts, timers, cancel
        grace), applied and staged: the CPU part of a sweep."""
        st, plan = entry.state, entry.plan
        fx = machine.Effects()
        before = self.telemetry.before(st)
        for event in entry.replay:
            machine.apply(plan, st, event, now, fx)
        if entry.replay:
            self._track_deadlines(entry, entry.replay)
            entry.replay = []
        if plan.deadline_s and st.status == "running" and now > st.created_at + plan.deadline_s:
            reason = f"deadline of {plan.deadline_s:g}s exceeded"
            machine.cancel(plan, st, now, fx, reason, final="failed")
        while entry.deadlines and entry.deadlines[0][0] <= now:
            _, i, attempt = heapq.heappop(entry.deadlines)
            if st.task_status[i] != TaskStatus.RUNNING or st.attempt[i] != attempt:
                continue
            limit = (attempt_limit(plan, st, i) or now) + self.options.timeout_grace_s
            if limit <= now:
                machine.expire_attempt(plan, st, now, fx, task=i, attempt=attempt)
            else:  # redelivered and restarted since: the limit moved
                heapq.heappush(entry.deadlines, (limit, i, attempt))
        while entry.timers and entry.timers[0][0] <= now:
            _, i = heapq.heappop(entry.timers)
            machine.wake(plan, st, now, fx, task=i)
        if st.status == "cancelling" and now > st.cancelled_at + self.options.cancel_grace_s:
            machine.abandon_running(plan, st, now, fx)
        if entry.confirm_owed and now >= entry.confirm_at:
            st.dirty = True  # its sends went out a while ago: the stored state says so now
        _track_timers(entry, fx.timers)
        self.telemetry.applied(plan.name, st, before, fx, now)
        return self._stage(batch, entry, fx)

    def _repairs_due(self, entry: Entry, now: float) -> list[tuple[machine.Dispatch, Outgoing]]:
        """The task messages to send again now: failed sends and repairs that are due."""
        st = entry.state
        pending = [(d, o) for d, o in entry.unsent if _still_sent(st, d)]
        entry.unsent = []
        while entry.repairs and entry.repairs[0][0] <= now:
            _, _, dispatch = heapq.heappop(entry.repairs)
            if _still_sent(st, dispatch):
                sent_at = self.clock() if self.telemetry.on() else None
                message = task_message(
                    entry.plan,
                    st,
                    dispatch,
                    sent_at=sent_at,
                    traced=self.telemetry.traced(),
                    dispatched_at=self.clock(),
                )
                pending.append((dispatch, message))
        return pending

    async def rescan(self) -> None:
        """Pick up active workflows this coordinator does not know (startup, lost submits)."""
        cursor: str | None = None
        now = self.clock()
        while True:
            page = await self.store.index.query(
                status=sorted(WORKFLOW_ACTIVE), limit=500, cursor=cursor
            )
            for row in page.rows:
                if row.id in self._cache or self._cache.is_active(row.id):
                    continue
                if row.id in self._preloaded:  # handed over: the next step starts it
                    continue
                await self._rescan_one(row, now)
            cursor = page.cursor
            if cursor is None:
                return

    async def _rescan_one(self, row: IndexRow, now: float) -> None:
        if not await self.advance(row.id, [SubmitRequested(workflow_id=row.id)]):
            return
        entry = self._cache.peek(row.id)
        if entry is None and row.data.get(FIRST_STATE_HANDED) and row.status == "pending":
            # Its submit returned, leaving the first state to a coordinator that is gone.
            if not await self._write_initial_state(row.id):
                return  # purged meanwhile
            if not await self.advance(row.id, [SubmitRequested(workflow_id=row.id)]):
                return
            entry = self._cache.peek(row.id)
        if entry is None:
            if row.id in self._quarantined:
                return
            if now - row.created_at > self.options.abandoned_submit_s:
                log.warning("forgetting %s: its submit never completed", row.id)
                self.lease.check()
                await self.store.index.delete(row.id)
        elif entry.state.status != row.status or row.data.get("counts") != (
            entry.state.count_map()
        ):  # a crash between flush and index write, or counts not written yet
            self.lease.check()
            await self.store.index.upsert(index_row(entry))
            self._indexed(entry)

    async def _write_initial_state(self, workflow_id: str) -> bool:
        """Write a workflow's initial state, as its submit would have; whether it has a
        definition to start from."""
        submitted = await load_submitted(self.store, workflow_id)
        if submitted is None:
            return False
        plan = plan_of(submitted.definition, submitted.params, submitted.fingerprint)
        self.lease.check()
        with contextlib.suppress(ConflictError):  # written meanwhile
            await create_state(
                self.store, RunState(workflow_id, len(plan.tasks), submitted.created_at)
            )
        return True


def _load_keys(workflow_ids: Iterable[str]) -> list[str]:
    """What loading each workflow reads: its definition, quarantine record and state."""
    return [
        key for i in workflow_ids for key in (keys.definition(i), keys.quarantine(i), keys.state(i))
    ]


def _stale(st: RunState, events: list[Event]) -> bool:
    """Must the working copy be read again before these events apply? When one names an
    attempt it never dispatched, or announces a submit (of a workflow held in memory: a
    new one with the same id, after a purge)."""
    return any(isinstance(e, SubmitRequested) or machine.unplaceable(st, e) for e in events)


def _value_needed(plan: Plan, task: int) -> bool:
    """Will the coordinator read this task's output (a child's condition, computed timer
    or foreach list, or the task's own loop)?"""
    if not 0 <= task < len(plan.tasks):
        return False
    if plan.tasks[task].loop is not None:
        return True
    return any(
        plan.tasks[c].condition is not None
        or plan.tasks[c].foreach is not None
        or not isinstance(plan.tasks[c].sleep, float | None)
        for c in plan.tasks[task].children
    )


class _Compiled(msgspec.Struct, frozen=True):
    name: str
    tenant: str
    labels: dict[str, str]
    submitted_by: str
    fingerprint: str
    plan: Plan
    #: Compiled now (not found among the known plans).
    new: bool


def _compile(data: bytes, known: Callable[[str], Plan | None]) -> _Compiled:
    """Decode a definition document and compile its plan (unless ``known`` has it).

    Only the plan outlives this call: the definition (hundreds of thousands of
    objects in a large one) is garbage when it returns, wherever it runs, so no
    collection ever walks it.
    """
    outline = decode_outline(data)
    plan = known(outline.fingerprint)
    new = plan is None
    if plan is None:  # compiled by this process's client or a reader?
        plan = PLANS.get(outline.fingerprint)
    if plan is None:  # its tasks are decoded only to be compiled
        submitted = decode_outlined(outline)
        plan = PLANS.plan(submitted.definition, submitted.params, submitted.fingerprint)
    return _Compiled(
        outline.definition.name,
        outline.tenant,
        outline.labels,
        outline.submitted_by,
        outline.fingerprint,
        plan,
        new,
    )


def _unconfirmed(entry: Entry, dispatched: Iterable[machine.Dispatch]) -> set[int]:
    """What a state written now must list as possibly unsent: this flush's dispatches
    (sent after the state is written), sends that failed, and repairs still to come."""
    keys = {dispatch_key(d.task, d.item, d.undo) for d in dispatched}
    keys.update(dispatch_key(d.task, d.item, d.undo) for d, _ in entry.unsent)
    keys.update(dispatch_key(d.task, d.item, d.undo) for _, _, d in entry.repairs)
    return keys


def _still_sent(st: RunState, dispatch: machine.Dispatch) -> bool:
    """Is this attempt (of a task, an undo or an instance) still waiting to be done?"""
    i, attempt = dispatch.task, dispatch.attempt
    if dispatch.undo:
        return st.undo_status.get(i) == UNDO_SENT and st.undo_attempt.get(i) == attempt
    if dispatch.item >= 0:
        group = st.groups.get(i)
        return (
            group is not None
            and group.status[dispatch.item] == TaskStatus.READY
            and group.attempt[dispatch.item] == attempt
        )
    return st.task_status[i] == TaskStatus.READY and st.attempt[i] == attempt


def _track_timers(entry: Entry, timers: Iterable[tuple[float, int]]) -> None:
    for timer in timers:
        heapq.heappush(entry.timers, timer)


def attempt_limit(plan: Plan, st: RunState, i: int) -> float | None:
    """When the running attempt of ``i`` must end: its timeout or its task's deadline."""
    task = plan.tasks[i]
    limits = []
    if task.timeout_s:
        limits.append(st.started_at[i] + task.timeout_s)
    if task.task_deadline_s and i in st.round_started:
        limits.append(st.round_started[i] + task.task_deadline_s)
    return min(limits) if limits else None


def control_document(st: RunState) -> bytes:
    """What workers must stop: everything (a cancelled or finished run: anything still
    running or queued for it is stale) or some attempts (lost races) — of this run
    (``run``: its ``created_at``), not of a namesake submitted after a purge."""
    stopped = st.status == "cancelling" or st.status in WORKFLOW_TERMINAL
    return msgspec.json.encode(
        {
            "stop_through": st.epoch if stopped else -1,
            "tasks": st.stop_requests,
            "run": st.created_at,
        }
    )


def nothing_to_stop(st: RunState) -> bool:
    """Has every attempt this run ever sent reported its success? (Then no worker can
    run one that ought to stop, but a duplicate of one delivered twice, which
    at-least-once delivery allows: its report applies as a no-op.) A run that ends
    so writes no control document — a stop for nothing, a request a run."""
    if st.status != "completed" or st.epoch or st.groups or st.iteration:
        return False
    done = st.counts[TaskStatus.COMPLETED] + st.counts[TaskStatus.SKIPPED]
    return done == st.n_tasks and max(st.attempt, default=0) <= 1


def index_row(entry: Entry) -> IndexRow:
    """The index projection of a cached workflow."""
    st = entry.state
    data: dict[str, object] = {"total": st.n_tasks, "counts": st.count_map()}
    if st.error:
        data["error"] = st.error
    if st.finished_at != UNSET:
        data["finished_at"] = st.finished_at
    if entry.labels:
        data["labels"] = entry.labels
    return IndexRow(
        id=st.workflow_id,
        name=entry.name,
        status=st.status,
        created_at=st.created_at,
        updated_at=st.updated_at,
        tenant=entry.tenant,
        data=data,
    )


def is_terminal(status: str) -> bool:
    """Has a workflow with this status finished?"""
    return status in WORKFLOW_TERMINAL
