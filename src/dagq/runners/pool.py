"""A pool of long-lived processes that run Python tasks, one task at a time each.

A Python task runs in a child process, not in the worker, so that it can fail alone:
one that calls ``os._exit``, segfaults or is killed for its memory fails its attempt
(retried per its policy) and the worker goes on; one past its timeout, or cancelled,
has its process killed (a thread could not be stopped) and the next task gets a
fresh one. As in Celery's prefork pool the processes live on from task to task, and
a round trip is a pickle each way over two pipes (:mod:`dagq.runners.child` is the
other end).

Processes are forked by a *zygote*: one small process started once (a tenth of a
second), which has imported what a pool process needs, so that each fork takes a few
milliseconds (:mod:`dagq.zygote` launches it; ``dagq run`` launches it early).
The pool grows on demand — a task that finds no idle process gets a new one, up to one
per worker slot — and a process that died or was killed is replaced the same way. The
zygote reaps them and reports how each ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import pickle
import shutil
import signal
import socket
import sys
import tempfile
from collections import deque
from typing import Any

import msgspec

from dagq import zygote
from dagq.payloads import OUTPUT_INLINE_BYTES
from dagq.runners import Outcome, StoredInputs, TaskContext
from dagq.runners.capture import ProcessOutput, Sink
from dagq.runners.child import HEADER, Reply, Request
from dagq.runners.held import Held

log = logging.getLogger("dagq.worker")

#: On close, how long processes get to exit before they are killed.
CLOSE_GRACE_S = 1.0
#: How long to wait for word of how a dead process ended.
_EXIT_WAIT_S = 2.0


class PoolClosed(Exception):
    """The pool was closed while a task waited for a process."""


class _Replies:
    """The reading end of a pool process's reply pipe, read on the event loop: each
    whole frame answers the call waiting for it. One callback a reply, reading at most
    ``_READ_BYTES`` at a time (a transport's larger reads allocate and free a mapping
    each time: three system calls a task)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int) -> None:
        self._loop = loop
        self._fd = fd
        self._buffer = bytearray()
        self._size = -1  # of the frame being read, once its header is in
        self._waiting: asyncio.Future[bytes] | None = None
        self._ended = False
        os.set_blocking(fd, False)
        loop.add_reader(fd, self._readable)

    def expect(self) -> asyncio.Future[bytes]:
        """A future for the next reply (ConnectionError if none can come)."""
        future: asyncio.Future[bytes] = self._loop.create_future()
        if self._ended:
            future.set_exception(ConnectionError("the process is gone"))
        else:
            self._waiting = future
        return future

    def _readable(self) -> None:
        size = _READ_BYTES
        if self._size > size:  # the rest of a large reply: in large reads
            size = min(self._size - len(self._buffer), _LARGE_READ_BYTES)
        try:
            data = os.read(self._fd, max(size, _READ_BYTES))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self.end()
            return
        buffer = self._buffer
        buffer += data
        while True:
            if self._size < 0:
                if len(buffer) < HEADER.size:
                    return
                (self._size,) = HEADER.unpack_from(buffer)
                del buffer[: HEADER.size]
            if len(buffer) < self._size:
                return
            frame = bytes(buffer[: self._size])
            del buffer[: self._size]
            self._size = -1
            waiting, self._waiting = self._waiting, None
            if waiting is not None and not waiting.done():
                waiting.set_result(frame)

    def end(self) -> None:
        """No reply can come any more (the process exited, or the pipe closed)."""
        if not self._ended:
            self._ended = True
            self._loop.remove_reader(self._fd)
        waiting, self._waiting = self._waiting, None
        if waiting is not None and not waiting.done():
            waiting.set_exception(ConnectionError("the process is gone"))

    def close(self) -> None:
        self.end()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


#: How much of a reply is read at once (under the allocator's threshold for a mapping),
#: and at most while the rest of a large one comes.
_READ_BYTES = 64 * 1024
_LARGE_READ_BYTES = 4 * 1024 * 1024


