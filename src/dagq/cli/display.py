"""Terminal output: live progress while a run goes, a summary table when it ends.

Rich renders colours and a live display on a terminal; piped, the same information
comes out as plain lines at a calm pace, so logs stay readable.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from dagq.cli.states import (
    COMPENSATION_STATES,
    ORDER,
    STYLES,
    counts_text,
    duration,
    error_cell,
    first_line,
    progress_lines,
    state_text,
    task_state,
)
from dagq.cli.styled import Styled
from dagq.cli.tables import Listing, Part, printable
from dagq.cli.terminal import out_console, rendered
from dagq.state import TERMINAL, TaskStatus

if TYPE_CHECKING:  # not imported to run: `dagq list` needs no plans nor views
    from dagq.plan import Plan
    from dagq.state import RunState
    from dagq.views import RunView

#: Re-exported (from dagq.cli.states, which draws nothing): the commands took them from here.
__all__ = [
    "COMPENSATION_STATES",
    "ORDER",
    "STYLES",
    "counts_text",
    "duration",
    "error_cell",
    "first_line",
    "progress_lines",
    "state_text",
    "task_state",
]

MAX_ROWS = 40
PLAIN_INTERVAL_S = 5.0


class RunScreen:
    """What ``dagq run`` draws (unless ``--quiet``): its words on a rich console, the live
    progress of the run, and the summary table at its end."""

    def __init__(self) -> None:
        self.console = out_console()

    def progress(self, workflow_id: str, name: str) -> LiveProgress:
        return LiveProgress(self.console, workflow_id, name)

    def summary(self, view: RunView, elapsed_s: float | None) -> None:
        print_summary(self.console, view, elapsed_s=elapsed_s)


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
        parts: list[Part] = [
            *progress_lines(
                name=self.name,
                workflow_id=self.workflow_id,
                status=st.status,
                done=done,
                total=st.n_tasks,
                rate=rate,
                elapsed=elapsed,
            ),
        ]
        parts.append(counts_text(st.count_map()))
        for i, group in st.groups.items():
            if st.task_status[i] == TaskStatus.RUNNING:
                parts.append(
                    Styled(
                        f"{plan.tasks[i].name}: {group.settled:,}/{group.n:,} items done, "
                        f"{group.sent:,} running",
                        "blue",
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
            parts.append(Styled(f"running now: {shown}{more}", "blue"))
        waiting = waiting_text(plan, st)
        if waiting:
            parts.append(Styled(waiting, "magenta"))
        return rendered(parts)


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
        console.print(Styled("… and ", "dim") + counts_text(kinds) + Styled(" more", "dim"))
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
