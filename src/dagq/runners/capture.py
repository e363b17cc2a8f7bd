"""An attempt's output: the kept tail of each stream, and what is seen as it comes.

Shell tasks and Python tasks (in pool processes) keep the same log: the last
``LOG_LIMIT`` bytes of stdout and of stderr, in two sections (:func:`render`), stored
once the attempt ends (:mod:`dagq.reporting`). While the attempt runs, every chunk
read also goes to a *live* sink, when one is given (:class:`dagq.live_logs.LiveLog`:
``dagq logs --follow``).

A Python task's output is read from two FIFOs (:class:`FifoCapture`): the pool
process points its file descriptors 1 and 2 at them for the duration of the attempt
(:func:`dagq.runners.child.redirected`), so what C extensions and subprocesses write
is captured too, not only ``print``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from pathlib import Path

#: How much of stdout and of stderr is kept, from the end.
LOG_LIMIT = 64 * 1024

Sink = Callable[[bytes], None]


class Tail:
    """The last LOG_LIMIT bytes of a stream; each chunk also goes to ``live``, if any."""

    def __init__(self, live: Sink | None = None) -> None:
        self.data = bytearray()
        self.live = live

    def add(self, chunk: bytes) -> None:
        self.data += chunk
        if len(self.data) > 2 * LOG_LIMIT:
            del self.data[: len(self.data) - LOG_LIMIT]
        if self.live is not None:
            self.live(chunk)

    def bytes(self) -> bytes:
        return bytes(self.data[-LOG_LIMIT:])

    def text(self) -> str:
        return self.bytes().decode("utf-8", "replace")


def render(stdout: Tail, stderr: Tail, notes: list[str] | None = None) -> bytes:
    """The attempt's log: a stdout section and a stderr section (nothing if both are
    empty), then ``notes`` (e.g. warnings) under a heading of their own."""
    out, err = stdout.bytes(), stderr.bytes()
    extra = b""
    if notes:
        extra = "".join(notes).encode("utf-8", "replace")
    if not out and not err:
        return extra.lstrip(b"\n")
    return b"--- stdout ---\n" + out + b"\n--- stderr ---\n" + err + extra


class AttemptOutput:
    """What one attempt wrote: the tail of each stream."""

    def __init__(self, live: Sink | None = None) -> None:
        self.stdout, self.stderr = Tail(live), Tail(live)

    def log(self, traceback: str = "") -> bytes:
        """The attempt's log, with the traceback of the exception that failed it."""
        if not traceback:
            return render(self.stdout, self.stderr)
        if not self.stdout.data and not self.stderr.data:
            return traceback.encode("utf-8", "replace")
        return render(self.stdout, self.stderr, ["\n--- traceback ---\n", traceback])


class ProcessOutput:
    """Two FIFOs one pool process writes its attempts' stdout and stderr to.

    Made and opened once per pool process, read as chunks come (a reader on the event
    loop, no task of its own); the worker also holds a write end of each, so a read
    never sees an end of file. Each attempt's chunks go to its :class:`AttemptOutput`,
    between :meth:`begin` and :meth:`end`. The pool process puts its file descriptors
    back before it replies, so once the reply is in, all the attempt wrote is in the
    FIFOs, and :meth:`end` reads it without waiting; its reply says whether it saw
    anything left in them, and if not :meth:`end` reads nothing. What something a task
    left running writes later is dropped.
    """

    def __init__(self, directory: str, name: str) -> None:
        self.paths = (
            os.path.join(directory, f"{name}.out"),
            os.path.join(directory, f"{name}.err"),
        )
        self._fds: list[int] = []
        self._readers: list[int] = []
        self._current: AttemptOutput | None = None

    def open(self) -> None:
        """Make the FIFOs and start reading them (OSError if they cannot be)."""
        loop = asyncio.get_running_loop()
        try:
            for stream, path in enumerate(self.paths):
                if not os.path.exists(path):
                    os.mkfifo(path, 0o600)
                read_fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
                self._fds.append(read_fd)
                self._fds.append(os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC))
                loop.add_reader(read_fd, self._readable, read_fd, stream)
                self._readers.append(read_fd)
        except OSError:
            self.close()
            raise

    def begin(self, live: Sink | None = None) -> AttemptOutput:
        """An attempt starts: what comes now is its output."""
        self._current = AttemptOutput(live)
        return self._current

    def end(self, *, drain: bool = True) -> None:
        """The attempt has ended (the pool process replied, or died): read what is
        left in the FIFOs into its output — unless ``drain`` is False: the pool
        process saw them empty once the attempt ended, so the reads are spared (each
        a system call on the event loop, which lets go of the GIL and may wait for it)."""
        for stream, fd in enumerate(self._readers if drain else ()):
            drained = 0
            while drained < _DRAIN_LIMIT and (got := self._readable(fd, stream)):
                drained += got
        self._current = None

    def close(self) -> None:
        """Stop reading, close and delete the FIFOs (the pool process is gone)."""
        loop = asyncio.get_running_loop()
        for fd in self._readers:
            loop.remove_reader(fd)
        self._readers.clear()
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()
        for path in self.paths:
            with contextlib.suppress(OSError):
                Path(path).unlink()

    def _readable(self, fd: int, stream: int) -> int:
        """Read a chunk into the current attempt's output; how many bytes came."""
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # BlockingIOError: nothing waiting
            return 0
        current = self._current
        if chunk and current is not None:
            (current.stdout if stream == 0 else current.stderr).add(chunk)
        return len(chunk)


#: At most this much is read from a FIFO once its attempt ended (a runaway writer
#: left behind by the task must not keep the worker reading).
_DRAIN_LIMIT = 4 * 1024 * 1024
