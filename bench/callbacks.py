"""Which callbacks hold the event loop: its own CPU time per callback, for diagnosis.

    python -m bench.run_one W1 huge inproc --slow-callbacks 5

The loop's wake-up lag (:mod:`bench.loop_lag`) on a shared machine is mostly time the
loop thread waited for a CPU. This meter counts what the loop itself ran: the loop
thread's CPU time (``time.thread_time``) of every callback and of every iteration of
the loop (all the callbacks that were ready at once run before the next ``select``),
which the machine's load does not change. Tasks run as pure-Python tasks while it
measures, so a slow task step is named by where its coroutine resumed and where it
next waited. Costs a few microseconds a callback: use it to find a stall, not to time.
"""

from __future__ import annotations

import asyncio
import heapq
import os
import sys
import threading
import time
from asyncio import events, tasks
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, TextIO


def _chain(coro: Any) -> list[FrameType]:
    """The frames of a coroutine chain, outermost first (where each one waits)."""
    frames: list[FrameType] = []
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is not None:
            frames.append(frame)
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return frames


def _where(frames: list[FrameType], depth: int = 6) -> str:
    parts = []
    for frame in reversed(frames[-depth:]):
        name = frame.f_code.co_filename.rsplit("/", 2)
        parts.append(f"{'/'.join(name[-2:])}:{frame.f_lineno} {frame.f_code.co_name}")
    return " < ".join(parts) or "?"


def _describe(handle: events.Handle) -> str:
    callback = getattr(handle, "_callback", None)  # diagnosis reads the handle's innards
    task = getattr(callback, "__self__", None)
    if isinstance(task, asyncio.Task):
        return _where(_chain(task.get_coro()))
    return repr(callback)[:160]


class SlowCallbacks:
    """Records the loop thread's CPU time per callback and per loop iteration."""

    #: The meter installed now, if any (armed by the benchmark for the run's window).
    current: SlowCallbacks | None = None

    def __init__(self, threshold_s: float, keep: int = 12) -> None:
        self.threshold_s = threshold_s
        self.keep = keep
        #: (cpu s, wall s, resumed at, next waiting at), the ``keep`` slowest callbacks.
        self.slowest: list[tuple[float, float, str, str]] = []
        #: (wall - CPU - waiting for a CPU: the GIL or I/O, cpu, wall, from, to).
        self.held: list[tuple[float, float, float, str, str]] = []
        self.iteration_cpu_max_s = 0.0
        self.callback_cpu_max_s = 0.0
        self.callbacks = 0
        #: Only while armed (the run's window; submitting is not measured).
        self.armed = False
        self._sched = os.open(f"/proc/self/task/{threading.get_native_id()}/schedstat", os.O_RDONLY)

    def _queued(self) -> int:
        """The loop thread's time spent waiting for a CPU so far, in ns."""
        return int(os.pread(self._sched, 64, 0).split()[1])

    @contextmanager
    def installed(self) -> Iterator[SlowCallbacks]:
        """Meter the callbacks of loops (and tasks) made while the block runs."""
        SlowCallbacks.current = self
        run, run_once = events.Handle._run, asyncio.base_events.BaseEventLoop._run_once  # type: ignore[attr-defined]
        task_class = tasks.Task
        meter = self

        def timed_run(handle: events.Handle) -> None:
            if not meter.armed:
                run(handle)
                return
            before = _describe(handle)
            queued = meter._queued()
            cpu, wall = time.thread_time(), time.perf_counter()
            run(handle)
            cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
            meter.callbacks += 1
            meter.callback_cpu_max_s = max(meter.callback_cpu_max_s, cpu)
            if cpu >= meter.threshold_s or wall >= 4 * meter.threshold_s:
                waited = (meter._queued() - queued) / 1e9
                meter.held.append((wall - cpu - waited, cpu, wall, before, _describe(handle)))
            if cpu >= meter.threshold_s:
                entry = (cpu, wall, before, _describe(handle))
                if len(meter.slowest) < meter.keep:
                    heapq.heappush(meter.slowest, entry)
                else:
                    heapq.heappushpop(meter.slowest, entry)

        def timed_run_once(loop: Any) -> None:
            cpu = time.thread_time()
            run_once(loop)
            if meter.armed:
                took = time.thread_time() - cpu
                meter.iteration_cpu_max_s = max(meter.iteration_cpu_max_s, took)

        events.Handle._run = timed_run  # type: ignore[method-assign,assignment]
        asyncio.base_events.BaseEventLoop._run_once = timed_run_once  # type: ignore[attr-defined]
        tasks.Task = tasks._PyTask  # type: ignore[attr-defined,misc]
        asyncio.Task = tasks._PyTask  # type: ignore[attr-defined,misc]
        try:
            yield self
        finally:
            events.Handle._run = run  # type: ignore[method-assign]
            asyncio.base_events.BaseEventLoop._run_once = run_once  # type: ignore[attr-defined]
            tasks.Task = task_class  # type: ignore[misc]
            asyncio.Task = task_class  # type: ignore[misc]

    def report(self, out: TextIO = sys.stderr) -> None:
        """Print the slowest callbacks, then the two maxima."""
        for cpu, wall, before, after in sorted(self.slowest, reverse=True):
            print(f"--- callback {cpu * 1000:.1f} ms CPU ({wall * 1000:.1f} ms wall)", file=out)
            print(f"  resumed at {before}", file=out)
            print(f"  then at    {after}", file=out)
        for other, cpu, wall, before, after in sorted(self.held, reverse=True)[: self.keep]:
            print(
                f"--- callback {wall * 1000:.1f} ms wall, {cpu * 1000:.1f} CPU, "
                f"{other * 1000:.1f} neither (GIL, I/O)",
                file=out,
            )
            print(f"  resumed at {before}", file=out)
            print(f"  then at    {after}", file=out)
        print(
            f"{self.callbacks} callbacks; longest {self.callback_cpu_max_s * 1000:.1f} ms CPU;"
            f" longest loop iteration {self.iteration_cpu_max_s * 1000:.1f} ms CPU",
            file=out,
        )
