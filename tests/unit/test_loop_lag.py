"""The benchmark's loop-lag monitor sees a loop that does not yield."""

from __future__ import annotations

import asyncio
import time

from bench.loop_lag import LoopLag


async def test_a_loop_blocked_for_a_while_shows_as_that_much_lag() -> None:
    async with LoopLag(interval_s=0.005) as lag:
        await asyncio.sleep(0.03)
        time.sleep(0.2)  # a call that never yields, as inline SQL did
        await asyncio.sleep(0.03)
    assert lag.max_ms >= 190
    assert len(lag.lags) >= 3
    assert lag.p99_ms <= lag.max_ms


async def test_the_monitor_stops_with_its_block_and_starts_empty() -> None:
    lag = LoopLag()
    assert (lag.max_ms, lag.p99_ms) == (0.0, 0.0)
    async with lag:
        await asyncio.sleep(0.03)
    ticks = len(lag.lags)
    await asyncio.sleep(0.03)
    assert ticks >= 1 and len(lag.lags) == ticks
