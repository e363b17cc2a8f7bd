"""CPU time of the processes of a multi-process run, read from ``/proc``.

A process's figure includes its descendants' (a worker's pool processes), each read
from its own ``/proc/PID/stat`` while it lives; PostgreSQL's server processes are the
ones ``pg_stat_activity`` lists (backends, and the server's own helpers).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

_TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent PID, user + system CPU seconds) of ``pid``, or None if it is gone."""
    return _stat_of(Path(f"/proc/{pid}/stat"))


def _stat_of(path: Path) -> tuple[int, float] | None:
    """(parent PID, user + system CPU seconds) from a ``stat`` file of /proc (of a
    process, or of one of its threads), or None if it is gone."""
    try:
        text = path.read_text()
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) * _TICK_S


def cpu_by_pid() -> dict[int, tuple[int, float]]:
    """Every process's (parent, CPU seconds)."""
    found = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat is not None:
                found[int(entry.name)] = stat
    return found


def tree_cpu(root: int, table: dict[int, tuple[int, float]]) -> dict[int, float]:
    """CPU seconds of ``root`` and each of its descendants, by PID."""
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    out: dict[int, float] = {}
    todo = [root]
    while todo:
        pid = todo.pop()
        if pid in table:
            out[pid] = table[pid][1]
            todo.extend(children.get(pid, ()))
    return out


def pids_cpu(pids: Iterable[int], table: dict[int, tuple[int, float]]) -> dict[int, float]:
    """CPU seconds of the given PIDs (those still alive)."""
    return {pid: table[pid][1] for pid in pids if pid in table}


