"""How late the event loop wakes up: a ticker that records the lag of every tick.

    async with LoopLag() as lag:
        ...                      # the work measured
    lag.max_ms, lag.p99_ms

A task sleeps ``interval_s`` again and again; each wake-up later than asked is a
stretch during which the loop ran something else without yielding (a long callback,
a blocking call). The largest such stretch is what a heartbeat or a lease renewal
could have waited.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
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
        #: Called at every wake-up (a stall watchdog's heartbeat, :mod:`bench.stalls`).
        self.on_tick = on_tick
        self._ticker: asyncio.Task[None] | None = None

    async def __aenter__(self) -> LoopLag:
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
        while True:
            asked = time.perf_counter() + self.interval_s
            await asyncio.sleep(self.interval_s)
            self.lags.append(max(0.0, time.perf_counter() - asked))
            if self.on_tick is not None:
                self.on_tick()

    @property
    def max_ms(self) -> float:
        """The longest lag seen, in milliseconds."""
        return round(max(self.lags, default=0.0) * 1000, 2)

    @property
    def p99_ms(self) -> float:
        """The 99th percentile of the lags, in milliseconds."""
        if not self.lags:
            return 0.0
        ordered = sorted(self.lags)
        return round(ordered[math.ceil(0.99 * len(ordered)) - 1] * 1000, 2)
