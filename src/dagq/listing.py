"""Listing workflows: newest first, from the store's index only.

Apart from :mod:`dagq.client` so ``dagq list`` (on a store of 100,000 runs) starts
without importing plans, expressions and views: it reads index rows, never states.
"""

from __future__ import annotations

import msgspec

from dagq.errors import UsageError
from dagq.state import QUARANTINED, WORKFLOW_ACTIVE, WORKFLOW_TERMINAL
from dagq.stores.base import IndexRow, Store

WORKFLOW_STATUSES = WORKFLOW_ACTIVE | WORKFLOW_TERMINAL | {QUARANTINED}
#: Index rows asked for at a time.
PAGE = 500


class WorkflowSummary(msgspec.Struct, frozen=True, kw_only=True):
    """One row of a listing (from the index)."""

    id: str
    name: str
    status: str
    total: int
    counts: dict[str, int]
    created_at: float
    updated_at: float
    tenant: str
    error: str | None
    #: The run's labels (``key: value``), given when it was submitted.
    labels: dict[str, str] = msgspec.field(default_factory=dict)


def row_summary(row: IndexRow) -> WorkflowSummary:
    """A listing row from an index row."""
    return WorkflowSummary(
        id=row.id,
        name=row.name,
        status=row.status,
        total=int(row.data.get("total", 0)),
        counts=dict(row.data.get("counts", {})),
        created_at=row.created_at,
        updated_at=row.updated_at,
        tenant=row.tenant,
        error=row.data.get("error"),
        labels=dict(row.data.get("labels") or {}),
    )


def check_status(status: str | None) -> None:
    """UsageError naming the known statuses if ``status`` is none of them."""
    if status is not None and status not in WORKFLOW_STATUSES:
        known = ", ".join(sorted(WORKFLOW_STATUSES))
        raise UsageError(f"unknown workflow status {status!r} (known: {known})")


async def list_workflows(
    store: Store,
    *,
    status: str | None = None,
    name: str | None = None,
    tenant: str | None = None,
    limit: int = 100,
) -> list[WorkflowSummary]:
    """Runs newest first, filtered by status, name and tenant: ``limit`` at most,
    read a page of the index at a time."""
    check_status(status)
    rows: list[WorkflowSummary] = []
    cursor: str | None = None
    while len(rows) < limit:
        page = await store.index.query(
            status=[status] if status else None,
            name=name,
            tenant=tenant,
            limit=min(limit - len(rows), PAGE),
            cursor=cursor,
        )
        rows += [row_summary(row) for row in page.rows]
        cursor = page.cursor
        if cursor is None:
            break
    return rows
