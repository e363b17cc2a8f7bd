"""Terminal output: live progress while a run goes, a summary table when it ends.

Rich renders colours and a live display on a terminal; piped, the same information
comes out as plain lines at a calm pace, so logs stay readable.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from dagq.cli.result_line import duration
from dagq.cli.tables import Listing, printable
from dagq.state import TERMINAL, TaskStatus

if TYPE_CHECKING:  # not imported to run: `dagq list` needs no plans nor views
    from dagq.plan import Plan
    from dagq.state import RunState
    from dagq.views import RunView

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
MAX_ROWS = 40
PLAIN_INTERVAL_S = 5.0


def task_state(status: str, compensation: str | None) -> str:
    """A task's state as people see it: a completed task that was undone is
    ``compensated`` (``compensating`` meanwhile, ``compensation_failed`` if it failed)."""
    return COMPENSATION_STATES.get(compensation or "", status)


def state_text(status: str, compensation: str | None = None) -> Text:
    """:func:`task_state`, coloured."""
    shown = task_state(status, compensation)
    return Text(shown, style=STYLES.get(shown, ""))


def counts_text(counts: dict[str, int]) -> Text:
    """``completed 12 · running 3 · ...`` in the order of a task's life, coloured."""
    text = Text()
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
) -> list[Any]:
    """Name, id and state; then a progress bar (``bar``) with count, rate, elapsed, and
    the ETA — or, while the run waits for something, what it waits for instead."""
    head = Text.assemble(
        (name, "bold"), "  ", (workflow_id, "dim"), "  ", (status, STYLES.get(status, "bold"))
    )
    timing = f"{rate:,.1f} tasks/s  elapsed {duration(elapsed)}"
    if waiting is not None:
        timing += f"  waiting for {waiting} (no ETA)"
    elif eta is not None:
        timing += f"  eta {eta}"
    count = f"{done:,}/{total:,}  {100 * done / max(total, 1):.0f}%"
    if not bar:
        return [head, Text(f"{count}  {timing}")]
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True)
    grid.add_column(no_wrap=True)
    grid.add_column(overflow="fold")  # what it waits for is never cut short
    grid.add_row(
        ProgressBar(total=max(total, 1), completed=done, width=40),
        Text(count),
        Text(timing, style="dim"),
    )
    return [head, grid]


class LiveProgress:
    """The live view of one run: bar, counts, rate, elapsed, tasks running now."""

    def __init__(self, console: Console, workflow_id: str, name: str) -> None:
        self.console = console
        self.workflow_id = workflow_id
        self.name = printable(name, one_line=True)
        self.started = time.monotonic()
        self.first_done: int | None = None
        self._live: Live | None = None
        self._last_plain = 0.0
        self._last_line = ""

    def __enter__(self) -> LiveProgress:
        if self.console.is_terminal:
            self._live = Live(console=self.console, refresh_per_second=8, transient=True)
            self._live.__enter__()
        else:
            self.console.print(f"running {self.name} as {self.workflow_id}", markup=False)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)
            self._live = None

    def update(self, plan: Plan, st: RunState) -> None:
        """Show the latest state (cheap enough to call many times a second)."""
        done = st.n_terminal
        if self.first_done is None:
            self.first_done = done
        elapsed = time.monotonic() - self.started
        rate = (done - self.first_done) / elapsed if elapsed > 0 else 0.0
        if self._live is not None:
            self._live.update(self._render(plan, st, done, elapsed, rate))
            return
        now = time.monotonic()
        line = f"{st.status}: {done}/{st.n_tasks} done ({counts_text(st.count_map()).plain})"
        waiting = waiting_text(plan, st)
        if waiting:
            line += f"; {waiting}"
        if now - self._last_plain >= PLAIN_INTERVAL_S and line != self._last_line:
            self.console.print(f"[{duration(elapsed)}] {line}, {rate:.1f} tasks/s")
            self._last_plain, self._last_line = now, line

    def _render(self, plan: Plan, st: RunState, done: int, elapsed: float, rate: float) -> Group:
        parts = progress_lines(
            name=self.name,
            workflow_id=self.workflow_id,
            status=st.status,
            done=done,
            total=st.n_tasks,
            rate=rate,
            elapsed=elapsed,
        )
        parts.append(counts_text(st.count_map()))
        for i, group in st.groups.items():
            if st.task_status[i] == TaskStatus.RUNNING:
                parts.append(
                    Text(
                        f"{plan.tasks[i].name}: {group.settled:,}/{group.n:,} items done, "
                        f"{group.sent:,} running",
                        style="blue",
                    )
                )
        # A scan in C: a Python loop over 100,000 tasks at every refresh would stall the loop.
        running = [i for i in st.indexes(TaskStatus.RUNNING) if i not in st.groups]
        if running:
            now = time.time()
            shown = ", ".join(
                f"{plan.tasks[i].name} ({duration(max(0.0, now - st.started_at[i]))})"
                for i in running[:6]
            )
            more = f" and {len(running) - 6} more" if len(running) > 6 else ""
            parts.append(Text(f"running now: {shown}{more}", style="blue"))
        waiting = waiting_text(plan, st)
        if waiting:
            parts.append(Text(waiting, style="magenta"))
        return Group(*parts)


