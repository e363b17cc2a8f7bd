"""``dagq status``: where a run stands, once or watched until it ends.

On a terminal a live view (bar, counts, rate, ETA); piped, plain lines, and with
``--watch`` one line per interval (piped, rich is not imported). A failed run shows its
root causes — the tasks that failed themselves — and only counts the tasks that did not
run because of them. While the run waits for a signal, a timer or a queue nobody serves,
no ETA is guessed: the status says what it waits for instead.
"""

from __future__ import annotations

import asyncio
import sys
import time

import msgspec

from dagq.cli import EXIT_FAILED, EXIT_OK
from dagq.cli.connection import with_client
from dagq.cli.states import (
    counts_text,
    duration,
    first_line,
    progress_lines,
    state_text,
    task_state,
)
from dagq.cli.styled import Styled
from dagq.cli.tables import (
    Listing,
    Part,
    emit,
    is_terminal,
    print_json,
    printable,
    when,
    write_lines,
)
from dagq.client import Client, WorkflowStatus
from dagq.errors import DagqError
from dagq.plan import Plan
from dagq.state import UNSET, WORKFLOW_ACTIVE, RunState, TaskStatus
from dagq.views import UNDO_LABELS, load_run

#: How many root-cause failures ``status`` lists before counting the rest.
FAILED_SHOWN = 20
#: How many waiting tasks ``status`` names.
WAITS_SHOWN = 3
#: Ready tasks that nobody has taken for this long, with nothing running: a stuck queue.
STUCK_S = 5.0


class Waiting(msgspec.Struct, frozen=True):
    """What a run waits for, instead of an ETA: a few words for the progress line, the
    whole story, and the command that would end the wait."""

    short: str
    detail: str
    fix: str | None = None


def waits_in(plan: Plan, st: RunState, now: float) -> list[Waiting]:
    """What the run waits for, if it cannot make progress on its own: tasks waiting for
    a signal or a timer, or — nothing running — ready tasks sent to a queue no worker
    has taken them from for :data:`STUCK_S` seconds."""
    if st.status not in WORKFLOW_ACTIVE:
        return []
    waiting = st.indexes(TaskStatus.WAITING)
    if waiting:
        return [_waiting(plan, st, i, now) for i in waiting[:WAITS_SHOWN]]
    if st.indexes(TaskStatus.RUNNING):
        return []
    sent: dict[str, list[int]] = {}
    for i in st.indexes(TaskStatus.READY):
        if st.dispatched_at[i] != UNSET and now - st.dispatched_at[i] > STUCK_S:
            sent.setdefault(plan.tasks[i].queue, []).append(i)
    return [
        Waiting(
            short=f"a worker on queue '{queue}'",
            detail=f"{len(found)} task(s) sent to queue '{queue}' "
            f"{duration(now - min(st.dispatched_at[i] for i in found))} ago and not taken "
            f"({', '.join(plan.tasks[i].name for i in found[:WAITS_SHOWN])}"
            f"{' …' if len(found) > WAITS_SHOWN else ''})",
            fix=f"is a worker serving it? start one: dagq worker -q {queue}",
        )
        for queue, found in sent.items()
    ]


def _waiting(plan: Plan, st: RunState, i: int, now: float) -> Waiting:
    task = plan.tasks[i]
    wake = st.wake_at.get(i)
    left = f"{duration(max(0.0, wake - now))}" if wake is not None else None
    if task.wait is not None:
        signal = task.wait.signal
        gives_up = f"; it gives up in {left} ({task.wait.on_timeout})" if left else ""
        return Waiting(
            short=f"signal '{signal}'",
            detail=f"{task.name} waits for signal '{signal}'{gives_up}",
            fix=f"dagq signal {st.workflow_id} {signal} [--data JSON]",
        )
    return Waiting(
        short=f"a timer (fires in {left})" if left else "a timer",
        detail=f"{task.name} waits for a durable timer" + (f"; it fires in {left}" if left else ""),
    )


#: Run states after which some tasks may have been compensated (undone).
_UNDONE_AFTER = frozenset({"compensating", "compensation_failed", "failed", "cancelled"})


def undone_in(plan: Plan, st: RunState) -> str | None:
    """``compensated: charge, book`` for a run whose completed tasks were undone."""
    by_state: dict[str, list[str]] = {}
    for i, code in st.undo_status.items():
        shown = task_state("completed", UNDO_LABELS.get(code))
        by_state.setdefault(shown, []).append(plan.tasks[i].name)
    return "; ".join(f"{label}: {', '.join(names)}" for label, names in by_state.items()) or None


