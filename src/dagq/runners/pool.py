"""A pool of long-lived processes that run Python tasks, one task at a time each.

A Python task runs in a child process, not in the worker, so that it can fail alone:
one that calls ``os._exit``, segfaults or is killed for its memory fails its attempt
(retried per its policy) and the worker goes on; one past its timeout, or cancelled,
has its process killed (a thread could not be stopped) and the next task gets a
fresh one. As in Celery's prefork pool the processes live on from task to task — a
process per task would cost a tenth of a second each — and a round trip is a pickle
each way over two pipes (:mod:`dagq.runners.child` is the other end).

There is at most one process per worker slot. The first starts with the worker
(:meth:`TaskPool.warm`) or when the first task needs it; another only when a task has
waited :data:`GROW_AFTER_S` for one (quick tasks share a few processes, slow ones get
one each), and a dead one is replaced the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import signal
import sys
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

import dagq
from dagq.runners import Outcome, TaskContext
from dagq.runners.child import HEADER, Reply, Request

log = logging.getLogger("dagq.worker")

#: A task that has waited this long for a process gets a new one (if the pool may grow).
GROW_AFTER_S = 0.05
#: How many processes may be starting at once.
MAX_STARTING = 2
#: On close, how long idle processes get to exit before they are killed.
CLOSE_GRACE_S = 1.0
_DAGQ_ROOT = str(Path(dagq.__file__).resolve().parent.parent)
_BOOT = (
    "import sys; sys.path.insert(0, sys.argv.pop(1)); "
    "from dagq.runners.child import main; main(sys.argv[1:])"
)


class PoolClosed(Exception):
    """The pool was closed while a task waited for a process."""


@dataclass(eq=False)
class _Process:
    """One pool process and the pipes to it."""

    process: asyncio.subprocess.Process
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    read_transport: asyncio.BaseTransport
    #: The import path it was last given.
    paths: list[str] = field(default_factory=list)
    killed: bool = False

    @classmethod
    async def start(cls) -> _Process:
        loop = asyncio.get_running_loop()
        requests_in, requests_out = os.pipe()
        replies_in, replies_out = os.pipe()
        try:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                _BOOT,
                _DAGQ_ROOT,
                str(requests_in),
                str(replies_out),
                str(os.getpid()),
                stdin=asyncio.subprocess.DEVNULL,
                pass_fds=(requests_in, replies_out),
                start_new_session=True,  # its own group: killing it kills what it started
            )
        except BaseException:
            for fd in (requests_out, replies_in):
                os.close(fd)
            raise
        finally:
            os.close(requests_in)
            os.close(replies_out)
        reader = asyncio.StreamReader(limit=2**31)
        read_transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(replies_in, "rb", 0)
        )
        write_transport, protocol = await loop.connect_write_pipe(
            asyncio.streams.FlowControlMixin, os.fdopen(requests_out, "wb", 0)
        )
        writer = asyncio.StreamWriter(write_transport, protocol, None, loop)
        return cls(process, reader, writer, read_transport)

    @property
    def alive(self) -> bool:
        return not self.killed and self.process.returncode is None

    async def call(self, request: bytes) -> Reply:
        self.writer.write(HEADER.pack(len(request)))
        self.writer.write(request)
        await self.writer.drain()
        (size,) = HEADER.unpack(await self.reader.readexactly(HEADER.size))
        reply: Reply = pickle.loads(await self.reader.readexactly(size))
        return reply

    def kill(self) -> None:
        """Kill it and whatever it started (its process group)."""
        if self.process.returncode is None and not self.killed:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
        self.killed = True

    def close_pipes(self) -> None:
        self.writer.close()
        self.read_transport.close()

    async def ended(self, timeout_s: float = 2.0) -> str:
        """How it ended, in words (waits for it a little)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.process.wait(), timeout_s)
        code = self.process.returncode
        if code is None:
            return "stopped answering"
        if code < 0:
            name = signal.Signals(-code).name
            hint = " (out of memory?)" if -code == signal.SIGKILL else ""
            return f"was killed by signal {name}{hint}"
        return f"exited with code {code}"