def waiting_text(plan: Plan, st: RunState, shown: int = 3) -> str:
    """``waiting: review (signal 'approve'), cool-off (timer, 30s left)`` or ''."""
    waiting = st.indexes(TaskStatus.WAITING)
    if not waiting:
        return ""
    now = time.time()
    named = []
    for i in waiting[:shown]:
        task = plan.tasks[i]
        wake = st.wake_at.get(i)
        if task.wait is not None:
            named.append(f"{task.name} (signal '{task.wait.signal}')")
        else:
            left = f", {duration(max(0.0, wake - now))} left" if wake is not None else ""
            named.append(f"{task.name} (timer{left})")
    more = f" and {len(waiting) - shown} more" if len(waiting) > shown else ""
    return f"waiting: {', '.join(named)}{more}"


def print_summary(console: Console, view: RunView, *, elapsed_s: float | None = None) -> None:
    """The end-of-run table (problem tasks first) and a one-line verdict.

    ``attempts`` counts tries of the task itself; a looping task's iterations and the
    attempts of a compensation have their own columns, shown when any task has them.
    """
    loops = any(row.iterations for row in view.tasks)
    undos = any(row.undos for row in view.tasks)
    columns = ["task", "state", "attempts"]
    columns += ["iterations"] * loops + ["undos"] * undos + ["duration", "error"]
    table = Listing(
        columns,
        title=f"{view.name}  {view.workflow_id}",
        right=frozenset({"attempts", "iterations", "undos", "duration"}),
    )
    rows = (
        sorted(view.tasks, key=lambda r: SUMMARY_RANK.get(r.status, 99))
        if len(view.tasks) > MAX_ROWS
        else view.tasks
    )
    for row in rows[:MAX_ROWS]:
        counted = [_count(row.iterations)] * loops + [_count(row.undos)] * undos
        table.add_row(
            row.name,
            state_text(row.status, row.compensation),
            str(row.attempts),
            *counted,
            duration(row.duration_s),
            error_cell(row.error),
        )
    table.print(console)
    hidden = rows[MAX_ROWS:]
    if hidden:
        kinds: dict[str, int] = {}
        for row in hidden:
            kinds[row.status] = kinds.get(row.status, 0) + 1
        console.print(Text("… and ", style="dim") + counts_text(kinds) + Text(" more", style="dim"))
    console.print(verdict_text(view, elapsed_s))


def _count(n: int) -> str:
    return str(n) if n else "-"


#: The order of the summary's rows when not all are shown: problems first.
SUMMARY_RANK = {
    label: n
    for n, label in enumerate(
        ["failed", "upstream_failed", "cancelled", "running", "ready", "pending", "skipped"]
    )
}


def verdict_text(view: RunView, elapsed_s: float | None) -> Text:
    """``✔ completed in 3.2s — 200 tasks, 61.5 tasks/s`` or the reason it did not."""
    span = elapsed_s
    if span is None and view.finished_at is not None:
        span = view.finished_at - view.created_at
    done = sum(n for label, n in view.counts.items() if TaskStatus[label.upper()] in TERMINAL)
    timing = ""
    if span is not None:
        timing = f" in {duration(span)} — {view.total:,} tasks"
        if span > 0:
            timing += f", {done / span:,.1f} tasks/s"
    if view.status == "completed":
        return Text(f"✔ workflow completed{timing}", style="bold green")
    reason = f": {printable(first_line(view.error))}" if view.error else ""
    return Text(f"✘ workflow {view.status}{timing}{reason}", style="bold red")


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
