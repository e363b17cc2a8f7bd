"""What the event loop was doing when it woke up late: a watchdog for diagnosis.

    python -m bench.run_one W1 huge inproc --stalls 15

A thread wakes every millisecond; while the loop's ticker (:class:`bench.loop_lag.
LoopLag`) is overdue it samples the loop thread's stack (``sys._current_frames``) and
what the other threads run. Garbage collections are timed through ``gc.callbacks``.
Once the run ends, every stall longer than the threshold is printed to stderr with
its samples and the collections that overlapped it. A sample is taken only when the
watchdog gets the GIL, so a stretch inside one C call shows as the frame that made it.
"""

from __future__ import annotations

import gc
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, TextIO

_PERIOD_S = 0.001


@dataclass
class Stall:
    """One stretch during which the ticker was overdue."""

    start: float
    end: float = 0.0
    #: The loop thread's (time on a CPU, time waiting for one) in ns, when the stall
    #: was seen and when it ended (Linux): the rest it spent waiting for the GIL or I/O.
    sched_seen: tuple[int, int] = (0, 0)
    sched_end: tuple[int, int] = (0, 0)
    seen: float = 0.0
    loop: Counter[str] = field(default_factory=Counter)
    others: Counter[str] = field(default_factory=Counter)


def _where(frame: FrameType | None, depth: int = 8) -> str:
    parts: list[str] = []
    while frame is not None and len(parts) < depth:
        code = frame.f_code
        name = code.co_filename.rsplit("/", 2)
        parts.append(f"{'/'.join(name[-2:])}:{frame.f_lineno} {code.co_name}")
        frame = frame.f_back
    return " < ".join(parts)


class StallWatch:
    """Samples the loop thread while its ticker is overdue by more than ``grace_s``."""

    def __init__(self, interval_s: float, grace_s: float = 0.005) -> None:
        self.interval_s = interval_s
        self.grace_s = grace_s
        self.stalls: list[Stall] = []
        self.collections: list[tuple[float, float, int, str]] = []
        #: Per generation: collections, their total and their longest duration (s).
        self.gc_totals: dict[int, tuple[int, float, float]] = {}
        self._beat = time.perf_counter()
        self._loop_thread = threading.get_ident()
        self._loop_tid = threading.get_native_id()
        self._stop = threading.Event()
        self._gc_started: dict[int, float] = {}
        self._thread = threading.Thread(target=self._watch, name="stall-watch", daemon=True)

    def start(self) -> None:
        self._loop_thread = threading.get_ident()
        self._loop_tid = threading.get_native_id()
        gc.callbacks.append(self._on_gc)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        gc.callbacks.remove(self._on_gc)

    def beat(self) -> None:
        """The ticker woke up (called on the loop)."""
        self._beat = time.perf_counter()

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        now, me = time.perf_counter(), threading.get_ident()
        if phase == "start":
            self._gc_started[me] = now
        elif me in self._gc_started:
            began = self._gc_started.pop(me)
            count, total, longest = self.gc_totals.get(info["generation"], (0, 0.0, 0.0))
            took = now - began
            self.gc_totals[info["generation"]] = (count + 1, total + took, max(longest, took))
            if took > 0.002:
                who = "loop" if me == self._loop_thread else threading.current_thread().name
                self.collections.append((began, now, info["generation"], who))

    def _watch(self) -> None:
        current: Stall | None = None
        while not self._stop.wait(_PERIOD_S):
            beat = self._beat
            now = time.perf_counter()
            if now - beat > self.interval_s + self.grace_s:
                if current is None or current.start != beat:
                    if current is not None:
                        self._ended(current, beat)
                    current = Stall(start=beat, sched_seen=self._sched(), seen=now)
                    self.stalls.append(current)
                frames = sys._current_frames()
                current.loop[_where(frames.get(self._loop_thread))] += 1
                for ident, frame in frames.items():
                    if ident not in (self._loop_thread, threading.get_ident()):
                        current.others[_where(frame, 3)] += 1
            elif current is not None:
                self._ended(current, beat)
                current = None

    def _ended(self, stall: Stall, beat: float) -> None:
        stall.end = beat
        stall.sched_end = self._sched()

    def _sched(self) -> tuple[int, int]:
        """The loop thread's time on a CPU and waiting for one, in ns (0s elsewhere)."""
        try:
            with open(f"/proc/self/task/{self._loop_tid}/schedstat") as f:
                running, waiting, _ = f.read().split()
        except (OSError, ValueError):
            return (0, 0)
        return int(running), int(waiting)

    def report(self, threshold_s: float, out: TextIO = sys.stderr) -> None:
        """Print every stall longer than ``threshold_s``, then the collections."""
        for stall in self.stalls:
            lag = stall.end - stall.start - self.interval_s
            if stall.end == 0.0 or lag < threshold_s:
                continue
            print(f"--- stall {lag * 1000:.1f} ms", file=out)
            if stall.sched_seen != (0, 0) and stall.sched_end != (0, 0):
                on_cpu = (stall.sched_end[0] - stall.sched_seen[0]) / 1e6
                queued = (stall.sched_end[1] - stall.sched_seen[1]) / 1e6
                window = (stall.end - stall.seen) * 1000
                print(
                    f"  loop thread over the last {window:.1f} ms: {on_cpu:.1f} on a CPU, "
                    f"{queued:.1f} waiting for one, the rest for the GIL or I/O",
                    file=out,
                )
            for began, ended, generation, who in self.collections:
                if began < stall.end and ended > stall.start:
                    took = (ended - began) * 1000
                    print(f"  gc gen{generation} {took:.1f} ms in {who}", file=out)
            for where, n in stall.loop.most_common(4):
                print(f"  loop x{n}: {where}", file=out)
            for where, n in stall.others.most_common(3):
                print(f"  other x{n}: {where}", file=out)
        for generation, (count, total, longest) in sorted(self.gc_totals.items()):
            print(
                f"gc gen{generation}: {count} collections, {total * 1000:.0f} ms in all, "
                f"longest {longest * 1000:.1f} ms",
                file=out,
            )
