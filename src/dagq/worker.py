"""The worker: takes task messages from its queues, runs them, reports the outcome.

For each message: keep it invisible while the task runs (heartbeats), run it, store
a large output as a document, post the completion event, and only then delete the
message (DESIGN invariant 5). A worker never writes runtime state.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import msgspec

from dagq import expression, keys
from dagq.errors import DagqError, MessageLost
from dagq.leasing import default_owner
from dagq.messages import (
    OUTPUT_INLINE_LIMIT,
    TaskFinished,
    TaskMessage,
    TaskStarted,
    decode_task,
)
from dagq.outbox import Outbox
from dagq.runners import Outcome, TaskContext
from dagq.runners.python import add_import_paths, run_python
from dagq.runners.shell import run_shell
from dagq.stores.base import Message, Store

log = logging.getLogger("dagq.worker")

_ARG_ROOTS = frozenset({"inputs", "params"})
#: Decoded documents up to this size are kept for the next task that needs them.
DOCUMENT_CACHE_BYTES = 8 * 1024 * 1024
#: The name prefix of the threads that run synchronous Python tasks.
TASK_THREAD_PREFIX = "dagq-task"
_FIRST_POLL_S = 0.005


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
    work_dir: str | None = None
    name: str = field(default_factory=default_owner)


@dataclass(eq=False)
class _Running:
    message: Message
    task: TaskMessage
    receipt: str
    extended_at: float
    job: asyncio.Task[None] | None = None
    lost: bool = False
    #: Why the task is being stopped (empty: it is not).
    stopping: str = ""

    @property
    def queue(self) -> str:
        """The queue the message came from."""
        return self.message.queue


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
        self._running: dict[str, _Running] = {}
        self._slot_freed = asyncio.Event()
        self._outbox = Outbox(store, keys.COMPLETIONS_QUEUE)
        self._executor = ThreadPoolExecutor(
            max_workers=self.options.concurrency, thread_name_prefix=TASK_THREAD_PREFIX
        )
        self._controls: dict[str, tuple[float, _Control]] = {}
        #: Immutable documents (items, outputs, inputs) lately decoded, by key.
        self._documents: dict[str, Any] = {}
        add_import_paths(self.options.import_paths)

    # --- the loop ---------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set (or idle too long), then drain gracefully."""
        self._outbox.start()
        keeper = asyncio.create_task(self._heartbeat(), name="dagq-heartbeat")
        try:
            await self._serve(stop)
        finally:
            await self._drain()
            keeper.cancel()
            await asyncio.gather(keeper, return_exceptions=True)
            await self._outbox.close()
            self._executor.shutdown(wait=False, cancel_futures=True)

    async def _serve(self, stop: asyncio.Event) -> None:
        idle_since = self.clock()
        queue_index = 0
        poll = _FIRST_POLL_S
        while not stop.is_set():
            free = self.options.concurrency - len(self._running)
            if free <= 0:
                self._slot_freed.clear()
                await _first(self._slot_freed.wait(), stop.wait())
                continue
            got = asked = 0
            for offset in range(len(self.options.queues)):
                queue = self.options.queues[(queue_index + offset) % len(self.options.queues)]
                want = min(free - got, self.options.batch_size)
                asked += want
                got += await self._take(queue, want)
                if got >= free:
                    break
            queue_index += 1
            if got or self._running:
                idle_since = self.clock()
            if got:
                poll = _FIRST_POLL_S
                if got >= asked:  # there may be more; otherwise wait (no send is missed)
                    continue
            idle = self.options.idle_timeout_s
            if not got and idle is not None and self.clock() - idle_since >= idle:
                log.info("idle for %.0fs, stopping", idle)
                return
            # Cleared here too: left set by an earlier finished task, it would turn this
            # idle wait into a busy loop of empty receives.
            self._slot_freed.clear()
            # Across processes ``wait`` is a sleep: poll soon after work, then back off.
            waits = [self.store.queues.wait(q, poll) for q in self.options.queues]
            await _first(*waits, stop.wait(), self._slot_freed.wait())
            poll = min(poll * 2, self.options.poll_interval_s)

    async def _take(self, queue: str, n: int) -> int:
        if n <= 0:
            return 0
        try:
            messages = await self.store.queues.receive(
                queue, max_messages=n, visibility_timeout_s=self.options.visibility_timeout_s
            )
        except DagqError as exc:
            log.warning("receiving from %r failed, retrying: %s", queue, exc)
            await asyncio.sleep(self.options.poll_interval_s)
            return 0
        for message in messages:
            try:
                task = decode_task(message.body)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                log.error("unreadable task message %s dead-lettered: %s", message.id, exc)
                with contextlib.suppress(DagqError):  # else it is redelivered, then buried
                    await self.store.queues.dead_letter(
                        queue, message.receipt, f"cannot be parsed: {exc}"
                    )
                continue
            running = _Running(message, task, message.receipt, self.clock())
            self._running[message.id] = running
            running.job = asyncio.create_task(self._handle(running), name=f"dagq-task-{message.id}")
        return len(messages)

    async def _drain(self) -> None:
        """On stop: let running tasks finish within the grace period, then release them."""
        in_flight = [r for r in self._running.values() if r.job is not None]
        jobs = [r.job for r in in_flight if r.job is not None]
        if not jobs:
            return
        log.info(
            "waiting up to %gs for %d running task(s)", self.options.shutdown_grace_s, len(jobs)
        )
        _, unfinished = await asyncio.wait(jobs, timeout=self.options.shutdown_grace_s)
        for job in unfinished:
            job.cancel()
        await asyncio.gather(*unfinished, return_exceptions=True)
        # A cancelled job removes itself from ``_running``: release from the list taken above.
        for running in in_flight:
            if running.job in unfinished and not running.lost:
                with contextlib.suppress(DagqError):  # hand it back to the queue at once
                    await self.store.queues.extend(running.message.queue, running.receipt, 0)
        self._running.clear()

    # --- one task ---------------------------------------------------------------------

    async def _handle(self, running: _Running) -> None:
        message, task = running.message, running.task
        try:
            why = await self._stop_reason(task)
            if why is not None:
                # Say so: if this attempt was running when a worker died, the coordinator
                # is waiting for word of it before the cancellation can finish.
                outcome = Outcome(ok=False, error=f"not run: {why}", retryable=False)
                report = await self._report(task, outcome, self.clock())
                await self._outbox.post(report, ack=running)
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
                )
            )
            started = self.clock()
            try:
                outcome = await self._execute(task)
            except asyncio.CancelledError:
                if not running.stopping:
                    raise  # worker shutdown: the message goes back to the queue
                outcome = Outcome(ok=False, error=f"stopped: {running.stopping}", retryable=False)
            finished = await self._report(task, outcome, started)
            await self._outbox.post(finished, ack=None if running.lost else running)
            self.completed += 1
        except asyncio.CancelledError:
            raise
        except DagqError as exc:
            # The message stays in the queue and comes back after its visibility timeout.
            log.warning(
                "task %s could not be reported, it will be redelivered: %s", message.id, exc
            )
        finally:
            self._running.pop(message.id, None)
            self._slot_freed.set()

    async def _execute(self, task: TaskMessage) -> Outcome:
        try:
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
        )
        spec = task.spec
        if task.timeout_s is not None:  # the task's deadline leaves this attempt less time
            spec = msgspec.structs.replace(spec, timeout_s=task.timeout_s)
        if spec.kind == "shell":
            return await run_shell(spec, ctx, work_dir=self.options.work_dir)
        args = task.spec.args
        if task.spec.render_args:
            env = {"inputs": inputs, "params": task.spec.params}
            try:
                args = expression.render(args, env, roots=_ARG_ROOTS)
            except expression.ExpressionError as exc:
                return Outcome(
                    ok=False, error=f"args could not be rendered: {exc}", retryable=False
                )
        return await run_python(spec, ctx, args, executor=self._executor)

    async def _item(self, task: TaskMessage) -> Any:
        """A foreach instance's item: in its message, or in the group's items document."""
        if task.item_ref is None:
            return task.item
        items = await self._document(task.item_ref, "the items of this foreach")
        return items[task.item_index]

    async def _previous(self, task: TaskMessage) -> Any:
        if task.previous_ref is None:
            return task.previous
        doc = await self.store.documents.get(task.previous_ref)
        if doc is None:
            raise DagqError(f"{task.previous_ref} is missing")
        return msgspec.json.decode(doc.data)

    async def _inputs(self, task: TaskMessage) -> dict[str, Any]:
        inputs = dict(task.inputs)
        if task.inputs_ref is not None:
            inputs.update(await self._document(task.inputs_ref, "inputs document"))
        for name, ref in task.input_refs.items():
            inputs[name] = await self._document(ref, f"the output of '{name}'")
        return inputs

    async def _document(self, key: str, what: str) -> Any:
        """A stored output or inputs document, decoded. They never change once written,
        so the few most recent are kept: a foreach's instances share their inputs."""
        if key in self._documents:
            return self._documents[key]
        doc = await self.store.documents.get(key)
        if doc is None:
            raise DagqError(f"{what} ({key}) is missing")
        value = msgspec.json.decode(doc.data)
        if len(doc.data) <= DOCUMENT_CACHE_BYTES:
            if len(self._documents) >= 16:
                self._documents.pop(next(iter(self._documents)))
            self._documents[key] = value
        return value

    async def _report(self, task: TaskMessage, outcome: Outcome, started: float) -> TaskFinished:
        """The completion event; large outputs and logs are stored as documents first."""
        docs = self.store.documents
        if outcome.log:
            await docs.put(keys.log(task.workflow_id, task.task, task.attempt), outcome.log)
        output, output_ref, error = outcome.output, None, outcome.error
        ok, retryable = outcome.ok, outcome.retryable
        if ok and output is not None:
            try:
                encoded = msgspec.json.encode(output)
            except (TypeError, msgspec.EncodeError) as exc:
                ok, retryable, output = False, False, None
                error = f"the output is not JSON-serialisable: {exc}"
            else:
                if len(encoded) > OUTPUT_INLINE_LIMIT:
                    output_ref = keys.output(task.workflow_id, task.task, task.attempt)
                    await docs.put(output_ref, encoded)
                    output = None
        now = self.clock()
        return TaskFinished(
            workflow_id=task.workflow_id,
            task=task.task,
            attempt=task.attempt,
            at=now,
            ok=ok,
            output=output,
            output_ref=output_ref,
            error=error,
            retryable=retryable,
            retry_after_s=outcome.retry_after_s,
            error_type=outcome.error_type,
            undo=task.undo,
            item=task.item_index,
            duration_s=now - started,
            worker=self.options.name,
        )

    # --- heartbeats and cancellation ----------------------------------------------------

    async def _heartbeat(self) -> None:
        """Keep running messages invisible, and stop tasks of cancelled workflows."""
        vt = self.options.visibility_timeout_s
        period = max(0.05, min(vt / 3, self.options.cancel_check_s))
        while True:
            await asyncio.sleep(period)
            now = self.clock()
            for running in list(self._running.values()):
                why = await self._stop_reason(running.task)
                if why is not None and running.job:
                    if not running.stopping:
                        running.stopping = why
                        running.job.cancel()
                    continue
                if now - running.extended_at < vt / 3 or running.lost:
                    continue
                try:
                    running.receipt = await self.store.queues.extend(
                        running.message.queue, running.receipt, vt
                    )
                    running.extended_at = now
                except MessageLost:
                    log.warning("message %s was redelivered elsewhere", running.message.id)
                    running.lost = True
                except DagqError as exc:
                    log.warning("heartbeat for %s failed: %s", running.message.id, exc)

    async def _stop_reason(self, task: TaskMessage) -> str | None:
        """Why this attempt must stop (its workflow was cancelled, or it lost a race), if so.

        The workflow's control document is read at most once a second per workflow.
        """
        now = self.clock()
        cached = self._controls.get(task.workflow_id)
        if cached is None or now - cached[0] >= self.options.cancel_check_s:
            try:
                doc = await self.store.documents.get(keys.control(task.workflow_id))
                control = _Control() if doc is None else _read_control(doc.data)
            except DagqError:
                control = _Control()
            if len(self._controls) > 10_000:
                self._controls.clear()
            cached = self._controls[task.workflow_id] = (now, control)
        control = cached[1]
        if task.epoch <= control.stop_through:
            return "the workflow was cancelled or has ended"
        if control.tasks.get(str(task.task)) == task.attempt:
            return "it lost a race (another branch won)"
        return None


class _Control(msgspec.Struct, frozen=True):
    """A workflow's control document: stop every attempt sent in epochs up to
    ``stop_through`` (a cancelled or finished run), and these attempts (lost races)."""

    stop_through: int = -1
    tasks: dict[str, int] = msgspec.field(default_factory=dict)


def _read_control(data: bytes) -> _Control:
    try:
        return msgspec.json.decode(data, type=_Control)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return _Control(stop_through=2**31)  # unreadable: err on the side of stopping


async def _first(*waits: Any) -> None:
    """Wait until the first of several awaitables finishes; cancel the rest."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
