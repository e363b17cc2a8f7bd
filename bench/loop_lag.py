"""How late the event loop wakes up: a ticker that records the lag of every tick.

    async with LoopLag() as lag:
        ...                      # the work measured
    lag.max_ms, lag.p99_ms

A task sleeps ``interval_s`` again and again; each wake-up later than asked is a
stretch during which the loop ran something else without yielding (a long callback,
a blocking call). The largest such stretch is what a heartbeat or a lease renewal
could have waited.

On a shared machine much of that is the loop thread waiting for a CPU that other
processes hold. Where Linux says how long (``/proc/self/task/TID/schedstat``), each
lag is also recorded less that wait (``own_max_ms``): what this process itself kept
the loop from doing — its own callbacks, its other threads holding the GIL.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import threading
import time
from collections.abc import Callable
from types import TracebackType


class LoopLag:
    """Measures the running loop's wake-up lag while the ``async with`` block runs."""

    def __init__(
        self, interval_s: float = 0.005, *, on_tick: Callable[[], None] | None = None
    ) -> None:
        self.interval_s = interval_s
        self.lags: list[float] = []
        #: Each lag less the time the loop thread waited for a CPU meanwhile.
        self.own: list[float] = []
        #: When each lag ended, in seconds since the monitor started.
        self.at: list[float] = []
        self._started = time.perf_counter()
        #: Called at every wake-up (a stall watchdog's heartbeat, :mod:`bench.stalls`).
        self.on_tick = on_tick
        self._ticker: asyncio.Task[None] | None = None

    async def __aenter__(self) -> LoopLag:
        self._started = time.perf_counter()
        self._ticker = asyncio.create_task(self._tick(), name="loop-lag")
        await asyncio.sleep(0)  # the ticker starts now, not at the first await inside
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker

    async def _tick(self) -> None:
        try:
            stat = os.open(f"/proc/self/task/{threading.get_native_id()}/schedstat", os.O_RDONLY)
        except OSError:
            stat = -1
        try:
            while True:
                queued = _queued(stat)
                asked = time.perf_counter() + self.interval_s
                await asyncio.sleep(self.interval_s)
                now = time.perf_counter()
                lag = max(0.0, now - asked)
                self.at.append(now - self._started)
                self.lags.append(lag)
                self.own.append(max(0.0, lag - (_queued(stat) - queued)))
                if self.on_tick is not None:
                    self.on_tick()
        finally:
            if stat >= 0:
                os.close(stat)

    @property
    def max_ms(self) -> float:
        """The longest lag seen, in milliseconds."""
        return round(max(self.lags, default=0.0) * 1000, 2)

    @property
    def own_max_ms(self) -> float:
        """The longest lag less the loop thread's wait for a CPU meanwhile, in ms."""
        return round(max(self.own, default=0.0) * 1000, 2)

    def worst(self, n: int = 5) -> list[tuple[float, float, float]]:
        """The ``n`` longest lags, as (s since the start, lag ms, lag less CPU wait ms)."""
        ticks = sorted(zip(self.lags, self.at, self.own, strict=True), reverse=True)[:n]
        return [(round(t, 2), round(lag * 1000, 1), round(own * 1000, 1)) for lag, t, own in ticks]

    @property
    def p99_ms(self) -> float:
        """The 99th percentile of the lags, in milliseconds."""
        return _p99_ms(self.lags)

    @property
    def own_p99_ms(self) -> float:
        """The 99th percentile of the lags less the CPU waits, in milliseconds: steadier
        than :attr:`own_max_ms`, which one preempted thread holding the GIL can set."""
        return _p99_ms(self.own)


def _p99_ms(values: list[float]) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return round(ordered[math.ceil(0.99 * len(ordered)) - 1] * 1000, 2)


def _queued(stat: int) -> float:
    """The calling thread's total time waiting for a CPU, in seconds (0 if unknown)."""
    if stat < 0:
        return 0.0
    return int(os.pread(stat, 64, 0).split()[1]) / 1e9
