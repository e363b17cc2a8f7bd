"""Commands that look at workflows: list, tasks, output, logs, events (and the pieces
``status`` and the others share).

Each prints for people by default — rich tables on a terminal, tab-separated lines with
whole values when piped (:mod:`dagq.cli.tables`) — and stable JSON with ``--json`` (the
fields of the structs in :mod:`dagq.client`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import msgspec
from rich.console import Console

from dagq.cli import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from dagq.cli.connection import with_client
from dagq.cli.display import duration, error_cell, state_text
from dagq.cli.tables import Listing, print_json, printable, printable_json, when
from dagq.cli.terminal import out_console
from dagq.client import Client, TaskInfo, WorkflowTask

#: Names that moved to dagq.cli.tables and dagq.cli.connection, still taken from here.
__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_USAGE", "print_json", "when", "with_client"]


def console() -> Console:
    """stdout, coloured only on a terminal; piped, plain lines never wrapped."""
    return out_console()


# --- list, tasks, output, logs, events -------------------------------------------------


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


#: The columns of ``dagq tasks`` (after ``workflow`` when several runs are shown).
TASK_COLUMNS = ("task", "state", "attempt", "queue", "started", "duration", "error")


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
    if across and not tasks:
        console().print("no tasks found")
        return EXIT_OK
    table = Listing(
        [*(["workflow"] if across else []), *TASK_COLUMNS],
        right=frozenset({"attempt", "duration"}),
    )
    for task in tasks:
        table.add_row(
            *([task.workflow] if isinstance(task, WorkflowTask) else []),
            task.name,
            state_text(task.status, task.compensation),
            str(task.attempt),
            task.queue,
            when(task.started_at),
            duration(task.duration_s),
            _cut(task.error),
        )
    table.print(console())
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
    print(printable_json(msgspec.json.format(msgspec.json.encode(value).decode(), indent=2)))
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
    """``dagq logs``: the kept stdout/stderr of an attempt, and its whole error; of an
    attempt still running, what it has written so far."""
    text, error, running = with_client(
        store_url,
        lambda c: _logs_and_error(c, workflow_id, task, attempt=attempt, item=item, undo=undo),
    )
    if running:
        print(
            f"(attempt {running} is still running: its output so far; "
            "--follow prints the rest as it comes)",
            file=sys.stderr,
        )
    if running:
        if text:
            print(printable(text), end="" if text.endswith("\n") else "\n")
    else:
        print(printable(text) if text else "(no output was captured for this attempt)")
    if error:
        print(f"--- error ---\n{printable(error)}")
    return EXIT_OK


async def _logs_and_error(
    client: Client, workflow_id: str, task: str, *, attempt: int | None, item: int, undo: bool
) -> tuple[str, str | None, int]:
    """The log tail of an attempt, its whole error text (if it failed), and the number
    of the attempt if it is still running (its output so far is the text then)."""
    from dagq.log_reading import read_log

    text = await client.logs(workflow_id, task, attempt=attempt, item=item, undo=undo)
    error = await client.error(workflow_id, task, attempt=attempt, item=item, undo=undo)
    if text:
        return text, error, 0
    read, offset = bytearray(), 0
    while True:  # what was sent live, a slice at a time
        piece = await read_log(
            client, workflow_id, task, attempt=attempt, offset=offset, item=item, undo=undo
        )
        read += piece.data
        if not piece.data:
            break
        offset = piece.next_offset
    running = piece.attempt if piece.ended is None and piece.attempt else 0
    return read.decode("utf-8", "surrogateescape"), error, running


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
                    "actor": e.actor,
                }
                for e in entries
            ]
        )
        return EXIT_OK
    table = Listing(["time", "event", "task", "attempt", "detail", "by"])
    for e in entries:
        by = printable(e.actor or "", one_line=True)
        table.add_row(when(e.at), e.kind, e.task or "", str(e.attempt or ""), _cut(e.detail), by)
    table.print(console())
    return EXIT_OK


def _cut(text: str | None, limit: int = 200) -> str:
    return error_cell(text, limit)
