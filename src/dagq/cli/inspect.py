"""Commands that look at workflows: status, list, tasks, output, logs, events.

Each prints for people by default (rich tables, colours only on a terminal) and
stable JSON with ``--json`` (the fields of the structs in :mod:`dagq.client`).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

import msgspec
from rich.console import Console, Group
from rich.live import Live
from rich.table import Column, Table
from rich.text import Text

from dagq.cli.display import STYLES, counts_text, duration, first_line, progress_lines
from dagq.client import Client, TaskInfo, WorkflowStatus, WorkflowTask
from dagq.errors import DagqError

T = TypeVar("T")
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def console() -> Console:
    """stdout, coloured only on a terminal."""
    return Console(highlight=False)


def with_client(
    store_url: str, body: Callable[[Client], Awaitable[T]], *, create: bool = False
) -> T:
    """Open the store (which must exist unless ``create``), run ``body``, close it."""

    async def main() -> T:
        async with Client(store_url, create=create) as client:
            return await body(client)

    return asyncio.run(main())


def print_json(value: Any) -> None:
    """Stable JSON on stdout, one document."""
    print(msgspec.json.encode(value).decode())


def when(timestamp: float | None) -> str:
    """A local wall-clock time (just the time of day if today), or '-'."""
    if timestamp is None:
        return "-"
    moment = datetime.fromtimestamp(timestamp, UTC).astimezone()
    if moment.date() == datetime.now(UTC).astimezone().date():
        return moment.strftime("%H:%M:%S.%f")[:-3]
    return moment.strftime("%Y-%m-%d %H:%M:%S")


# --- status -------------------------------------------------------------------------


def status_view(status: WorkflowStatus, now: float) -> Group:
    """Name, state, progress bar, counts, rate, ETA, and the failed tasks."""
    elapsed = (status.finished_at or now) - status.created_at
    rate = status.done / elapsed if elapsed > 0 else 0.0
    remaining = status.total - status.done
    eta = "-" if status.terminal or rate <= 0 else duration(remaining / rate)
    parts = progress_lines(
        name=status.name,
        workflow_id=status.id,
        status=status.status,
        done=status.done,
        total=status.total,
        rate=rate,
        elapsed=elapsed,
        eta=eta,
    )
    parts.append(counts_text(status.counts))
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
    if status.error:
        parts.append(Text(f"error: {status.error}", style="red"))
    if status.failed:
        table = Table("failed task", "state", "attempt", "error", title=None, box=None)
        for task in status.failed[:20]:
            table.add_row(
                task.name,
                Text(task.status, style=STYLES[task.status]),
                str(task.attempt),
                _cut(task.error),
            )
        parts.append(table)
    return Group(*parts)


def run_status(store_url: str, workflow_id: str, *, watch: bool, as_json: bool) -> int:
    """``dagq status``: once, or refreshed until the run ends (then its exit code)."""

    async def body(client: Client) -> int:
        status = await client.status(workflow_id)
        if not watch:
            _show(status, as_json)
            return EXIT_OK
        out = console()
        if as_json or not out.is_terminal:
            status = await client.wait(workflow_id, poll_s=1.0)
            _show(status, as_json)
        else:
            with Live(status_view(status, time.time()), console=out, refresh_per_second=4) as live:
                while not (status.terminal or status.quarantined):
                    await asyncio.sleep(0.5)
                    status = await client.status(workflow_id)
                    live.update(status_view(status, time.time()))
        return EXIT_OK if status.status == "completed" else EXIT_FAILED

    return with_client(store_url, body)


def _show(status: WorkflowStatus, as_json: bool) -> None:
    if as_json:
        print_json(status)
    else:
        console().print(status_view(status, time.time()))


# --- list, tasks, output, logs, events -------------------------------------------------


def run_list(
    store_url: str, *, status: str | None, name: str | None, limit: int, as_json: bool
) -> int:
    """``dagq list``: runs, newest first."""
    rows = with_client(store_url, lambda c: c.list(status=status, name=name, limit=limit))
    if as_json:
        print_json(rows)
        return EXIT_OK
    table = Table(
        Column("id", no_wrap=True),
        "name",
        "status",
        "progress",
        Column("created", no_wrap=True),
        "error",
    )
    for row in rows:
        done = sum(n for s, n in row.counts.items() if s not in ("pending", "ready", "running"))
        style = STYLES.get(row.status, "")
        if row.status in ("compensation_failed", "quarantined"):
            style = "bold white on red"
        table.add_row(
            row.id,
            row.name,
            Text(row.status, style=style),
            f"{done}/{row.total}",
            when(row.created_at),
            _cut(row.error, 60),
        )
    console().print(table if rows else "no workflows")
    return EXIT_OK


@dataclass(frozen=True, slots=True)
class TaskFilter:
    """Which tasks ``dagq tasks`` shows."""

    state: str | None = None
    queue: str | None = None
    prefix: str | None = None
    #: At most this many (0: all); None: all of the workflows named, 100 across workflows.
    limit: int | None = None
    #: Each foreach task's instances too (of one workflow).
    instances: bool = False


#: How many tasks ``dagq tasks`` shows across workflows unless told otherwise.
ACROSS_LIMIT = 100


def run_tasks(store_url: str, workflow_ids: list[str], wanted: TaskFilter, *, as_json: bool) -> int:
    """``dagq tasks``: tasks of one run, of several, or of the recent ones (no id)."""
    if len(workflow_ids) == 1:
        tasks: list[TaskInfo] = with_client(
            store_url, lambda c: _tasks_of_one(c, workflow_ids[0], wanted)
        )
    else:
        limit = wanted.limit
        if limit is None:
            limit = 0 if workflow_ids else ACROSS_LIMIT
        found = with_client(
            store_url,
            lambda c: c.find_tasks(
                workflow_ids or None,
                state=wanted.state,
                queue=wanted.queue,
                prefix=wanted.prefix,
                limit=limit,
            ),
        )
        tasks = list(found)
    if as_json:
        print_json(tasks)
        return EXIT_OK
    across = len(workflow_ids) != 1
    table = Table(*(["workflow"] if across else []), "task", "state", "attempt", "queue")
    for column in ("started", "duration", "error"):
        table.add_column(column)
    for task in tasks:
        table.add_row(
            *([task.workflow] if isinstance(task, WorkflowTask) else []),
            task.name,
            Text(task.status, style=STYLES.get(task.status, "")),
            str(task.attempt),
            task.queue,
            when(task.started_at),
            duration(task.duration_s),
            _cut(task.error),
        )
    console().print(table if tasks or not across else "no tasks found")
    return EXIT_OK


async def _tasks_of_one(client: Client, workflow_id: str, wanted: TaskFilter) -> list[TaskInfo]:
    """The tasks of one run, as ``Client.tasks`` gives them (no workflow column)."""
    found = await client.tasks(workflow_id, state=wanted.state, instances=wanted.instances)
    found = [
        t
        for t in found
        if (wanted.queue is None or t.queue == wanted.queue)
        and (wanted.prefix is None or t.name.startswith(wanted.prefix))
    ]
    return found[: wanted.limit] if wanted.limit else found


def run_output(store_url: str, workflow_id: str, task: str, *, item: int = -1) -> int:
    """``dagq output``: the task's output (or one instance's) as JSON."""
    value = with_client(store_url, lambda c: c.output(workflow_id, task, item=item))
    print(msgspec.json.format(msgspec.json.encode(value).decode(), indent=2))
    return EXIT_OK


def run_logs(
    store_url: str,
    workflow_id: str,
    task: str,
    *,
    attempt: int | None,
    item: int = -1,
    undo: bool = False,
) -> int:
    """``dagq logs``: the kept stdout/stderr of an attempt, and its whole error."""
    text, error = with_client(
        store_url,
        lambda c: _logs_and_error(c, workflow_id, task, attempt=attempt, item=item, undo=undo),
    )
    print(text if text else "(no output was captured for this attempt)")
    if error:
        print(f"--- error ---\n{error}")
    return EXIT_OK


async def _logs_and_error(
    client: Client, workflow_id: str, task: str, *, attempt: int | None, item: int, undo: bool
) -> tuple[str, str | None]:
    """The log tail of an attempt and its whole error text (if it failed)."""
    text = await client.logs(workflow_id, task, attempt=attempt, item=item, undo=undo)
    return text, await client.error(workflow_id, task, attempt=attempt, item=item, undo=undo)


def run_events(store_url: str, workflow_id: str, *, as_json: bool, task: str | None = None) -> int:
    """``dagq events``: the run's history (what concerns ``task``, if given)."""
    entries = with_client(store_url, lambda c: c.events(workflow_id, task=task))
    if as_json:
        print_json(
            [
                {
                    "at": e.at,
                    "kind": e.kind,
                    "task": e.task,
                    "attempt": e.attempt,
                    "detail": e.detail,
                }
                for e in entries
            ]
        )
        return EXIT_OK
    table = Table(
        Column("time", no_wrap=True), Column("event", no_wrap=True), "task", "attempt", "detail"
    )
    for e in entries:
        table.add_row(when(e.at), e.kind, e.task or "", str(e.attempt or ""), _cut(e.detail))
    console().print(table)
    return EXIT_OK


def guarded(run: Callable[[], int]) -> int:
    """Turn dagq errors into one line and exit code 2 (never a traceback)."""
    try:
        return run()
    except DagqError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _cut(text: str | None, limit: int = 200) -> str:
    return first_line(text, limit)
