"""CPU time of the processes of a multi-process run, read from ``/proc``.

A process's figure includes its descendants' (a worker's pool processes), each read
from its own ``/proc/PID/stat`` while it lives; PostgreSQL's server processes are the
ones ``pg_stat_activity`` lists (backends, and the server's own helpers).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

_TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent PID, user + system CPU seconds) of ``pid``, or None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
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


def is_span_helper(pid: int) -> bool:
    """Is ``pid`` a span-exporting helper (``dagq.observability.exporting``)?"""
    try:
        return b"dagq.observability.exporting" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def by_part(root: int, reading: dict[int, float], helpers: set[int]) -> dict[str, list[int]]:
    """The PIDs of a tree reading by part: ``main`` (the root), ``helper`` (span
    helpers: ``helpers``, found by :func:`is_span_helper` while they lived), ``other``
    (pool processes and the rest)."""
    parts: dict[str, list[int]] = {"main": [], "helper": [], "other": []}
    for pid in reading:
        part = "main" if pid == root else "helper" if pid in helpers else "other"
        parts[part].append(pid)
    return parts