class _Process(msgspec.Struct, eq=False):
    """One pool process and the pipes to it."""

    pid: int
    #: Its exit code (negative: the signal that killed it), once the zygote says.
    exit: asyncio.Future[int]
    replies: _Replies
    writer: asyncio.WriteTransport
    #: The import path it was last given.
    paths: list[str] = msgspec.field(default_factory=list)
    killed: bool = False
    #: Where its tasks' stdout and stderr go (made at its first task).
    output: ProcessOutput | None = None
    #: The stored inputs it holds (sent once, then left out of its requests).
    held: Held = msgspec.field(default_factory=Held)

    @property
    def alive(self) -> bool:
        return not self.killed and not self.exit.done()

    def call(self, request: bytes) -> asyncio.Future[bytes]:
        """Send a request; the future of its reply. The pipe takes what it can at once,
        the transport the rest (the reply cannot come before the request is whole)."""
        replied = self.replies.expect()
        self.writer.write(HEADER.pack(len(request)) + request)  # one write: one wake-up
        return replied

    def kill(self) -> None:
        """Kill it and whatever it started (its process group)."""
        if not self.killed and not self.exit.done():
            self.kill_group()
        self.killed = True

    def kill_group(self) -> None:
        """Kill what is left of its process group (what the task started). Its pid
        names the group as long as a member lives, so it is never reused meanwhile."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)

    def close_pipes(self) -> None:
        self.writer.close()
        self.replies.close()
        if self.output is not None:
            self.output.close()
            self.output = None

    async def ended(self) -> str:
        """How it ended, in words (waits a little for the zygote to say)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.exit), _EXIT_WAIT_S)
        if not self.exit.done():
            return "stopped answering"
        code = self.exit.result()
        if code < 0:
            name = signal.Signals(-code).name
            hint = " (out of memory?)" if -code == signal.SIGKILL and not self.killed else ""
            return f"was killed by signal {name}{hint}"
        return f"exited with code {code}"


class _Zygote:
    """The process that forks pool processes, and tells how they end."""

    def __init__(
        self,
        launched: zygote.Launched,
        events: asyncio.StreamReader,
        events_transport: asyncio.BaseTransport,
    ) -> None:
        self._launched = launched
        self._control = launched.control
        self._events = events
        self._events_transport = events_transport
        self._forks: deque[asyncio.Future[int]] = deque()
        self._exits: dict[int, asyncio.Future[int]] = {}
        self._reading = asyncio.ensure_future(self._read())

    @classmethod
    async def start(cls) -> _Zygote:
        """Adopt the zygote launched early, or launch one."""
        launched = zygote.take()
        events = asyncio.StreamReader(limit=2**20)
        try:
            transport, _ = await asyncio.get_running_loop().connect_read_pipe(
                lambda: asyncio.StreamReaderProtocol(events), os.fdopen(launched.events, "rb", 0)
            )
        except BaseException:
            launched.control.close()
            launched.process.kill()
            launched.process.wait()
            raise
        return cls(launched, events, transport)

    @property
    def alive(self) -> bool:
        return self._launched.alive and not self._reading.done()

    async def fork(self) -> _Process:
        """A new pool process, connected."""
        loop = asyncio.get_running_loop()
        requests_in, requests_out = os.pipe()
        replies_in, replies_out = os.pipe()
        forked: asyncio.Future[int] = loop.create_future()
        try:
            self._forks.append(forked)
            socket.send_fds(self._control, [b"f"], [requests_in, replies_out])
            pid = await forked
        except BaseException:
            with contextlib.suppress(ValueError):
                self._forks.remove(forked)
            os.close(requests_out)  # a process forked all the same reads EOF and exits
            os.close(replies_in)
            raise
        finally:
            os.close(requests_in)
            os.close(replies_out)
        exit_code = self._exits.setdefault(pid, loop.create_future())
        replies = _Replies(loop, replies_in)
        try:
            writer, _ = await loop.connect_write_pipe(
                asyncio.BaseProtocol, os.fdopen(requests_out, "wb", 0)
            )
        except BaseException:
            replies.close()
            raise
        # Once it has exited no answer can come, even if something it forked (and
        # that inherited the pipe) keeps the pipe open.
        exit_code.add_done_callback(lambda _: replies.end())
        return _Process(pid, exit_code, replies, writer)

    async def _read(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                (size,) = HEADER.unpack(await self._events.readexactly(HEADER.size))
                event = pickle.loads(await self._events.readexactly(size))
                if event[0] == "forked":
                    forked = self._forks.popleft()
                    if not forked.done():
                        forked.set_result(event[1])
                else:
                    _, pid, code = event
                    ended = self._exits.pop(pid, None) or loop.create_future()
                    if not ended.done():
                        ended.set_result(code)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the zygote is gone, and its pool processes with it
        finally:
            for forked in self._forks:
                if not forked.done():
                    forked.set_exception(OSError("the process forking Python task processes died"))
            for ended in self._exits.values():
                if not ended.done():
                    ended.set_result(-signal.SIGKILL)

    async def close(self) -> None:
        self._control.close()  # it reads EOF and exits
        # Its events pipe ends when it has exited (its pool processes close their copies).
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._reading), CLOSE_GRACE_S)
        process = self._launched.process
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
        await asyncio.get_running_loop().run_in_executor(None, process.wait)
        self._events_transport.close()
        self._reading.cancel()
        await asyncio.gather(self._reading, return_exceptions=True)


