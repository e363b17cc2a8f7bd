"""How long an event loop waits for the GIL while another thread runs Python.

    python -m bench.gil_handover                # switch intervals of 5 and 1 ms, 3 rounds
    python -m bench.gil_handover --intervals 0.005,0.001,0.0005 --rounds 5

A thread runs pure Python without pause (as a coordinator's heavy step does) while the
loop wakes every 5 ms and makes four pipe system calls per wake-up (as it writes a
task to a pool process and reads replies). Each system call hands the GIL to the busy
thread, and the loop waits a switch interval (``sys.setswitchinterval``) for it back.
Printed per interval: the loop's wake-up lag (p50, max), and the CPU the other thread
ran per wake-up (the 5 ms sleep included) — what the loop waited for the GIL.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import threading
import time

_WAKE_S = 0.005
_CALLS = 4


def _burn(stop: threading.Event) -> None:
    x = 0
    while not stop.is_set():
        for i in range(1000):
            x += i


async def _measure(wake_ups: int) -> tuple[list[float], list[float]]:
    r, w = os.pipe()
    os.set_blocking(r, False)
    lags, others = [], []
    try:
        for _ in range(wake_ups):
            cpu, own = time.process_time(), time.thread_time()
            asked = time.perf_counter() + _WAKE_S
            await asyncio.sleep(_WAKE_S)
            lags.append(time.perf_counter() - asked)
            for _ in range(_CALLS):
                os.write(w, b"x")
                os.read(r, 1)
            others.append((time.process_time() - cpu) - (time.thread_time() - own))
    finally:
        os.close(r)
        os.close(w)
    return lags, others


def run(interval_s: float, wake_ups: int) -> str:
    """One measurement at this switch interval, as a line."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(interval_s)
    stop = threading.Event()
    busy = threading.Thread(target=_burn, args=(stop,), daemon=True)
    busy.start()
    try:
        lags, others = asyncio.run(_measure(wake_ups))
    finally:
        stop.set()
        busy.join()
        sys.setswitchinterval(before)
    ms = 1000
    return (
        f"switch interval {interval_s * ms:.1f} ms: wake-up lag p50 "
        f"{statistics.median(lags) * ms:.1f} max {max(lags) * ms:.1f} ms; "
        f"other thread's CPU per wake-up p50 {statistics.median(others) * ms:.1f} "
        f"max {max(others) * ms:.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--intervals", default="0.005,0.001", help="seconds, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--wake-ups", type=int, default=300)
    args = parser.parse_args()
    try:
        intervals = [float(v) for v in args.intervals.split(",")]
    except ValueError:
        print(f"error: --intervals: not seconds: {args.intervals!r}", file=sys.stderr)
        raise SystemExit(2) from None
    if any(not v > 0 for v in intervals):
        print(f"error: --intervals: each must be positive: {args.intervals!r}", file=sys.stderr)
        raise SystemExit(2)
    for _ in range(args.rounds):
        for interval in intervals:  # interleaved: the rounds share the machine's moods
            print(run(interval, args.wake_ups), flush=True)


if __name__ == "__main__":
    main()