def spent(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds spent between two readings (a process new since ``before``: all of
    its time; one gone since: nothing after ``before`` can be read)."""
    return sum(t - before.get(pid, 0.0) for pid, t in after.items())


def _cmdline(pid: int) -> bytes:
    """``pid``'s command line (empty if it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def is_span_helper(pid: int) -> bool:
    """Is ``pid`` a span-exporting helper (``dagq.observability.exporting``)?"""
    return b"dagq.observability.exporting" in _cmdline(pid)


def by_part(root: int, reading: dict[int, float], helpers: set[int]) -> dict[str, list[int]]:
    """The PIDs of a tree reading by part: ``main`` (the root), ``helper`` (span
    helpers: ``helpers``, found by :func:`is_span_helper` while they lived), ``other``
    (pool processes and the rest)."""
    parts: dict[str, list[int]] = {"main": [], "helper": [], "other": []}
    for pid in reading:
        part = "main" if pid == root else "helper" if pid in helpers else "other"
        parts[part].append(pid)
    return parts


#: The environment variable naming the PID of the storage server a benchmark run
#: started (Azurite), whose CPU the run reports apart (``server_cpu_s``).
SERVER_PID = "DAGQ_BENCH_SERVER_PID"


@dataclass(frozen=True, slots=True)
class ServerCpu:
    """A reading of the storage server's CPU seconds: all its threads and children, and
    its main thread alone (Azurite runs its JavaScript, every request's work, on that one
    thread: what it can serve is bounded by one core)."""

    total: float
    main_thread: float


def server_cpu() -> ServerCpu | None:
    """CPU seconds so far of the storage server this run started (with its children),
    or None when it started none (a server already running is shared: not counted)."""
    pid = os.environ.get(SERVER_PID)
    if not pid:
        return None
    main = _stat_of(Path(f"/proc/{pid}/task/{pid}/stat"))
    return ServerCpu(
        sum(tree_cpu(int(pid), cpu_by_pid()).values()), main[1] if main is not None else 0.0
    )


def add_server_cpu(
    result: dict[str, object], cpu_s: float, before: ServerCpu | None, after: ServerCpu | None
) -> None:
    """Put the server's CPU seconds over a run (``server_cpu_s``; its main thread's,
    ``server_main_thread_cpu_s``) and the CPU of the run and the server per task
    (``cpu_ms_per_task``) in ``result``, when there is a server to count (readings from
    :func:`server_cpu`)."""
    if before is None or after is None:
        return
    tasks = result["tasks"]
    assert isinstance(tasks, int)
    spent = after.total - before.total
    result["server_cpu_s"] = round(spent, 4)
    result["server_main_thread_cpu_s"] = round(after.main_thread - before.main_thread, 4)
    result["cpu_ms_per_task"] = round((cpu_s + spent) * 1000 / tasks, 3)


#: A thread of a process tree: (process ID, thread ID).
Thread = tuple[int, int]


class TreeSampler:
    """Every thread's CPU seconds in the process tree under ``root`` (a process this one
    started), read from ``/proc`` every ``interval_s`` in a thread of this process while
    the tree runs, each reading with its time: what each thread spent in a window (a
    run's, from its first task's start to its end) is found afterwards
    (:meth:`spent_in`), to the interval's precision. Children are found through each
    thread's ``children`` file, so a reading touches the tree alone. ``cpu_s``: this
    sampler's own CPU (to leave out of the benchmark process's figure)."""

    def __init__(self, root: int, interval_s: float = 0.05) -> None:
        self.root = root
        self.interval_s = interval_s
        self.readings: list[tuple[float, dict[Thread, float]]] = []
        #: Process ID → its part (:func:`part_of`), found when it was first seen.
        self.parts: dict[int, str] = {}
        self.cpu_s = 0.0
        self._root_cmdline: bytes | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tree-sampler", daemon=True)

    def __enter__(self) -> TreeSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            self.readings.append((time.time(), self._read()))
            if self._stop.wait(self.interval_s):
                break
        self.cpu_s = time.thread_time()

    def _read(self) -> dict[Thread, float]:
        reading: dict[Thread, float] = {}
        todo = [self.root]
        while todo:
            pid = todo.pop()
            try:
                tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
            except OSError:
                continue
            if pid not in self.parts:
                part = part_of(pid, self.root)
                # A child forked by the root and not yet exec'd (a span helper being
                # started) still shows the root's command line: looked at again next time.
                if pid == self.root or part != "pool processes" or not self._as_root(pid):
                    self.parts[pid] = part
            for tid in tids:
                stat = _stat_of(Path(f"/proc/{pid}/task/{tid}/stat"))
                if stat is not None:
                    reading[(pid, tid)] = stat[1]
                with contextlib.suppress(OSError):
                    todo.extend(
                        int(c) for c in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()
                    )
        return reading

    def _as_root(self, pid: int) -> bool:
        """Does ``pid`` show the root's command line (forked by it, not yet exec'd)?"""
        if self._root_cmdline is None:
            self._root_cmdline = _cmdline(self.root)
        return _cmdline(pid) == self._root_cmdline

    def spent_in(self, start: float, end: float) -> dict[Thread, float]:
        """CPU seconds each thread spent from ``start`` to ``end`` (seconds since the
        epoch): its last reading at or before ``end`` less its last at or before
        ``start`` (none: nothing yet)."""
        at_start: dict[Thread, float] = {}
        at_end: dict[Thread, float] = {}
        for when, reading in self.readings:
            if when <= start:
                at_start.update(reading)
            if when <= end:
                at_end.update(reading)
        return {t: cpu - at_start.get(t, 0.0) for t, cpu in at_end.items()}

    def total(self) -> dict[Thread, float]:
        """CPU seconds of each thread in its last reading (its whole life, less what it
        spent after that reading if it ended between two)."""
        last: dict[Thread, float] = {}
        for _, reading in self.readings:
            last.update(reading)
        return last

    def by_part(self, spent: dict[Thread, float]) -> dict[str, float]:
        """``spent`` summed by part: ``main thread`` and ``other threads`` of the root,
        ``span helper``, ``pool processes`` (every other descendant)."""
        parts: dict[str, float] = {}
        for (pid, tid), cpu in spent.items():
            part = self.parts.get(pid, "pool processes")
            if part == "main":
                part = "main thread" if tid == pid else "other threads"
            parts[part] = parts.get(part, 0.0) + cpu
        return parts


def part_of(pid: int, root: int) -> str:
    """The part of a process tree ``pid`` is: ``main`` (the root), ``span helper`` or
    ``pool processes`` (every other descendant)."""
    if pid == root:
        return "main"
    return "span helper" if is_span_helper(pid) else "pool processes"