class TaskPool:
    """Runs Python tasks in up to ``size`` long-lived child processes."""

    def __init__(self, size: int) -> None:
        self._size = max(1, size)
        self._zygote: _Zygote | None = None
        self._zygote_lock = asyncio.Lock()
        self._processes: set[_Process] = set()
        self._idle: list[_Process] = []
        self._starting = 0
        self._waiters: deque[asyncio.Future[_Process]] = deque()
        self._background: set[asyncio.Task[None]] = set()
        self._closed = False
        #: A directory of the pool's own for the FIFOs that capture tasks' output.
        self._scratch: str | None = None
        #: Processes started so far (for tests and stats).
        self.started = 0

    async def run(
        self,
        call: str,
        args: Any,
        ctx: TaskContext,
        timeout_s: float | None,
        *,
        processor: bool = False,
        inputs: StoredInputs | None = None,
        live: Sink | None = None,
    ) -> Outcome:
        """Run one task in a pool process; its outcome. Cancelling kills the process.

        ``processor``: ``call`` is a worker's processor, given ``args`` (the task's
        kwargs) as keyword arguments. ``inputs``, if given, are decoded in that process
        into ``ctx.inputs``. What the task writes to stdout and stderr (and logs) is
        kept for the attempt's log and handed to ``live`` as it comes.
        """
        process = await self._acquire()
        output = self._output(process)
        captured = None if output is None else output.begin(live)
        timer: asyncio.TimerHandle | None = None
        reply: Reply | None = None
        try:
            paths = sys.path
            changed = None if paths == process.paths else list(paths)
            logs = None if output is None else output.paths
            stored = None if inputs is None else process.held.leave_out(inputs)
            data = Request(call, args, ctx, changed, processor, stored, logs).pack()
            if changed is not None:
                process.paths = changed
            replied = process.call(data)
            if timeout_s is not None:
                timer = asyncio.get_running_loop().call_later(timeout_s, _time_out, replied)
            reply = Reply(*pickle.loads(await replied))
        except TimeoutError:
            process.kill()
            outcome = Outcome(
                ok=False, error=f"timed out after {timeout_s:g}s; its process was killed"
            )
        except ConnectionError:
            how = await process.ended()
            process.kill_group()  # what the task started, if any of it is still there
            process.killed = True
            log.warning("the Python process running %s %s", ctx.task, how)
            outcome = Outcome(ok=False, error=f"its Python process {how} while running it")
        except BaseException:  # cancelled (the task must stop), or a bug here
            process.kill()
            raise
        else:
            outcome = _outcome(reply)
        finally:
            if timer is not None:
                timer.cancel()
            if output is not None:
                # Left unread: nothing (the pool process looked), unless it did not say.
                output.end(drain=reply is None or reply.unread)
            self._release(process)
        if captured is None:
            return outcome
        attempt_log = captured.log(outcome.log.decode("utf-8", "replace"))
        if attempt_log == outcome.log:  # it wrote nothing, and failed with no traceback
            return outcome
        return dataclasses.replace(outcome, log=attempt_log)

    def _output(self, process: _Process) -> ProcessOutput | None:
        """Where ``process`` writes its tasks' output (None, logged, if that cannot be)."""
        if process.output is None:
            try:
                if self._scratch is None:
                    self._scratch = tempfile.mkdtemp(prefix="dagq-pool-")
                output = ProcessOutput(self._scratch, str(process.pid))
                output.open()
            except OSError as exc:
                log.warning("a Python task's output cannot be captured: %s", exc)
                return None
            process.output = output
        return process.output

    def warm(self) -> None:
        """Start the first process now, before the first task needs it."""
        if not self._processes and not self._starting and not self._closed:
            self._start_one()

    async def close(self) -> None:
        """Stop every process: idle ones are asked to exit, the rest are killed."""
        self._closed = True
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_exception(PoolClosed("the worker is stopping"))
        self._waiters.clear()
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        processes = list(self._processes)
        for process in processes:
            if process not in self._idle:
                process.kill()
            process.close_pipes()  # an idle process reads EOF and exits
        if processes:
            await asyncio.wait([asyncio.shield(p.exit) for p in processes], timeout=CLOSE_GRACE_S)
        for process in processes:
            process.kill()
        self._processes.clear()
        self._idle.clear()
        if self._zygote is not None:
            await self._zygote.close()
            self._zygote = None
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None

    # --- processes ----------------------------------------------------------------

    async def _acquire(self) -> _Process:
        while self._idle:
            process = self._idle.pop()
            if process.alive:
                return process
            self._discard(process)
        if self._closed:
            raise PoolClosed("the worker is stopping")
        waiter: asyncio.Future[_Process] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
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
            self._grow()  # a replacement, if tasks wait
            return
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(process)
                return
        self._idle.append(process)

    def _discard(self, process: _Process) -> None:
        if process in self._processes:
            self._processes.discard(process)
            process.kill()
            process.close_pipes()

    def _grow(self) -> None:
        """Start processes for the tasks waiting for one (up to one per slot)."""
        while self._waiters and self._waiters[0].done():
            self._waiters.popleft()
        if self._closed:
            return
        wanted = min(
            sum(not w.done() for w in self._waiters) - self._starting,
            self._size - len(self._processes) - self._starting,
        )
        for _ in range(wanted):
            self._start_one()

    def _start_one(self) -> None:
        self._starting += 1
        task = asyncio.ensure_future(self._start())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _start(self) -> None:
        try:
            process = await (await self._forker()).fork()
        except Exception as exc:
            self._starting -= 1
            log.error("cannot start a process for Python tasks: %s", exc)
            if not self._processes and not self._starting:  # nothing else will serve them
                for waiter in self._waiters:
                    if not waiter.done():
                        waiter.set_exception(exc)
                self._waiters.clear()
            return
        self._starting -= 1
        self.started += 1
        self._processes.add(process)
        self._release(process)

    async def _forker(self) -> _Zygote:
        async with self._zygote_lock:
            if self._zygote is None or not self._zygote.alive:
                if self._zygote is not None:
                    log.warning("the process forking Python task processes died; restarting it")
                    await self._zygote.close()
                self._zygote = await _Zygote.start()
            return self._zygote


def _time_out(replied: asyncio.Future[bytes]) -> None:
    if not replied.done():
        replied.set_exception(TimeoutError())


def _outcome(reply: Reply) -> Outcome:
    """The outcome a reply says; an output is decoded only if it may travel inline
    (a larger one goes by reference as the JSON it came as, never decoded here)."""
    return Outcome(
        ok=reply.ok,
        output=output_value(reply.output) if reply.ok else None,
        output_json=reply.output if reply.ok else None,
        error=reply.error,
        retryable=reply.retryable,
        retry_after_s=reply.retry_after_s,
        error_type=reply.error_type,
        log=reply.log.encode("utf-8", "replace"),
    )


def output_value(encoded: bytes) -> Any:
    """A task's output from its JSON, if it is small enough to travel inline; else None
    (reporting sends it by reference as it is)."""
    if len(encoded) > OUTPUT_INLINE_BYTES:
        return None
    return msgspec.json.decode(encoded)
