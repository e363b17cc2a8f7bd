"""The benchmark's loop-lag monitor sees a loop that does not yield."""

from __future__ import annotations

import asyncio
import io
import time

from bench.loop_lag import LoopLag
from bench.stalls import StallWatch


async def test_a_loop_blocked_for_a_while_shows_as_that_much_lag() -> None:
    async with LoopLag(interval_s=0.005) as lag:
        await asyncio.sleep(0.03)
        time.sleep(0.2)  # a call that never yields, as inline SQL did
        await asyncio.sleep(0.03)
    assert lag.max_ms >= 190
    assert lag.own_max_ms >= 150  # the loop ran that call: none of it was waiting for a CPU
    assert len(lag.lags) >= 3
    assert lag.p99_ms <= lag.max_ms
    assert lag.own_p99_ms <= lag.own_max_ms


async def test_the_own_p99_is_the_99th_percentile_of_the_lags_less_cpu_waits() -> None:
    lag = LoopLag()
    lag.own = [i / 1000 for i in range(1, 201)]  # 1..200 ms
    assert lag.own_p99_ms == 198.0
    assert lag.own_max_ms == 200.0


async def test_the_monitor_stops_with_its_block_and_starts_empty() -> None:
    lag = LoopLag()
    assert (lag.max_ms, lag.p99_ms, lag.own_p99_ms) == (0.0, 0.0, 0.0)
    async with lag:
        await asyncio.sleep(0.03)
    ticks = len(lag.lags)
    await asyncio.sleep(0.03)
    assert ticks >= 1 and len(lag.lags) == ticks


def _block_the_loop() -> None:
    time.sleep(0.3)  # a call that never yields


async def test_the_stall_watch_says_what_the_loop_ran_while_it_lagged() -> None:
    watch = StallWatch(0.005)
    watch.start()
    try:
        async with LoopLag(0.005, on_tick=watch.beat):
            await asyncio.sleep(0.03)
            _block_the_loop()
            await asyncio.sleep(0.03)
    finally:
        watch.stop()
    out = io.StringIO()
    watch.report(0.1, out)
    assert out.getvalue().count("--- stall") == 1
    assert "_block_the_loop" in out.getvalue()
