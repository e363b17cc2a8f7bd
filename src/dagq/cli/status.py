"""``dagq status``: where a run stands, once or watched until it ends.

On a terminal a live view (bar, counts, rate, ETA); piped, plain lines, and with
``--watch`` one line per interval. A failed run shows its root causes — the tasks that
failed themselves — and only counts the tasks that did not run because of them. While the
run waits for a signal, a timer or a queue nobody serves, no ETA is guessed: the status
says what it waits for instead.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from rich.console import Console
from rich.live import Live
from rich.text import Text

from dagq.cli.display import (
    counts_text,
    duration,
    first_line,
    progress_lines,
    state_text,
    task_state,
)
from dagq.cli.inspect import EXIT_FAILED, EXIT_OK, print_json, when, with_client
from dagq.cli.tables import Listing, Part, out_console, plain_out, printable, rendered, show
from dagq.client import Client, WorkflowStatus
from dagq.errors import DagqError
from dagq.views import UNDO_LABELS, load_run

#: How many root-cause failures ``status`` lists before counting the rest.
FAILED_SHOWN = 20
#: How many waiting tasks ``status`` names.
WAITS_SHOWN = 3
#: Ready tasks that nobody has taken for this long, with nothing running: a stuck queue.
STUCK_S = 5.0


@dataclass(frozen=True, slots=True)
class Waiting:
    """What a task of the run waits for, instead of an ETA."""

    task: str
    kind: str
    detail: str
    fix: str | None

    @property
    def short(self) -> str:
        """A few words for the progress line."""
        if self.kind == "signal":
            return self.detail.split(";")[0].replace("waits for ", "")
        if self.kind == "timer":
            return "a timer" + self.detail.partition("it fires")[2]
        if self.kind in ("queue", "no_worker", "dead_letter"):
            return f"a worker ({self.task} is not taken from its queue)"
        return f"{self.task}: {self.detail}"


#: Run states after which some tasks may have been compensated (undone).
_UNDONE_AFTER = frozenset({"compensating", "compensation_failed", "failed", "cancelled"})


async def undo_line(client: Client, status: WorkflowStatus) -> str | None:
    """``compensated: charge, book`` for a run whose completed tasks were undone."""
    if status.status not in _UNDONE_AFTER:
        return None
    try:
        _, plan, st = await load_run(client.store, status.id)
    except DagqError:
        return None
    by_state: dict[str, list[str]] = {}
    for i, code in st.undo_status.items():
        shown = task_state("completed", UNDO_LABELS.get(code))
        by_state.setdefault(shown, []).append(plan.tasks[i].name)
    return "; ".join(f"{label}: {', '.join(names)}" for label, names in by_state.items()) or None


async def waits_of(client: Client, status: WorkflowStatus, now: float) -> list[Waiting]:
    """What the run waits for, if it is not making progress on its own: tasks waiting
    for a signal or a timer, or ready tasks a stuck queue holds (nothing running)."""
    counts = status.counts
    if status.terminal or status.quarantined:
        return []
    names: list[str] = []
    if counts.get("waiting"):
        names = [t.name for t in await client.tasks(status.id, state="waiting")]
    elif counts.get("ready") and not counts.get("running") and now - status.updated_at > STUCK_S:
        names = [t.name for t in await client.tasks(status.id, state="ready")][:1]
    found = []
    for name in names[:WAITS_SHOWN]:
        try:
            explained = await client.explain(status.id, name)
        except DagqError:  # it moved on meanwhile
            continue
        found += [Waiting(name, w.kind, w.detail, w.fix) for w in explained.waiting_for[:1]]
    return found


def status_view(
    status: WorkflowStatus,
    now: float,
    waits: list[Waiting],
    *,
    terminal: bool,
    undone: str | None = None,
) -> list[Part]:
    """Name, state, times, progress, counts, what it waits for (or an ETA), and the
    tasks that failed (upstream_failed ones only counted)."""
    elapsed = (status.finished_at or now) - status.created_at
    rate = status.done / elapsed if elapsed > 0 else 0.0
    remaining = status.total - status.done
    eta = None if waits else "-" if status.terminal or rate <= 0 else duration(remaining / rate)
    parts: list[Part] = progress_lines(
        name=status.name,
        workflow_id=status.id,
        status=status.status,
        done=status.done,
        total=status.total,
        rate=rate,
        elapsed=elapsed,
        eta=eta,
        waiting=", ".join(w.short for w in waits) or None,
        bar=terminal,
    )
    times = f"created {when(status.created_at)}"
    if status.finished_at is not None:
        times += f", finished {when(status.finished_at)}"
    parts.append(Text(times, style="dim"))
    parts.append(counts_text(status.counts))
    parts += _warnings(status)
    if undone:
        parts.append(Text(undone, style="yellow"))
    for wait in waits:
        parts.append(Text(f"{wait.task} {wait.detail}", style="magenta"))
        if wait.fix:
            parts.append(Text(f"    → {wait.fix}", style="dim"))
    if status.error:
        parts.append(Text(f"error: {printable(status.error)}", style="red"))
    parts += _failures(status)
    return parts


def _warnings(status: WorkflowStatus) -> list[Part]:
    parts: list[Part] = []
    if status.status == "compensation_failed":
        parts.append(
            Text(
                f"⚠ a compensation failed: side effects may be left half undone; a person must "
                f"look (dagq tasks {status.id})",
                style="bold white on red",
            )
        )
    if status.quarantined:
        parts.append(
            Text(
                f"⚠ quarantined: the coordinator set this run aside (other runs go on); "
                f"fix the cause, then: dagq quarantine release {status.id}",
                style="bold white on red",
            )
        )
    return parts


def _failures(status: WorkflowStatus) -> list[Part]:
    """The root causes (tasks that failed themselves), then a count of the tasks that
    did not run because of them."""
    roots = [task for task in status.failed if task.status == "failed"]
    parts: list[Part] = []
    if roots:
        table = Listing(["failed task", "state", "attempt", "error"], right=frozenset({"attempt"}))
        for task in roots[:FAILED_SHOWN]:
            table.add_row(
                task.name,
                state_text(task.status, task.compensation),
                str(task.attempt),
                first_line(task.error, 200),
            )
        parts.append(table)
        more = len(roots) - FAILED_SHOWN
        if more > 0:
            parts.append(
                Text(f"… and {more} more failed tasks (dagq tasks {status.id} --state failed)")
            )
    upstream = status.counts.get("upstream_failed", 0)
    if upstream:
        parts.append(
            Text(
                f"… and {upstream} task{'s' if upstream != 1 else ''} upstream_failed "
                f"(dagq tasks {status.id} --state upstream_failed)",
                style="red",
            )
        )
    return parts


def status_line(status: WorkflowStatus, now: float, waits: list[Waiting]) -> str:
    """One plain line: time, state, progress, counts, and what it waits for."""
    line = (
        f"{when(now)} {status.id} {status.status} {status.done}/{status.total} "
        f"({counts_text(status.counts).plain or 'no tasks'})"
    )
    if waits:
        line += f"; waiting for {', '.join(w.short for w in waits)}"
    elif status.error and (status.terminal or status.quarantined):
        line += f": {first_line(status.error, 200)}"
    return printable(line, one_line=True)


def run_status(
    store_url: str, workflow_id: str, *, watch: bool, as_json: bool, interval_s: float = 2.0
) -> int:
    """``dagq status``: once, or refreshed every ``interval_s`` until the run ends (then
    its exit code: 0 completed, 1 otherwise)."""

    async def body(client: Client) -> int:
        out = out_console()
        if not watch:
            status = await client.status(workflow_id)
            await _show(client, out, status, as_json)
            return EXIT_OK
        if as_json:
            status = await client.wait(workflow_id, poll_s=interval_s)
            print_json(status)
        elif out.is_terminal:
            status = await _watch_live(client, out, workflow_id, interval_s)
        else:
            status = await _watch_lines(client, out, workflow_id, interval_s)
        return EXIT_OK if status.status == "completed" else EXIT_FAILED

    return with_client(store_url, body)


async def _show(client: Client, out: Console, status: WorkflowStatus, as_json: bool) -> None:
    if as_json:
        print_json(status)
        return
    now = time.time()
    waits = await waits_of(client, status, now)
    undone = await undo_line(client, status)
    show(out, status_view(status, now, waits, terminal=out.is_terminal, undone=undone))


def _ended(status: WorkflowStatus) -> bool:
    return status.terminal or status.quarantined


async def _watch_live(
    client: Client, out: Console, workflow_id: str, interval_s: float
) -> WorkflowStatus:
    status = await client.status(workflow_id)
    now = time.time()
    waits = await waits_of(client, status, now)
    view = rendered(status_view(status, now, waits, terminal=True), out.width)
    with Live(view, console=out, refresh_per_second=4) as live:
        while not _ended(status):
            await asyncio.sleep(interval_s)
            status = await client.status(workflow_id)
            now = time.time()
            waits = await waits_of(client, status, now)
            live.update(rendered(status_view(status, now, waits, terminal=True), out.width))
    return status


async def _watch_lines(
    client: Client, out: Console, workflow_id: str, interval_s: float
) -> WorkflowStatus:
    """One line per interval (a pipe, a log file), the last one when the run ends."""
    while True:
        started = time.monotonic()
        status = await client.status(workflow_id)
        now = time.time()
        plain_out(out, status_line(status, now, await waits_of(client, status, now)))
        if _ended(status):
            return status
        await asyncio.sleep(max(0.0, interval_s - (time.monotonic() - started)))