class TaskPool:
    """Runs Python tasks in up to ``size`` long-lived child processes."""

    def __init__(self, size: int, *, grow_after_s: float = GROW_AFTER_S) -> None:
        self._size = max(1, size)
        self._grow_after_s = grow_after_s
        self._processes: set[_Process] = set()
        self._idle: list[_Process] = []
        self._starting = 0
        self._waiters: deque[tuple[float, asyncio.Future[_Process]]] = deque()
        self._timer: asyncio.TimerHandle | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._closed = False
        #: Processes started so far (for tests and stats).
        self.started = 0

    async def run(self, call: str, args: Any, ctx: TaskContext, timeout_s: float | None) -> Outcome:
        """Run one task in a pool process; its outcome. Cancelling kills the process."""
        process = await self._acquire()
        try:
            paths = list(sys.path)
            request = Request(call, args, ctx, None if paths == process.paths else paths)
            data = pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL)
            process.paths = paths
            reply = await asyncio.wait_for(process.call(data), timeout_s)
        except TimeoutError:
            process.kill()
            return Outcome(
                ok=False, error=f"timed out after {timeout_s:g}s; its process was killed"
            )
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            process.kill()
            how = await process.ended()
            log.warning("the process running %s %s (%s)", ctx.task, how, type(exc).__name__)
            return Outcome(ok=False, error=f"its Python process {how} while running it")
        except BaseException:  # cancelled (the task must stop), or a bug here
            process.kill()
            raise
        finally:
            self._release(process)
        return _outcome(reply)

    def warm(self) -> None:
        """Start the first process now, before the first task needs it."""
        if not self._processes and not self._starting and not self._closed:
            self._start_one()

    async def close(self) -> None:
        """Stop every process: idle ones are asked to exit, the rest are killed."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        for _, waiter in self._waiters:
            if not waiter.done():
                waiter.set_exception(PoolClosed("the worker is stopping"))
        self._waiters.clear()
        for process in list(self._processes):
            if process not in self._idle:
                process.kill()
            process.close_pipes()  # an idle process reads EOF and exits
        ending = [asyncio.ensure_future(p.process.wait()) for p in self._processes]
        if ending:
            _, late = await asyncio.wait(ending, timeout=CLOSE_GRACE_S)
            for process in self._processes:
                process.kill()
            if late:
                await asyncio.wait(late, timeout=CLOSE_GRACE_S)
        self._processes.clear()
        self._idle.clear()
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    # --- processes ----------------------------------------------------------------

    async def _acquire(self) -> _Process:
        while self._idle:
            process = self._idle.pop()
            if process.alive:
                return process
            self._discard(process)
        if self._closed:
            raise PoolClosed("the worker is stopping")
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[_Process] = loop.create_future()
        self._waiters.append((loop.time(), waiter))
        self._grow()
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self._release(waiter.result())  # handed over just as we were cancelled
            raise

    def _release(self, process: _Process) -> None:
        if self._closed or not process.alive:
            self._discard(process)
            self._grow()
            return
        while self._waiters:
            _, waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(process)
                return
        self._idle.append(process)

    def _discard(self, process: _Process) -> None:
        if process in self._processes:
            self._processes.discard(process)
            process.kill()
            process.close_pipes()
            self._in_background(_reap(process))

    def _grow(self) -> None:
        """Start a process if a task needs one: at once when there is none, else when
        the longest waiting task has waited GROW_AFTER_S."""
        while self._waiters and self._waiters[0][1].done():
            self._waiters.popleft()
        if self._closed or not self._waiters:
            return
        room = self._size - len(self._processes) - self._starting
        if room <= 0 or self._starting >= MAX_STARTING:
            return
        loop = asyncio.get_running_loop()
        if not self._processes and not self._starting:
            self._start_one()
            return
        due = self._waiters[0][0] + self._grow_after_s
        if loop.time() >= due:
            self._start_one()
            due = loop.time() + self._grow_after_s
        if self._timer is None or self._timer.when() > due:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = loop.call_at(due, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._grow()

    def _start_one(self) -> None:
        self._starting += 1
        self._in_background(self._start())

    async def _start(self) -> None:
        try:
            process = await _Process.start()
        except Exception as exc:
            self._starting -= 1
            log.error("cannot start a process for Python tasks: %s", exc)
            if not self._processes and not self._starting:  # nothing else will serve them
                for _, waiter in self._waiters:
                    if not waiter.done():
                        waiter.set_exception(exc)
                self._waiters.clear()
            return
        self._starting -= 1
        self.started += 1
        self._processes.add(process)
        self._release(process)
        self._grow()

    def _in_background(self, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)


async def _reap(process: _Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        await process.process.wait()


def _outcome(reply: Reply) -> Outcome:
    output = msgspec.json.decode(reply.output) if reply.ok else None
    return Outcome(
        ok=reply.ok,
        output=output,
        error=reply.error,
        retryable=reply.retryable,
        retry_after_s=reply.retry_after_s,
        error_type=reply.error_type,
        log=reply.log.encode("utf-8", "replace"),
    )
