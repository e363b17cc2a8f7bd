"""The worker: takes task messages from its queues, runs them, reports the outcome.

For each message: keep it invisible while the task runs (heartbeats), run it, store
a large output as a document, post the completion event, and only then delete the
message (docs/architecture.md, invariant 5). A message may carry a bundle of tasks: the worker keeps
as many as it has free slots plus a short backlog, and gives the rest back
(:mod:`dagq.holding`). A slot is free again as soon as its task has run: the report
goes out in the background, with others. A worker never writes runtime state.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import os
import shutil
import socket
import tempfile
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import msgspec

from dagq import expression, keys, payloads, registry, reporting, switching
from dagq.errors import DagqError, DamagedData, MessageLost, PermanentError
from dagq.holding import Held, delete, give_back, split
from dagq.jobq import WATCHED_SUFFIX
from dagq.leasing import default_owner
from dagq.live_logs import LiveLog
from dagq.messages import (
    TaskFinished,
    TaskMessage,
    TaskSpec,
    TaskStarted,
    decode_task,
    decode_tasks,
)
from dagq.observability import attempts, context
from dagq.outbox import Outbox
from dagq.payloads import cut
from dagq.persistence import off_loop
from dagq.runners import Outcome, StoredInputs, TaskContext
from dagq.runners.child import describe
from dagq.runners.pool import TaskPool
from dagq.runners.python import add_import_paths, run_python
from dagq.runners.shell import run_shell
from dagq.stores.base import Message, Store, report_linger, wakes_across_processes
from dagq.supervision import Supervisor
from dagq.version import VERSION

log = logging.getLogger("dagq.worker")

_V = TypeVar("_V")
_ARG_ROOTS = frozenset({"inputs", "params"})
#: Decoded documents up to this size are kept for the next task that needs them.
DOCUMENT_CACHE_BYTES = 8 * 1024 * 1024
_DOCUMENTS_KEPT = 16
#: The name prefix of the threads that run synchronous Python tasks (isolation "thread").
TASK_THREAD_PREFIX = "dagq-task"
_FIRST_POLL_S = 0.005
#: The first poll where a send in another process wakes the wait too
#: (:func:`~dagq.stores.base.wakes_across_processes`): the poll is only a fallback
#: there, and one every few milliseconds only competes with the sends it waits for.
_WOKEN_FIRST_POLL_S = 0.05
#: Waits after a failed receive: doubling from the first, up to the last.
_FIRST_BACKOFF_S = 0.2
_MAX_BACKOFF_S = 10.0
#: Tasks whose reports are on their way, per task the worker may hold running or ahead
#: (its slots, or its prefetch limit if larger), before it takes no more.
_REPORTING_PER_SLOT = 4
#: Without ``backlog``: the most tasks a worker takes ahead of its free slots (however
#: quick its tasks are), if it has fewer slots than this.
PREFETCH_MOST = 32
#: How much a new task time counts in the running estimate of a slot's turn.
_TURN_WEIGHT = 0.2
#: A background task (heartbeats, the outbox) failing this many times in a row stops
#: the worker: it is broken, and tasks held without heartbeats would run twice.
MAX_BACKGROUND_FAILURES = 4
#: How long a task of a workflow this worker does not serve stays out of sight after
#: it gives it back (so it does not take it again at once).
FOREIGN_DELAY_S = 0.5
#: After the grace period, how long the last reports may still take to go out.
_CLOSE_S = 2.0


@dataclass(frozen=True, kw_only=True)
class WorkerOptions:
    """What a worker serves and how it paces itself."""

    queues: tuple[str, ...] = ("default",)
    concurrency: int = 4
    visibility_timeout_s: float = 60.0
    import_paths: tuple[str, ...] = ()
    idle_timeout_s: float | None = None
    poll_interval_s: float = 0.5
    shutdown_grace_s: float = 30.0
    cancel_check_s: float = 1.0
    batch_size: int = 32
    #: Tasks a worker may keep beyond its free slots, to start as slots free up, and
    #: how long they may wait for a slot before they go back to the queue for other
    #: workers. It takes tasks ahead (prefetch) only as many as its slots are likely
    #: to start within half that wait, judged from its recent tasks' times (none
    #: while it knows none, or after a backlog had to go back), so quick tasks do
    #: not wait for a receive each and long ones stay on the queue for other workers;
    #: the rest of a bundle is kept up to this many too. None: up to
    #: ``max(concurrency, PREFETCH_MOST)`` ahead, and a bundle's rest up to
    #: ``concurrency`` (docs/architecture.md, "Batching").
    backlog: int | None = None
    backlog_wait_s: float = 1.0
    #: How long a completion may wait for others to share its message (None: 20 ms on
    #: a store that bundles task messages, else the store's ``report_linger_s``: 5 ms
    #: on postgres, 0 elsewhere).
    report_linger_s: float | None = None
    #: While it runs, the process's GIL switch interval is at most this (seconds): the
    #: longest its loop (heartbeats, pipes to the pool) waits for the GIL at each
    #: hand-over while a thread runs Python (:mod:`dagq.switching`). None: unchanged.
    switch_interval_s: float | None = None
    work_dir: str | None = None
    name: str = field(default_factory=default_owner)
    #: Where Python tasks run: "process" (a pool of long-lived child processes, one per
    #: slot at most: a task that crashes, hangs or is cancelled is killed alone) or
    #: "thread" (the worker's own threads: for trusted code only, as a crash takes the
    #: worker down and a sync task past its timeout cannot be stopped).
    isolation: Literal["process", "thread"] = "process"
    #: Run only the tasks of these workflows (None: of every workflow). The others go
    #: back to the queue, visible again after ``FOREIGN_DELAY_S``, for the workers
    #: that serve them: ``dagq run`` runs its own workflow's tasks only, as another
    #: run's Python tasks may need another import path (or a module of the same name
    #: may mean another function here).
    workflows: frozenset[str] | None = None
    #: ``module:function`` that runs the tasks that say what to run only through their
    #: ``kwargs`` (an ai4s-jobq form): it gets them as keyword arguments. Without one,
    #: such a task fails at once, saying how to start a worker that has one.
    processor: str | None = None
    #: How long a task that watches :func:`dagq.jobq.is_cancelled` gets to end on its
    #: own once it must stop, before it is stopped (others are stopped at once).
    cancel_notice_s: float = 10.0
    #: How often the worker rewrites its record in the store (:mod:`dagq.registry`);
    #: it counts as gone after ``registry.EXPIRY_BEATS`` of these without a write.
    heartbeat_s: float = registry.HEARTBEAT_S
    #: Start the first pool process as the worker starts, before a Python task needs
    #: it. False: at the first such task (``dagq run`` of a file whose tasks are all
    #: shell commands starts no Python process, nor waits for one to end).
    warm_pool: bool = True

    def __post_init__(self) -> None:
        switching.check(self.switch_interval_s)


class _Running(msgspec.Struct, eq=False):
    held: Held
    task: TaskMessage
    #: This task's key in ``Worker._running``: the message id (#n in a bundle).
    key: str
    job: asyncio.Task[None] | None = None
    #: Why the task is being stopped (empty: it is not).
    stopping: str = ""
    #: When it was kept (a backlog task waits for a slot), and whether it holds one.
    kept_at: float = 0.0
    busy: bool = False
    #: When it took its slot (monotonic clock).
    turn_started: float = 0.0
    #: Its outcome has been handed to the outbox.
    reported: bool = False
    #: It is inside the task itself (only then may a stop cancel it).
    executing: bool = False
    #: Created when it must stop, for :func:`dagq.jobq.is_cancelled` (empty until it runs).
    cancel_file: str = ""
    #: Its telemetry (spans, metrics), from when it starts.
    trace: attempts.Attempt | None = None


class Worker:
    """Runs tasks from one store's queues with a concurrency limit."""

    def __init__(
        self,
        store: Store,
        options: WorkerOptions | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.options = options or WorkerOptions()
        self.clock = clock
        self.completed = 0
        #: Every task held: in the backlog, running, or reporting.
        self._running: dict[str, _Running] = {}
        self._backlog: deque[_Running] = deque()
        self._busy = 0
        #: Set when the serving loop has something to do: a slot or room in the backlog
        #: to fill, or fewer reports on their way (see :meth:`_wake_serving`).
        self._slot_freed = asyncio.Event()
        #: Serving: a freed slot starts a backlog task at once (cleared on stop).
        self._serving_now = False
        linger = self.options.report_linger_s
        if linger is None:
            linger = 0.02 if self._bundle_size > 1 else report_linger(self.store.queues)
        self._outbox = Outbox(
            store, keys.COMPLETIONS_QUEUE, linger_s=linger, expecting=lambda: self._busy > 0
        )
        self._pool: TaskPool | None = None
        self._executor: ThreadPoolExecutor | None = None
        if self.options.isolation == "thread":
            self._executor = ThreadPoolExecutor(
                max_workers=self.options.concurrency, thread_name_prefix=TASK_THREAD_PREFIX
            )
        else:
            self._pool = TaskPool(self.options.concurrency)
        self._controls: dict[str, tuple[float, _Control]] = {}
        self._control_reads: dict[str, asyncio.Future[_Control]] = {}
        #: Immutable documents (items, outputs, inputs) lately decoded, by run and key
        #: (a run purged and submitted again reuses its keys: see TaskMessage.run).
        self._documents: dict[tuple[float, str], Any] = {}
        #: Immutable documents lately read, as stored (inputs for pool processes).
        self._raw_documents: dict[tuple[float, str], bytes] = {}
        #: Tasks per received message lately (bundles make it more than one): a receive
        #: asks for as many messages as are likely to fill the free slots.
        self._per_message = float(self._bundle_size)
        #: How long a slot's turn takes lately (a task, start to slot freed), or None
        #: while none has run: what prefetching is judged by.
        self._turn_s: float | None = None
        #: Held while backlog tasks go back to the queue, so shutdown never sees a task
        #: that is neither in the backlog nor back on the queue.
        self._backlog_lock = asyncio.Lock()
        self._draining = False
        self._backoff = _FIRST_BACKOFF_S
        #: A directory of this worker's own (made when first needed), for cancel files.
        self._scratch: str | None = None
        self._attempts = itertools.count(1)
        self._ended_attempts = 0  # since the cancel files were last swept
        self._started_at = clock()
        self._stopping = False
        self._registration = registry.Registration(store.documents, self.record, clock=self.clock)
        add_import_paths(self.options.import_paths)

    def record(self) -> registry.WorkerRecord:
        """What this worker says about itself in its record (:mod:`dagq.registry`)."""
        running = [r for r in self._running.values() if r.busy]
        host, _, rest = self.options.name.partition(":")
        pid = rest.partition(":")[0]
        served = self.options.workflows
        return registry.WorkerRecord(
            id=self.options.name,
            host=host or socket.gethostname(),
            pid=int(pid) if pid.isdigit() else os.getpid(),
            queues=list(self.options.queues),
            concurrency=self.options.concurrency,
            running=len(running),
            attempts=[_attempt_id(r.task) for r in running[: registry.ATTEMPTS_LISTED]],
            completed=self.completed,
            version=VERSION,  # not importlib.metadata's: a tenth of `dagq run`'s start-up
            started_at=self._started_at,
            last_seen=self.clock(),
            heartbeat_s=self.options.heartbeat_s,
            state="stopping" if self._stopping else "serving",
            workflows=None if served is None else sorted(served),
        )

    # --- the loop ---------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set (or idle too long), then drain gracefully.

        Heartbeats and the outbox run supervised: one that fails is logged and
        restarted; one that keeps failing stops the worker, and this raises
        :class:`~dagq.supervision.BackgroundFailed` once the worker has drained.
        """
        supervisor = Supervisor("worker")
        if self._pool is not None and self.options.warm_pool:
            self._pool.warm()
        await self._registration.register()  # seen before it takes any work
        supervisor.start("registration", self._registration.keep, restart=True)
        self._outbox.start(supervisor)
        supervisor.start(
            "heartbeat", self._heartbeat, restart=True, max_failures=MAX_BACKGROUND_FAILURES
        )
        halt = asyncio.Event()

        def halted(_: object) -> None:
            self._serving_now = False  # a freed slot starts no more backlog tasks
            halt.set()

        watch = asyncio.create_task(_first(stop.wait(), supervisor.failed.wait()))
        watch.add_done_callback(halted)
        self._serving_now = True
        switching.lower(self.options.switch_interval_s)
        try:
            await self._serve(halt)
        finally:
            self._serving_now = False
            switching.restore(self.options.switch_interval_s)
            watch.cancel()
            self._stopping = True
            deadline = asyncio.get_running_loop().time() + self.options.shutdown_grace_s
            await self._drain(deadline)
            attempts.fold()  # what it ran is counted and traced by the time it stops
            await supervisor.stop("heartbeat")
            await supervisor.stop("registration")
            await self._registration.withdraw()
            await self._outbox.close(_CLOSE_S)
            await supervisor.close()
            if self._pool is not None:
                await self._pool.close()
            if self._executor is not None:
                self._executor.shutdown(wait=False, cancel_futures=True)
            if self._scratch is not None:
                shutil.rmtree(self._scratch, ignore_errors=True)
                self._scratch = None
            if self._outbox.lost_acks:
                log.warning(
                    "%d finished task message(s) were no longer held when deleted",
                    self._outbox.lost_acks,
                )
        supervisor.check()

    async def _serve(self, stop: asyncio.Event) -> None:
        # One wait for the stop, shared by every wait below (a task each time, made and
        # cancelled at every wait, cost two of the loop's turns a finished task).
        stopping = asyncio.ensure_future(stop.wait())
        try:
            await self._serving(stop, stopping)
        finally:
            stopping.cancel()

    async def _serving(self, stop: asyncio.Event, stopping: asyncio.Future[Any]) -> None:
        idle_since = self.clock()
        queue_index = 0
        poll = self._first_poll()
        loop = asyncio.get_running_loop()
        #: The queues ran dry at the last receive: until then (the next poll) only a
        #: send brings more, not a slot that frees (on a store that bills receives, a
        #: receive per finished task found nothing most of the time).
        dry_until: float | None = None
        #: The last wait for the queues ended before its poll was due: a send in this
        #: process announced what the receive after it finds, and the polls (for sends
        #: elsewhere) need not quicken for it.
        announced = False
        while not stop.is_set():
            self._start_backlog()
            wanted = self._wanted()
            if wanted <= 0 or self._reporting() >= self._reporting_limit:
                self._slot_freed.clear()
                await _first(self._slot_freed.wait(), stopping, keep=stopping)
                continue
            if dry_until is not None:
                announced = await self._wait_queues(dry_until, stopping) or announced
                dry_until = None
                if stop.is_set():
                    break
            got, asked = await self._take_all(wanted, queue_index)
            queue_index += 1
            if got or self._running:
                idle_since = self.clock()
            if got:
                if not announced:  # found by a poll, or by a receive that went first
                    poll = self._first_poll()
                announced = False
                if got >= asked:  # there may be more; otherwise wait (no send is missed)
                    continue
            idle = self.options.idle_timeout_s
            if not got and idle is not None and self.clock() - idle_since >= idle:
                log.info("idle for %.0fs, stopping", idle)
                return
            # The queues ran dry with slots free: only a send brings more (a finished
            # task does not, unless tasks taken ahead wait for its slot). Where a send
            # elsewhere does not wake it: poll soon after work, then back off.
            if self._backlog:
                self._slot_freed.clear()
                if self._busy < self.options.concurrency:
                    continue  # a slot came free meanwhile
            dry_until = loop.time() + poll
            announced = await self._wait_queues(dry_until - 0.1 * poll, stopping, poll)
            if not announced:
                poll = min(poll * 2, self.options.poll_interval_s)

    async def _wait_queues(
        self, until: float, stopping: asyncio.Future[Any], timeout_s: float | None = None
    ) -> bool:
        """Wait for a send to one of the queues (one since the last receive returns at
        once), a stop, or a slot for the backlog, for ``timeout_s`` (None: until
        ``until``, loop time); whether it ended before ``until``."""
        loop = asyncio.get_running_loop()
        left = until - loop.time() if timeout_s is None else timeout_s
        if left <= 0:
            return False
        waits: list[Any] = [self.store.queues.wait(q, left) for q in self.options.queues]
        if self._backlog:
            waits.append(self._slot_freed.wait())
        await _first(*waits, stopping, keep=stopping)
        return loop.time() < until

    async def _take_all(self, wanted: int, first: int) -> tuple[int, int]:
        """Take up to ``wanted`` tasks from the queues in turn (from the ``first``th):
        how many were taken, and how many asked for."""
        queues = self.options.queues
        got = asked = 0
        for offset in range(len(queues)):
            want = min(wanted - got, self.options.batch_size)
            asked += want
            got += await self._take(queues[(first + offset) % len(queues)], want)
            if got >= wanted:
                break
        return got, asked

    def _wanted(self) -> int:
        """How many tasks to receive now: one per free slot, plus as many ahead as
        :meth:`_prefetch` says (refilled once half of them have started)."""
        free = self.options.concurrency - self._busy
        ahead = self._prefetch()
        if free <= 0 and len(self._backlog) > ahead // 2:
            return 0
        return max(0, free) + max(0, ahead - len(self._backlog))

    @property
    def _prefetch_limit(self) -> int:
        """The most tasks taken ahead of the free slots, however quick they are."""
        limit = self.options.backlog
        return max(self.options.concurrency, PREFETCH_MOST) if limit is None else limit

    @property
    def _reporting_limit(self) -> int:
        """How many finished tasks may have their reports on the way before the worker
        takes no more: in proportion to the most it may hold running or ahead, so that
        a worker of few slots that prefetches quick tasks may run as many between two of
        the store's commits as one of many slots (one of 4 slots stalled at 16 before)."""
        return _REPORTING_PER_SLOT * max(self.options.concurrency, self._prefetch_limit)

    def _prefetch(self) -> int:
        """How many tasks to keep ahead of the free slots: as many as the slots start
        within half the backlog wait, at the pace of recent tasks (none while no task
        has run, or once a backlog had to go back)."""
        if self._turn_s is None:
            return 0
        limit = self._prefetch_limit
        horizon = self.options.backlog_wait_s / 2
        pace = self.options.concurrency / max(self._turn_s, 1e-4)  # tasks started a second
        return max(0, min(limit, int(horizon * pace)))

    def _turn(self, seconds: float) -> None:
        """A slot's turn took ``seconds``: update the estimate prefetching goes by."""
        previous = self._turn_s
        self._turn_s = (
            seconds if previous is None else previous + _TURN_WEIGHT * (seconds - previous)
        )

    def _first_poll(self) -> float:
        woken = wakes_across_processes(self.store.queues)
        return min(_WOKEN_FIRST_POLL_S if woken else _FIRST_POLL_S, self.options.poll_interval_s)

    async def _take(self, queue: str, n: int) -> int:
        """Take up to ``n`` tasks from ``queue``, starting those free slots can run and
        keeping the rest for later (:meth:`_hold`); how many were taken."""
        if n <= 0:
            return 0
        try:
            messages = await self.store.queues.receive(
                queue,
                max_messages=max(1, math.ceil(n / self._per_message)),
                visibility_timeout_s=self.options.visibility_timeout_s,
            )
        except DagqError as exc:
            delay = self._backoff
            self._backoff = min(delay * 2, _MAX_BACKOFF_S)
            log.warning("receiving from %r failed, retrying in %.1fs: %s", queue, delay, exc)
            await asyncio.sleep(delay)
            return 0
        if self._backoff != _FIRST_BACKOFF_S:
            log.info("receiving from %r works again", queue)
            self._backoff = _FIRST_BACKOFF_S
        taken = seen = 0
        for message in messages:
            try:
                tasks = decode_tasks(message.body)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                log.error("unreadable task message %s dead-lettered: %s", message.id, exc)
                with contextlib.suppress(DagqError):  # else it is redelivered, then buried
                    await self.store.queues.dead_letter(
                        queue, message.receipt, f"cannot be parsed: {exc}"
                    )
                continue
            seen += len(tasks)
            try:
                taken += await self._hold(message, tasks)
            except DagqError as exc:  # the message comes back after its visibility timeout
                log.warning("bundle %s could not be taken apart: %s", message.id, exc)
        if messages:
            self._per_message = max(1.0, (self._per_message + seen / len(messages)) / 2)
        return taken

    async def _hold(self, message: Message, tasks: list[TaskMessage]) -> int:
        """Start the tasks of one message that free slots can run, keep a backlog, give
        the rest back; how many were started or kept."""
        if len(tasks) > 1 and message.dequeue_count > 1:
            await split(self.store, message, tasks)
            return 0
        served = self.options.workflows
        if served is not None:
            foreign = [t for t in tasks if t.workflow_id not in served]
            if foreign:
                await give_back(
                    self.store, message.queue, foreign, self._bundle_size, delay_s=FOREIGN_DELAY_S
                )
                tasks = [t for t in tasks if t.workflow_id in served]
        room = max(self.options.concurrency - self._busy, 0)
        spare = max(0, max(self._backlog_limit, self._prefetch()) - len(self._backlog))
        kept, rest = tasks[: room + spare], tasks[room + spare :]
        if rest:
            await give_back(self.store, message.queue, rest, self._bundle_size)
        if not kept:
            await delete(self.store, message, "every task in it given back")
            return 0
        now = self.clock()
        held = Held(message, message.receipt, now, kept=len(kept), open=len(kept))
        for i, task in enumerate(kept):
            key = message.id if len(tasks) == 1 else f"{message.id}#{i}"
            running = _Running(held, task, key, kept_at=now)
            self._running[key] = running
            if i < room:
                self._start(running)
            else:
                self._backlog.append(running)
        return len(kept)

    def _start(self, running: _Running) -> None:
        running.busy = True
        running.turn_started = time.monotonic()
        self._busy += 1
        running.job = asyncio.create_task(self._handle(running), name=f"dagq-task-{running.key}")

    def _start_backlog(self) -> None:
        """Start backlog tasks while slots are free (those of a lost message are dropped)."""
        while self._backlog and self._busy < self.options.concurrency:
            running = self._backlog.popleft()
            if running.held.lost:
                self._running.pop(running.key, None)
                continue
            self._start(running)

    def _free_slot(self, running: _Running) -> None:
        """A task's slot is free: the next backlog task takes it at once (not at the
        serving loop's next turn), and the serving loop wakes only if it has work."""
        if running.busy:
            running.busy = False
            self._busy -= 1
            self._turn(time.monotonic() - running.turn_started)
            if self._serving_now:
                self._start_backlog()
            self._wake_serving()

    def _wake_serving(self) -> None:
        """Wake the serving loop if it would receive now (a slot free with no backlog
        task for it, the backlog down to half, and room for more reports): a wake-up a
        finished task, with few slots, cost more than the task's own bookkeeping."""
        if self._wanted() > 0 and self._reporting() < self._reporting_limit:
            self._slot_freed.set()

    def _reporting(self) -> int:
        return len(self._running) - self._busy - len(self._backlog)

    @property
    def _backlog_limit(self) -> int:
        limit = self.options.backlog
        return self.options.concurrency if limit is None else max(0, limit)

    async def _return_backlog(self, now: float) -> None:
        """Give back backlog tasks that have waited too long for a slot."""
        async with self._backlog_lock:
            if not self._draining:
                await self._return_stale(now)

    async def _return_stale(self, now: float) -> None:
        stale = [r for r in self._backlog if now - r.kept_at >= self.options.backlog_wait_s]
        if not stale:
            return
        groups: dict[int, tuple[Held, list[_Running]]] = {}
        for running in stale:
            self._backlog.remove(running)
            self._running.pop(running.key, None)
            if not running.held.lost:  # a lost message is another worker's now
                groups.setdefault(id(running.held), (running.held, []))[1].append(running)
        for held, group in groups.values():
            try:
                await give_back(self.store, held.queue, [r.task for r in group], self._bundle_size)
            except DagqError as exc:
                log.warning("giving back %d waiting task(s) failed: %s", len(group), exc)
                for running in group:  # they stay, and are tried again
                    self._running[running.key] = running
                    self._backlog.append(running)
                continue
            done = held.given_back(len(group))
            if done is not None:
                self._outbox.acknowledge(done)
        # Tasks waited for a slot longer than they should: take none ahead until the
        # tasks that run say they are quick again.
        slowest = self.options.backlog_wait_s * self.options.concurrency
        self._turn_s = max(self._turn_s or 0.0, slowest)

    @property
    def _bundle_size(self) -> int:
        return max(1, self.store.queues.bundle_size)

    async def _drain(self, deadline: float) -> None:
        """On stop: let running tasks finish by ``deadline`` (the grace period), then
        release them (and the backlog, which is not started)."""
        async with self._backlog_lock:  # a give-back under way finishes first
            self._draining = True
        waiting = list(self._backlog)
        self._backlog.clear()
        in_flight = [r for r in self._running.values() if r.job is not None]
        jobs = [r.job for r in in_flight if r.job is not None]
        if not jobs and not waiting:
            return
        log.info(
            "waiting up to %gs for %d running task(s)", self.options.shutdown_grace_s, len(jobs)
        )
        unfinished: set[asyncio.Task[None]] = set()
        if jobs:
            left_s = max(0.0, deadline - asyncio.get_running_loop().time())
            _, unfinished = await asyncio.wait(jobs, timeout=left_s)
        for job in unfinished:
            job.cancel()
        await asyncio.gather(*unfinished, return_exceptions=True)
        # A cancelled job removes itself from ``_running``: release from the list taken above.
        left: dict[int, tuple[Held, list[TaskMessage]]] = {}
        for running in in_flight + waiting:
            if running.reported or running.held.lost:
                continue
            if running.job is None or running.job in unfinished:
                left.setdefault(id(running.held), (running.held, []))[1].append(running.task)
        for held, tasks in left.values():
            try:
                await self._release(held, tasks)
            except Exception as exc:  # it comes back after its visibility timeout
                log.warning("releasing message %s failed: %s", held.message.id, _brief(exc))
        self._running.clear()

    async def _release(self, held: Held, tasks: list[TaskMessage]) -> None:
        """Hand tasks not run back to the queue at once."""
        if held.untouched and held.open == len(tasks):  # release it whole
            async with held.lock:
                await self.store.queues.extend(held.queue, held.receipt, 0)
            return
        # Part reported or given back: the rest goes back too; the message is deleted
        # once the reports are out (the outbox is closed after this).
        await give_back(self.store, held.queue, tasks, self._bundle_size)
        done = held.given_back(len(tasks))
        if done is not None:
            self._outbox.acknowledge(done)

    # --- one task ---------------------------------------------------------------------

    async def _handle(self, running: _Running) -> None:
        """Run one task and report it. A fault of the worker's own while doing so fails
        this attempt (reported as a failure), and nothing else."""
        task = running.task
        trace = attempts.begin(
            self.store.url, task, running.held.queue, running.kept_at, self.clock()
        )
        running.trace = trace
        # This job's log lines are about this attempt (its own context: no reset).
        context.current.set(
            context.Concern(task.workflow_id, trace.name, task.attempt, trace.span_id)
        )
        try:
            why = await self._stop_reason(task)
            if why is not None:
                # Say so: if this attempt was running when a worker died, the coordinator
                # is waiting for word of it before the cancellation can finish.
                outcome = Outcome(ok=False, error=f"not run: {why}", retryable=False)
                await self._finish(running, outcome, self.clock())
                return
            self._outbox.post_nowait(
                TaskStarted(
                    workflow_id=task.workflow_id,
                    task=task.task,
                    attempt=task.attempt,
                    at=self.clock(),
                    worker=self.options.name,
                    undo=task.undo,
                    item=task.item_index,
                    delivery=running.held.message.dequeue_count,
                )
            )
            started = self.clock()
            running.cancel_file = self._cancel_file()
            running.executing = True
            try:
                outcome = await self._execute(
                    task,
                    queue=running.held.queue,
                    cancel_file=running.cancel_file,
                    traceparent=trace.traceparent,
                )
            except asyncio.CancelledError:
                if not running.stopping:
                    raise  # worker shutdown: the message goes back to the queue
                outcome = Outcome(ok=False, error=f"stopped: {running.stopping}", retryable=False)
            except Exception as exc:  # the worker's own fault, not the task's
                log.error("task %s: the worker failed running it", running.key, exc_info=exc)
                outcome = Outcome(ok=False, error=f"the worker failed running it: {_brief(exc)}")
            finally:
                running.executing = False
                self._attempt_ended(running)
            await self._finish(running, outcome, started)
            self.completed += 1
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # The message stays in the queue and comes back after its visibility timeout.
            if isinstance(exc, DagqError):
                log.warning(
                    "task %s could not be reported, it will be redelivered: %s", running.key, exc
                )
            else:
                log.error(
                    "task %s could not be reported, it will be redelivered",
                    running.key,
                    exc_info=exc,
                )
            if running.reported:
                running.held.failed = True  # its report may not have gone: keep the message
            else:
                running.held.report_failed()
        finally:
            if trace.span_id:  # it did not end here: its wait span goes alone
                attempts.abandoned(trace)
            self._running.pop(running.key, None)
            self._free_slot(running)
            self._wake_serving()

    async def _finish(self, running: _Running, outcome: Outcome, started: float) -> None:
        """Report an attempt's outcome (and free its slot); return once it is durable.

        A report the outbox refuses for good (a permanent error: too large, say) is
        replaced by a small failure event for that attempt, so the coordinator hears of
        it and the other reports go on.
        """
        task = running.task
        trace = running.trace
        traceparent = "" if trace is None else trace.traceparent
        try:
            report = await self._report(task, outcome, started, traceparent)
        except DagqError:
            raise  # a store error: the message comes back, and the task runs again
        except Exception as exc:
            log.error("task %s: its report could not be made", running.key, exc_info=exc)
            report = _failure_event(self._bare_report(task, started), exc)
            if traceparent:
                report = msgspec.structs.replace(report, traceparent=traceparent)
        running.reported = True
        if trace is not None:
            attempts.end(
                trace,
                ok=report.ok,
                duration_s=report.duration_s,
                error_type=report.error_type,
                end_s=self.clock(),
            )
        self._free_slot(running)
        ack = running.held.reported()
        try:
            await self._outbox.post(report, ack=ack)
        except Exception as exc:
            if isinstance(exc, DagqError) and not isinstance(exc, PermanentError):
                raise
            await self._outbox.post(_failure_event(report, exc), ack=ack)

    def _bare_report(self, task: TaskMessage, started: float) -> TaskFinished:
        now = self.clock()
        return TaskFinished(
            workflow_id=task.workflow_id,
            task=task.task,
            attempt=task.attempt,
            at=now,
            ok=False,
            undo=task.undo,
            item=task.item_index,
            duration_s=now - started,
            worker=self.options.name,
        )

    async def _execute(
        self, task: TaskMessage, *, queue: str = "", cancel_file: str = "", traceparent: str = ""
    ) -> Outcome:
        try:
            task = await self._whole(task)
        except DagqError as exc:
            return Outcome(ok=False, error=f"cannot load the task message: {exc}")
        # A Python task in a pool process decodes stored inputs there (see StoredInputs).
        in_pool = self._pool is not None and task.spec.kind != "shell"
        by_reference = task.inputs_ref is not None or bool(task.input_refs)
        stored: StoredInputs | None = None
        try:
            if in_pool and by_reference and not task.spec.render_args:
                stored = await self._stored_inputs(task)
                inputs: dict[str, Any] = {}
            else:
                inputs = await self._inputs(task)
        except DagqError as exc:
            return Outcome(ok=False, error=f"cannot load upstream outputs: {exc}")
        try:
            previous = await self._previous(task)
        except DagqError as exc:
            return Outcome(ok=False, error=f"cannot load the previous iteration's output: {exc}")
        try:
            item = await self._item(task)
        except DagqError as exc:
            return Outcome(ok=False, error=f"cannot load this instance's item: {exc}")
        ctx = TaskContext(
            workflow_id=task.workflow_id,
            task=task.name if task.item_index < 0 else f"{task.name}[{task.item_index}]",
            attempt=task.attempt,
            idempotency_key=task.idempotency_key,
            inputs=inputs,
            iteration=task.iteration,
            previous=previous,
            item=item,
            index=task.item_index,
            task_id=keys.message_id(
                task.workflow_id,
                keys.attempt_name(task.name, item=task.item_index, undo=task.undo),
                task.attempt,
            ),
            cancel_file=cancel_file,
            traceparent=traceparent,
        )
        spec = task.spec
        if task.timeout_s is not None:  # the task's deadline leaves this attempt less time
            spec = msgspec.structs.replace(spec, timeout_s=task.timeout_s)
        live = LiveLog(
            self.store.documents,
            keys.live_log_prefix(
                task.workflow_id, task.task, task.attempt, item=task.item_index, undo=task.undo
            ),
        )
        try:
            return await self._run(task, spec, ctx, inputs, stored, queue=queue, live=live)
        finally:
            await live.close()

    async def _run(
        self,
        task: TaskMessage,
        spec: TaskSpec,
        ctx: TaskContext,
        inputs: dict[str, Any],
        stored: StoredInputs | None,
        *,
        queue: str,
        live: LiveLog,
    ) -> Outcome:
        """Run the attempt with the runner its kind needs."""
        if spec.kind == "shell":
            return await run_shell(spec, ctx, work_dir=self.options.work_dir, live=live.write)
        processor = spec.kind == "processor"
        if processor:
            if self.options.processor is None:
                return Outcome(ok=False, error=_needs_processor(queue), retryable=False)
            spec = msgspec.structs.replace(spec, call=self.options.processor)
        args = task.spec.args
        if task.spec.render_args:
            env = {"inputs": inputs, "params": task.spec.params}
            try:
                args = expression.render(args, env, roots=_ARG_ROOTS)
            except expression.ExpressionError as exc:
                return Outcome(
                    ok=False, error=f"args could not be rendered: {exc}", retryable=False
                )
        return await run_python(
            spec,
            ctx,
            args,
            pool=self._pool,
            executor=self._executor,
            processor=processor,
            inputs=stored,
            live=live.write,
        )

    def _attempt_ended(self, running: _Running) -> None:
        """Its cancel files are no longer needed. One the worker made (it had to stop)
        goes at once; the rest are swept together now and then — most never exist,
        and looking for them one by one cost two system calls a task."""
        if not running.cancel_file:
            return
        if running.stopping:
            _remove_cancel_files(running.cancel_file)
            return
        self._ended_attempts += 1
        if self._ended_attempts >= _SWEEP_EVERY:
            self._sweep_cancel_files()

    def _sweep_cancel_files(self) -> None:
        """Remove the cancel files of the attempts that are no longer running."""
        self._ended_attempts = 0
        if self._scratch is None:
            return
        live = {
            os.path.basename(r.cancel_file)
            for r in self._running.values()
            if r.executing and r.cancel_file
        }
        with contextlib.suppress(OSError), os.scandir(self._scratch) as entries:
            for entry in entries:
                if entry.name.removesuffix(WATCHED_SUFFIX) not in live:
                    with contextlib.suppress(OSError):
                        os.unlink(entry.path)

    def _cancel_file(self) -> str:
        """A path for the next attempt's cancel file (created only if it must stop)."""
        if self._scratch is None:
            self._scratch = tempfile.mkdtemp(prefix="dagq-worker-", dir=self.options.work_dir)
        return os.path.join(self._scratch, f"{next(self._attempts)}.cancel")

    async def _whole(self, task: TaskMessage) -> TaskMessage:
        """A task message sent by reference (its spec, or all of it), loaded whole."""
        if task.body_ref is not None:
            doc = await self.store.documents.get(task.body_ref)
            if doc is None:
                raise DagqError(f"{task.body_ref} is missing")
            try:
                task = decode_task(doc.data)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                raise DamagedData(f"{task.body_ref} cannot be decoded: {exc}") from None
        if task.spec_ref is not None:
            cached = (task.run, task.spec_ref)
            spec = self._documents.get(cached)  # shared by attempts and instances
            if not isinstance(spec, TaskSpec):
                doc = await self.store.documents.get(task.spec_ref)
                if doc is None:
                    raise DagqError(f"the task's spec ({task.spec_ref}) is missing")
                try:
                    spec = msgspec.msgpack.decode(doc.data, type=TaskSpec)
                except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:
                    raise DamagedData(f"{task.spec_ref} is not a task spec: {exc}") from None
                _remember(self._documents, cached, spec)
            task = msgspec.structs.replace(task, spec=spec, spec_ref=None)
        return task

    async def _item(self, task: TaskMessage) -> Any:
        """A foreach instance's item: in its message, or in the group's items document."""
        if task.item_ref is None:
            return task.item
        items = await self._document(task, task.item_ref, "the items of this foreach")
        return items[task.item_index]

    async def _previous(self, task: TaskMessage) -> Any:
        if task.previous_ref is None:
            return task.previous
        doc = await self.store.documents.get(task.previous_ref)
        if doc is None:
            raise DagqError(f"{task.previous_ref} is missing")
        return await off_loop(len(doc.data), payloads.decode_json, doc.data, task.previous_ref)

    async def _inputs(self, task: TaskMessage) -> dict[str, Any]:
        inputs = dict(task.inputs)
        if task.inputs_ref is not None:
            inputs.update(await self._document(task, task.inputs_ref, "inputs document"))
        for name, ref in task.input_refs.items():
            inputs[name] = await self._document(task, ref, f"the output of '{name}'")
        return inputs

    async def _stored_inputs(self, task: TaskMessage) -> StoredInputs:
        """The task's inputs as stored, for a pool process to decode."""
        document = None
        if task.inputs_ref is not None:
            document = await self._raw(task, task.inputs_ref, "inputs document")
        outputs = [
            (name, ref, await self._raw(task, ref, f"the output of '{name}'"))
            for name, ref in task.input_refs.items()
        ]
        return StoredInputs(dict(task.inputs), document, task.inputs_ref or "", tuple(outputs))

    async def _document(self, task: TaskMessage, key: str, what: str) -> Any:
        """A stored output or inputs document of ``task``'s run, decoded. They never
        change once written, so the few most recent are kept: a foreach's instances
        share their inputs."""
        cached = (task.run, key)
        if cached in self._documents:
            return self._documents[cached]
        data = await self._raw(task, key, what, keep=False)  # the decoded value is kept
        # An output may weigh up to payloads.MAX_OUTPUT_BYTES: a large one is decoded
        # in a thread.
        value = await off_loop(len(data), payloads.decode_json, data, f"{what} ({key})")
        if len(data) <= DOCUMENT_CACHE_BYTES:
            _remember(self._documents, cached, value)
        return value

    async def _raw(self, task: TaskMessage, key: str, what: str, *, keep: bool = True) -> bytes:
        """A stored output or inputs document of ``task``'s run as it is stored (the few
        most recent are kept if ``keep``, as by :meth:`_document`)."""
        cached = (task.run, key)
        data = self._raw_documents.get(cached)
        if data is None:
            doc = await self.store.documents.get(key)
            if doc is None:
                raise DagqError(f"{what} ({key}) is missing")
            data = doc.data
            if keep and len(data) <= DOCUMENT_CACHE_BYTES:
                _remember(self._raw_documents, cached, data)
        return data

    async def _report(
        self, task: TaskMessage, outcome: Outcome, started: float, traceparent: str = ""
    ) -> TaskFinished:
        """The completion event (naming the attempt's ``process`` span by its
        ``traceparent``, telemetry on); large outputs, logs and errors are stored first."""
        return await reporting.finished(
            self.store.documents,
            task,
            outcome,
            started=started,
            clock=self.clock,
            worker=self.options.name,
            traceparent=traceparent,
        )

    # --- heartbeats and cancellation ----------------------------------------------------

    async def _heartbeat(self) -> None:
        """Keep running messages invisible, and stop tasks of cancelled workflows."""
        vt = self.options.visibility_timeout_s
        period = max(0.05, min(vt / 3, self.options.cancel_check_s))
        while True:
            await asyncio.sleep(period)
            now = self.clock()
            await self._return_backlog(now)
            holds: dict[int, Held] = {}
            for running in list(self._running.values()):
                if running.reported or not running.busy:  # not running: nothing to stop
                    holds[id(running.held)] = running.held
                    continue
                why = await self._stop_reason(running.task)
                if why is not None and running.job and running.executing and not running.stopping:
                    self._stop(running, why)
                holds[id(running.held)] = running.held
            # A held message is renewed until its delete is committed (a report may
            # wait for the store a while). Renewals go out together: a slow store
            # must not leave the last of many held messages unrenewed.
            due = [
                held
                for held in holds.values()
                if now - held.extended_at >= vt / 3
                and not (held.lost or held.deleted or held.lock.locked())
            ]
            if due:
                await asyncio.gather(*(self._renew(held, now, vt) for held in due))

    def _stop(self, running: _Running, why: str) -> None:
        """Stop a running task: its cancel file says so at once; a task that watches it
        (:func:`dagq.jobq.is_cancelled`) gets ``cancel_notice_s`` to end on its own."""
        running.stopping = why
        watched = False
        if running.cancel_file:
            try:
                with open(running.cancel_file, "w", encoding="utf-8") as file:
                    file.write(why)
                watched = os.path.exists(running.cancel_file + WATCHED_SUFFIX)
            except OSError as exc:
                log.warning("task %s: cannot create its cancel file: %s", running.key, exc)
        notice = self.options.cancel_notice_s
        if watched and notice > 0:
            log.info("task %s must stop (%s): it gets %gs to end", running.key, why, notice)
            asyncio.get_running_loop().call_later(notice, _cancel, running)
        else:
            _cancel(running)

    async def _renew(self, held: Held, now: float, vt: float) -> None:
        """Extend one held message's visibility, under its lock: a delete never uses a
        receipt that this renewal is replacing."""
        async with held.lock:
            if not (held.lost or held.deleted):  # else deleted (or lost) while we waited
                await self._extend(held, now, vt)

    async def _extend(self, held: Held, now: float, vt: float) -> None:
        try:
            held.receipt = await self.store.queues.extend(held.queue, held.receipt, vt)
            held.extended_at = now
        except MessageLost:
            if held.open > 0:  # else its delete, under way, won the race: all is well
                log.warning("message %s was redelivered elsewhere", held.message.id)
            held.lost = True
        except DagqError as exc:
            log.warning("heartbeat for %s failed: %s", held.message.id, exc)

    async def _stop_reason(self, task: TaskMessage) -> str | None:
        """Why this attempt must stop (its workflow was cancelled, or it lost a race), if so.

        The workflow's control document is read at most once a second per workflow
        (``cancel_check_s``), and not for an attempt dispatched less than that ago: the
        coordinator knew the workflow to be running then, so what is known is as fresh
        as a read a moment before would be (clocks of coordinator and worker assumed to
        agree within ``cancel_check_s``). A chain's steps and many small workflows do
        not pay a read per task.
        """
        now = self.clock()
        check = self.options.cancel_check_s
        cached = self._controls.get(task.workflow_id)
        if task.dispatched_at and abs(now - task.dispatched_at) < check:
            if cached is None or cached[0] < task.dispatched_at:
                cached = (task.dispatched_at, _Control())  # not kept: nothing was read
        elif cached is None or now - cached[0] >= check:
            control = await self._control_of(task.workflow_id)
            if len(self._controls) > 10_000:
                self._controls.clear()
            cached = self._controls[task.workflow_id] = (now, control)
        control = cached[1]
        if control is _DAMAGED:
            return "the workflow's control document is damaged"
        if not control.covers(task):  # a purged namesake's marker
            return None
        if task.epoch <= control.stop_through:
            return "the workflow was cancelled or has ended"
        if control.tasks.get(str(task.task)) == task.attempt:
            return "it lost a race (another branch won)"
        return None

    async def _control_of(self, workflow_id: str) -> _Control:
        """A workflow's control document, read once for every task that asks at once
        (the tasks of a bundle start together)."""
        reading = self._control_reads.get(workflow_id)
        if reading is None:
            reading = asyncio.ensure_future(self._read_control_document(workflow_id))
            self._control_reads[workflow_id] = reading
            reading.add_done_callback(lambda _: self._control_reads.pop(workflow_id, None))
        return await asyncio.shield(reading)

    async def _read_control_document(self, workflow_id: str) -> _Control:
        try:
            doc = await self.store.documents.get(keys.control(workflow_id))
        except DagqError:
            return _Control()
        return _Control() if doc is None else _read_control(doc.data)


class _Control(msgspec.Struct, frozen=True):
    """A workflow's control document: stop every attempt sent in epochs up to
    ``stop_through`` (a cancelled or finished run), and these attempts (lost races)."""

    stop_through: int = -1
    tasks: dict[str, int] = msgspec.field(default_factory=dict)
    #: The run it is about (its ``created_at``); None in documents written before
    #: markers named their run.
    run: float | None = None

    def covers(self, task: TaskMessage) -> bool:
        """Is it about the run ``task`` belongs to? A marker left by a forced purge
        stays when a namesake is submitted (nobody deletes it: that cost a request a
        run), and must not stop the namesake's tasks. A message that names no run, or
        a marker that does not, is covered as before — but for the old forced purge's
        stop-everything marker, which covers only messages of its time (naming none)."""
        if self.run is not None:
            return not task.run or task.run == self.run
        return not task.run or self.stop_through < _PURGED_RUN


#: A stop-everything marker's ``stop_through`` (a forced purge's) is at least this.
_PURGED_RUN = 2**62
#: What an unreadable control document says: stop everything (it may have said so),
#: for that reason.
_DAMAGED = _Control(stop_through=2**31)


def _read_control(data: bytes) -> _Control:
    try:
        return msgspec.json.decode(data, type=_Control)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return _DAMAGED  # unreadable: err on the side of stopping


def _cancel(running: _Running) -> None:
    """Cancel a task still inside its run (not one that ended and is reporting)."""
    if running.job is not None and running.executing:
        running.job.cancel()


#: Cancel files are swept once this many attempts have ended (see _attempt_ended).
_SWEEP_EVERY = 256


def _remove_cancel_files(path: str) -> None:
    if path:
        for name in (path, path + WATCHED_SUFFIX):
            with contextlib.suppress(OSError):
                os.unlink(name)


def _needs_processor(queue: str) -> str:
    """Why a task that says what to run only through its kwargs was not run here."""
    return (
        "this task says what to run only through its kwargs, so it needs a worker started "
        f"with a processor: dagq worker -q {queue or 'QUEUE'} --processor module:function "
        "(or dagq run FILE --processor module:function)"
    )


def _brief(exc: BaseException) -> str:
    """``ExceptionType: message``, the message cut to a few lines."""
    return cut(describe(exc), 500)


def _failure_event(report: TaskFinished, exc: BaseException) -> TaskFinished:
    """A small stand-in for a report that could not be made or posted: the attempt
    failed, saying why (with the start of what it would have said)."""
    said = "" if report.ok or not report.error else f"; it said: {cut(report.error, 1000)}"
    return msgspec.structs.replace(
        report,
        ok=False,
        output=None,
        output_ref=None,
        error=f"its report could not be sent ({_brief(exc)}){said}",
        retryable=report.retryable,
    )


async def _first(*waits: Any, keep: asyncio.Future[Any] | None = None) -> None:
    """Wait until the first of several awaitables finishes; cancel the rest (but
    ``keep``, a future shared by several waits)."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            if t is not keep:
                t.cancel()


def _attempt_id(task: TaskMessage) -> str:
    """An attempt as a worker's record names it: its message id."""
    name = keys.attempt_name(task.name, item=task.item_index, undo=task.undo)
    return keys.message_id(task.workflow_id, name, task.attempt)


def _remember(cache: dict[tuple[float, str], _V], key: tuple[float, str], value: _V) -> None:
    """Keep ``value`` in a cache of the 16 most recently added documents."""
    if len(cache) >= _DOCUMENTS_KEPT:
        cache.pop(next(iter(cache)))
    cache[key] = value
