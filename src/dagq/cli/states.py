"""How states, counts and progress read: their words and colours, without rich.

What ``dagq status`` and ``dagq list`` print is built from these; piped, only the text
is written and rich is never imported (:mod:`dagq.cli.styled`).
"""

from __future__ import annotations

import sys

from dagq.cli.result_line import duration
from dagq.cli.styled import Bar, Styled
from dagq.state import TaskStatus

__all__ = ["duration"]  # re-exported: the commands took it from here

STYLES = {
    "pending": "dim",
    "ready": "cyan",
    "running": "blue",
    "waiting": "magenta",
    "completed": "green",
    "failed": "bold red",
    "skipped": "yellow",
    "upstream_failed": "red",
    "cancelled": "bright_black",
    "cancelling": "yellow",
    "quarantined": "bold white on red",
    "compensating": "yellow",
    "compensated": "yellow",
    "compensation_failed": "bold white on red",
}
#: How a task whose compensation ran is shown, by where the compensation stands.
COMPENSATION_STATES = {
    "queued": "compensating",
    "sent": "compensating",
    "done": "compensated",
    "failed": "compensation_failed",
}
ORDER = [s.label for s in TaskStatus]


def task_state(status: str, compensation: str | None) -> str:
    """A task's state as people see it: a completed task that was undone is
    ``compensated`` (``compensating`` meanwhile, ``compensation_failed`` if it failed)."""
    return COMPENSATION_STATES.get(compensation or "", status)


def state_text(status: str, compensation: str | None = None) -> Styled:
    """:func:`task_state`, coloured."""
    shown = task_state(status, compensation)
    return Styled(shown, STYLES.get(shown, ""))


def counts_text(counts: dict[str, int]) -> Styled:
    """``completed 12 · running 3 · ...`` in the order of a task's life, coloured."""
    text = Styled()
    for label in ORDER:
        n = counts.get(label)
        if not n:
            continue
        if text:
            text.append(" · ", style="dim")
        text.append(f"{label} {n:,}", style=STYLES.get(label, ""))
    return text


def progress_lines(
    *,
    name: str,
    workflow_id: str,
    status: str,
    done: int,
    total: int,
    rate: float,
    elapsed: float,
    eta: str | None = None,
    waiting: str | None = None,
    bar: bool = True,
) -> list[Styled | Bar]:
    """Name, id and state; then a progress bar (``bar``) with count, rate, elapsed, and
    the ETA — or, while the run waits for something, what it waits for instead."""
    head = Styled.assemble(
        (name, "bold"), "  ", (workflow_id, "dim"), "  ", (status, STYLES.get(status, "bold"))
    )
    timing = f"{rate:,.1f} tasks/s  elapsed {duration(elapsed)}"
    if waiting is not None:
        timing += f"  waiting for {waiting} (no ETA)"
    elif eta is not None:
        timing += f"  eta {eta}"
    count = f"{done:,}/{total:,}  {100 * done / max(total, 1):.0f}%"
    if not bar:
        return [head, Styled(f"{count}  {timing}")]
    return [head, Bar(done=done, total=total, count=count, timing=timing)]


def error_cell(text: str | None, limit: int = 300) -> str:
    """An error in a table: whole when piped (scripts get every line; a cell shows a
    newline as ``\\n``), its first line, cut at ``limit``, on a terminal."""
    if text and text.strip() and not sys.stdout.isatty():
        return text.strip()
    return first_line(text, limit)


def first_line(text: str | None, limit: int = 300) -> str:
    """The first line of an error (its traceback stays in ``dagq tasks`` / ``logs``)."""
    if not text or not text.strip():
        return ""
    line = text.strip().splitlines()[0]
    return line if len(line) <= limit else line[:limit] + "…"
