"""``dagq workers``: the live workers of a store, from their records."""

from __future__ import annotations

import time

from rich.table import Column, Table

from dagq.cli.display import duration
from dagq.cli.inspect import EXIT_OK, console, print_json, when, with_client
from dagq.client import Client
from dagq.registry import WorkerRecord, live_workers


def run_workers(store_url: str, *, as_json: bool) -> int:
    """List live workers: a table on a terminal, whole values as tab-separated lines
    when piped, JSON with ``--json``."""

    async def body(client: Client) -> list[WorkerRecord]:
        return await live_workers(client.store.documents, now=time.time())

    records = with_client(store_url, body)
    if as_json:
        print_json(records)
        return EXIT_OK
    now = time.time()
    rows = [_row(record, now) for record in records]
    out = console()
    if not out.is_terminal:
        print("\t".join(_HEADER))
        for row in rows:
            print("\t".join(row))
        return EXIT_OK
    if not rows:
        out.print("no live workers")
        return EXIT_OK
    table = Table(*(Column(name, overflow="fold") for name in _HEADER))
    for row in rows:
        table.add_row(*row)
    out.print(table)
    return EXIT_OK


_HEADER = (
    "id",
    "host",
    "pid",
    "queues",
    "running",
    "attempts",
    "done",
    "version",
    "started",
    "last seen",
    "state",
)


def _row(record: WorkerRecord, now: float) -> tuple[str, ...]:
    state = record.state
    if record.workflows is not None:
        state += f" (only {', '.join(record.workflows)})"
    return (
        record.id,
        record.host,
        str(record.pid),
        ",".join(record.queues),
        f"{record.running}/{record.concurrency}",
        " ".join(record.attempts) or "-",
        str(record.completed),
        record.version,
        when(record.started_at),
        f"{duration(max(0.0, now - record.last_seen))} ago",
        state,
    )
