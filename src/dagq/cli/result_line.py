"""The result of a run in one line, for ``dagq run --quiet`` (and ``retry --run --quiet``).

``completed: ID (1,002 tasks in 410ms)``; a run that did not complete says why on the
same line, and a second line names its failed tasks (the first few), so a script's log
shows what broke without the task table: ``dagq tasks ID --state failed`` has the rest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dagq.cli.printable import printable

if TYPE_CHECKING:
    from dagq.views import RunView

#: Failed tasks named on the second line; the rest are counted.
NAMED_FAILURES = 10


def result_lines(view: RunView, elapsed_s: float | None) -> list[str]:
    """One line for a completed run; for any other, the line and the failed tasks."""
    span = elapsed_s
    if span is None and view.finished_at is not None:
        span = view.finished_at - view.created_at
    timing = f" in {duration(span)}" if span is not None else ""
    tasks = "task" if view.total == 1 else "tasks"
    line = f"{view.status}: {view.workflow_id} ({view.total:,} {tasks}{timing})"
    if view.status == "completed":
        return [line]
    first = (view.error or "").strip().splitlines()
    if first:  # a reason of blanks (a cancel's, from the API) says nothing
        line += f": {printable(first[0], one_line=True)}"
    # The tasks that broke, not those that did not run because another broke.
    broken = [row.name for row in view.tasks if "failed" in (row.status, row.compensation)]
    if not broken:
        return [line]
    named = ", ".join(printable(name, one_line=True) for name in broken[:NAMED_FAILURES])
    more = f" and {len(broken) - NAMED_FAILURES:,} more" if len(broken) > NAMED_FAILURES else ""
    return [
        line,
        f"failed tasks: {named}{more} (errors: dagq tasks {view.workflow_id} --state failed)",
    ]


def duration(seconds: float | None) -> str:
    """``410ms``, ``3.2s``, ``2:05`` (minutes), ``1:02:05`` (hours); ``-`` for None."""
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 120:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
