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
#: How long output may keep flowing after a Python task ended (something it started
#: may still hold the FIFOs) before the worker stops reading.
LINGER_S = 2.0

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


class _Reader(asyncio.Protocol):
    def __init__(self, tail: Tail) -> None:
        self.tail = tail
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        self.tail.add(data)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


class FifoCapture:
    """Two FIFOs a pool process writes an attempt's stdout and stderr to.

    The worker opens the read ends first, and holds a write end of each until the
    attempt ends, so that the reads see no end of file before the pool process has
    opened them; after that, the end of file comes when the pool process and whatever
    the task started have closed them (or ``LINGER_S`` later, reading stops).
    """

    def __init__(self, directory: str, name: str, live: Sink | None = None) -> None:
        self.paths = (
            os.path.join(directory, f"{name}.out"),
            os.path.join(directory, f"{name}.err"),
        )
        self.stdout, self.stderr = Tail(live), Tail(live)
        self._held: list[int] = []
        self._transports: list[asyncio.BaseTransport] = []
        self._readers: list[_Reader] = []

    async def open(self) -> None:
        """Make the FIFOs and start reading them."""
        loop = asyncio.get_running_loop()
        for path, tail in zip(self.paths, (self.stdout, self.stderr), strict=True):
            os.mkfifo(path, 0o600)
            read_fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            self._held.append(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
            reader = _Reader(tail)
            transport, _ = await loop.connect_read_pipe(
                lambda r=reader: r,  # type: ignore[misc]
                os.fdopen(read_fd, "rb", 0),
            )
            self._transports.append(transport)
            self._readers.append(reader)

    async def close(self, *, linger_s: float = LINGER_S) -> None:
        """The attempt has ended: read what is left (for up to ``linger_s``), then stop."""
        for fd in self._held:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._held.clear()
        if self._readers:
            await asyncio.wait([r.closed for r in self._readers], timeout=linger_s)
        for transport in self._transports:
            transport.close()
        self._transports.clear()
        for path in self.paths:
            with contextlib.suppress(OSError):
                Path(path).unlink()

    def log(self, traceback: str = "") -> bytes:
        """The attempt's log, with the traceback of the exception that failed it."""
        if not traceback:
            return render(self.stdout, self.stderr)
        if not self.stdout.data and not self.stderr.data:
            return traceback.encode("utf-8", "replace")
        return render(self.stdout, self.stderr, ["\n--- traceback ---\n", traceback])
