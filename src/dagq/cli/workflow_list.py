"""``dagq list``: workflows, newest first, from the store's index alone.

Apart from :mod:`dagq.cli.inspect` so it imports neither the client nor plans and
views: it reads one page of index rows, whatever the store holds (100,000 runs list as
fast as ten); piped, it does not import rich either.
"""

from __future__ import annotations

import asyncio

from dagq.cli import EXIT_OK
from dagq.cli.states import STYLES, error_cell
from dagq.cli.styled import Styled
from dagq.cli.tables import Listing, emit, print_json, when
from dagq.listing import WorkflowSummary, list_workflows
from dagq.stores import open_store


def run_list(
    store_url: str, *, status: str | None, name: str | None, limit: int, as_json: bool
) -> int:
    """``dagq list``: runs, newest first."""
    rows = asyncio.run(_rows(store_url, status=status, name=name, limit=limit))
    if as_json:
        print_json(rows)
        return EXIT_OK
    if not rows:
        emit([Styled("no workflows")])
        return EXIT_OK
    table = Listing(["id", "name", "status", "progress", "created", "error"])
    for row in rows:
        done = sum(n for s, n in row.counts.items() if s not in ("pending", "ready", "running"))
        style = STYLES.get(row.status, "")
        if row.status in ("compensation_failed", "quarantined"):
            style = "bold white on red"
        table.add_row(
            row.id,
            row.name,
            Styled(row.status, style),
            f"{done}/{row.total}",
            when(row.created_at),
            error_cell(row.error, 200),
        )
    emit([table])
    return EXIT_OK


async def _rows(
    store_url: str, *, status: str | None, name: str | None, limit: int
) -> list[WorkflowSummary]:
    store = open_store(store_url, create=False)  # listing never makes a store
    try:
        return await list_workflows(store, status=status, name=name, limit=limit)
    finally:
        await store.close()
