"""An attempt's output sent to the store while it runs (``dagq logs --follow``).

The worker hands every chunk a task writes (shell or Python, stdout and stderr as
they come) to a :class:`LiveLog`, which stores them as small documents under
``keys.live_log_prefix`` — ``.../{run}-000000``, ``.../{run}-000001``, ... — every
``FLUSH_S`` or as soon as ``CHUNK_BYTES`` are waiting. A follower lists the prefix
after the last key it printed. What an attempt sends live is bounded
(``MAX_LIVE_BYTES``; past it, one note says so): the kept tail of the log
(:mod:`dagq.runners.capture`) is stored as usual when the attempt ends.

Sending never holds up or fails the task: a chunk the store refuses is dropped
(logged once), and the follower simply never sees it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from dagq.stores.base import Documents

log = logging.getLogger("dagq.worker")

#: How often waiting output is sent (seconds).
FLUSH_S = 0.5
#: Output waiting beyond this is sent at once, in documents of at most this size.
CHUNK_BYTES = 32 * 1024
#: How much of one attempt's output is sent live at most.
MAX_LIVE_BYTES = 1024 * 1024
CUT_NOTE = (
    b"\n[dagq: live output stops here (over 1 MiB); the attempt's log keeps the end: dagq logs]\n"
)


class LiveLog:
    """The live output of one attempt, sent under ``prefix`` while it runs (by a
    background task started at the first write, ended by :meth:`close`)."""

    def __init__(self, documents: Documents, prefix: str, *, flush_s: float = FLUSH_S) -> None:
        self._documents = documents
        self._prefix = prefix
        self._flush_s = flush_s
        self._waiting = bytearray()
        self._sent = 0
        self._seq = 0
        #: When this run of the attempt began (ms): a message delivered again runs the
        #: same attempt again, whose chunks come after (never over) the first run's.
        self._run_id = f"{int(time.time() * 1000):013d}"
        self._cut = False
        self._full = asyncio.Event()
        self._failed = False
        self._closing = False
        self._task: asyncio.Task[None] | None = None

    def write(self, data: bytes) -> None:
        """Take a chunk of output (never blocks; what is over the bound is dropped)."""
        if self._cut:
            return
        room = MAX_LIVE_BYTES - self._sent - len(self._waiting)
        if len(data) > room:
            data = data[: max(0, room)]
            self._cut = True
        self._waiting += data
        if self._cut:
            self._waiting += CUT_NOTE
        if self._task is None and not self._closing:  # an attempt that writes nothing costs nothing
            self._task = asyncio.create_task(self._run(), name=f"dagq-live-{self._prefix}")
        if len(self._waiting) >= CHUNK_BYTES or self._cut:
            self._full.set()

    async def close(self) -> None:
        """Send what is left, then stop (before the attempt's completion is reported,
        so a follower that sees the attempt ended finds every chunk)."""
        self._closing = True
        self._full.set()
        if self._task is not None:
            await self._task
            self._task = None
        await self._flush()

    async def _run(self) -> None:
        while not self._closing:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._full.wait(), self._flush_s)
            self._full.clear()
            await self._flush()

    async def _flush(self) -> None:
        while self._waiting:
            chunk = bytes(self._waiting[:CHUNK_BYTES])
            del self._waiting[:CHUNK_BYTES]
            key = f"{self._prefix}{self._run_id}-{self._seq:06d}"
            self._seq += 1
            self._sent += len(chunk)
            try:
                await self._documents.put(key, chunk)
            except Exception as exc:  # never the task's failure
                if not self._failed:
                    log.warning("live output of %s not sent: %s", self._prefix, exc)
                self._failed = True