async def facts_of(
    client: Client, status: WorkflowStatus, now: float
) -> tuple[list[Waiting], str | None]:
    """What the run waits for, and which tasks were undone — read from its state only
    when the counts say there may be something to tell."""
    counts = status.counts
    maybe_waits = status.status in WORKFLOW_ACTIVE and (
        counts.get("waiting") or (counts.get("ready") and not counts.get("running"))
    )
    if not maybe_waits and status.status not in _UNDONE_AFTER:
        return [], None
    try:
        _, plan, st = await load_run(client.store, status.id)
    except DagqError:  # gone or damaged meanwhile: the status says what it can
        return [], None
    return waits_in(plan, st, now), undone_in(plan, st)


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
    parts: list[Part] = [
        *progress_lines(
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
        ),
    ]
    times = f"created {when(status.created_at)}"
    if status.finished_at is not None:
        times += f", finished {when(status.finished_at)}"
    parts.append(Styled(times, "dim"))
    parts.append(counts_text(status.counts))
    parts += _warnings(status)
    if undone:
        parts.append(Styled(undone, "yellow"))
    for wait in waits:
        parts.append(Styled(wait.detail, "magenta"))
        if wait.fix:
            parts.append(Styled(f"    → {wait.fix}", "dim"))
    if status.error:
        parts.append(Styled(f"error: {printable(status.error)}", "red"))
    parts += _failures(status)
    return parts


def _warnings(status: WorkflowStatus) -> list[Part]:
    parts: list[Part] = []
    if status.status == "compensation_failed":
        parts.append(
            Styled(
                f"⚠ a compensation failed: side effects may be left half undone; a person must "
                f"look (dagq tasks {status.id})",
                "bold white on red",
            )
        )
    if status.quarantined:
        parts.append(
            Styled(
                f"⚠ quarantined: the coordinator set this run aside (other runs go on); "
                f"fix the cause, then: dagq quarantine release {status.id}",
                "bold white on red",
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
                Styled(f"… and {more} more failed tasks (dagq tasks {status.id} --state failed)")
            )
    upstream = status.counts.get("upstream_failed", 0)
    if upstream:
        parts.append(
            Styled(
                f"… and {upstream} task{'s' if upstream != 1 else ''} upstream_failed "
                f"(dagq tasks {status.id} --state upstream_failed)",
                "red",
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
        if not watch:
            status = await client.status(workflow_id)
            await _show(client, status, as_json)
            return EXIT_OK
        if as_json:
            status = await client.wait(workflow_id, poll_s=interval_s)
            print_json(status)
        elif is_terminal():
            status = await _watch_live(client, workflow_id, interval_s)
        else:
            status = await _watch_lines(client, workflow_id, interval_s)
        return EXIT_OK if status.status == "completed" else EXIT_FAILED

    return with_client(store_url, body)


async def _show(client: Client, status: WorkflowStatus, as_json: bool) -> None:
    if as_json:
        print_json(status)
        return
    now = time.time()
    waits, undone = await facts_of(client, status, now)
    emit(status_view(status, now, waits, terminal=is_terminal(), undone=undone))


def _ended(status: WorkflowStatus) -> bool:
    return status.terminal or status.quarantined


async def _watch_live(client: Client, workflow_id: str, interval_s: float) -> WorkflowStatus:
    # The one part of this command that draws: rich is imported when it does.
    from rich.live import Live

    from dagq.cli.terminal import out_console, rendered

    out = out_console()
    status = await client.status(workflow_id)
    now = time.time()
    waits, undone = await facts_of(client, status, now)
    view = rendered(status_view(status, now, waits, terminal=True, undone=undone), out.width)
    with Live(view, console=out, refresh_per_second=4) as live:
        while not _ended(status):
            await asyncio.sleep(interval_s)
            status = await client.status(workflow_id)
            now = time.time()
            waits, undone = await facts_of(client, status, now)
            parts = status_view(status, now, waits, terminal=True, undone=undone)
            live.update(rendered(parts, out.width))
    return status


async def _watch_lines(client: Client, workflow_id: str, interval_s: float) -> WorkflowStatus:
    """One line per interval (a pipe, a log file), the last one when the run ends."""
    while True:
        started = time.monotonic()
        status = await client.status(workflow_id)
        now = time.time()
        write_lines(
            [status_line(status, now, (await facts_of(client, status, now))[0])], sys.stdout
        )
        if _ended(status):
            return status
        await asyncio.sleep(max(0.0, interval_s - (time.monotonic() - started)))
