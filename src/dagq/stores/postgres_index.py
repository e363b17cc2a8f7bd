"""The index of the PostgreSQL store: one row per workflow, the filtered columns beside
the encoded row, an index per filter that serves its newest-first order, and keyset
paging on ``(created_at, id)``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dagq.stores.base import IndexPage, IndexRow
from dagq.stores.changes import INDEX_TOPIC
from dagq.stores.common import (
    check_page_size,
    check_statuses,
    count_filters,
    count_statuses,
    decode_cursor,
    decode_row,
    encode_cursor,
    encode_row,
)
from dagq.stores.postgres_database import Conn, Database
from dagq.stores.postgres_wakeups import changes_payload

_UPSERT = """
INSERT INTO {s}.index_rows (id, name, status, tenant, created_at, updated_at, row)
VALUES (%s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (id) DO UPDATE SET name = excluded.name, status = excluded.status,
    tenant = excluded.tenant, created_at = excluded.created_at,
    updated_at = excluded.updated_at, row = excluded.row
"""
#: The same, and the announcement of the change, in one statement (one round trip; an
#: autocommitted statement is atomic on its own, so the notification goes out with it).
_UPSERT_AND_NOTIFY = "WITH up AS (" + _UPSERT.strip() + ")\nSELECT pg_notify(%s, %s)"


def row_args(row: IndexRow) -> tuple[Any, ...]:
    """The parameters of :data:`_UPSERT` for ``row``."""
    return (
        row.id,
        row.name,
        row.status,
        row.tenant,
        row.created_at,
        row.updated_at,
        encode_row(row),
    )


_UPSERT_MANY = """
INSERT INTO {s}.index_rows (id, name, status, tenant, created_at, updated_at, row)
SELECT * FROM unnest(%b::text[], %b::text[], %b::text[], %b::text[], %b::float8[],
    %b::float8[], %b::bytea[])
ON CONFLICT (id) DO UPDATE SET name = excluded.name, status = excluded.status,
    tenant = excluded.tenant, created_at = excluded.created_at,
    updated_at = excluded.updated_at, row = excluded.row
"""


async def upsert(db: Database, conn: Conn, rows: Sequence[IndexRow]) -> None:
    """Insert or replace ``rows`` on ``conn`` (of one id, the last): one statement."""
    if len(rows) == 1:
        await conn.execute(db.sql(_UPSERT), row_args(rows[0]))
        return
    last = {row.id: row for row in rows}  # one statement may not change a row twice
    columns = list(zip(*(row_args(row) for row in last.values()), strict=True))
    await conn.execute(db.sql(_UPSERT_MANY), [list(column) for column in columns])


class PostgresIndex:
    """Index rows in the ``index_rows`` table."""

    def __init__(self, db: Database, channel: str) -> None:
        self._db = db
        self._channel = channel

    async def upsert(self, row: IndexRow) -> None:
        args = (*row_args(row), self._channel, changes_payload({INDEX_TOPIC}))
        await self._db.rows(_UPSERT_AND_NOTIFY, args)

    async def get(self, workflow_id: str) -> IndexRow | None:
        found = await self._db.row("SELECT row FROM {s}.index_rows WHERE id = %s", (workflow_id,))
        return None if found is None else decode_row(bytes(found[0]))

    async def query(
        self,
        *,
        status: Sequence[str] | None = None,
        name: str | None = None,
        tenant: str | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> IndexPage:
        check_page_size(limit)
        check_statuses(status)
        where, args = _filters(status, name, tenant, cursor)
        sql = (
            f"SELECT row FROM {{s}}.index_rows {where} "
            f"ORDER BY created_at DESC, id DESC LIMIT {int(limit) + 1}"
        )
        rows = [decode_row(bytes(data)) for (data,) in await self._db.rows(sql, args)]
        if len(rows) > limit:
            return IndexPage(rows[:limit], encode_cursor(rows[limit - 1]))
        return IndexPage(rows)

    async def changed(self, after: float, *, limit: int = 100) -> list[IndexRow]:
        check_page_size(limit)
        sql = (
            "SELECT row FROM {s}.index_rows WHERE updated_at > %s ORDER BY updated_at, id LIMIT %s"
        )
        return [decode_row(bytes(data)) for (data,) in await self._db.rows(sql, (after, limit))]

    async def count(
        self,
        *,
        name: str | None = None,
        tenant: str | None = None,
        labels: Mapping[str, str] | None = None,
        created_after: float | None = None,
        created_before: float | None = None,
    ) -> dict[str, int]:
        where, args = count_filters(name, tenant, created_after, created_before, "%s")
        if not labels:  # counted by the database, on the index of the filter
            sql = f"SELECT status, count(*) FROM {{s}}.index_rows {where} GROUP BY status"
            return {status: int(n) for status, n in await self._db.rows(sql, args)}
        sql = f"SELECT row FROM {{s}}.index_rows {where}"  # labels are inside the row
        rows = (decode_row(bytes(data)) for (data,) in await self._db.rows(sql, args))
        return count_statuses(rows, labels)

    async def delete(self, workflow_id: str) -> bool:
        # Not announced, as on the other stores: the index's one reader (the server's
        # listing stream) reads the rows changed since, which a deletion never is.
        sql = "DELETE FROM {s}.index_rows WHERE id = %s"
        return await self._db.count(sql, (workflow_id,)) > 0


def _filters(
    status: Sequence[str] | None, name: str | None, tenant: str | None, cursor: str | None
) -> tuple[str, list[Any]]:
    clauses: list[str] = []
    args: list[Any] = []
    if status is not None:
        clauses.append("status = ANY(%s)")
        args.append(list(status))
    for column, value in (("name", name), ("tenant", tenant)):
        if value is not None:
            clauses.append(f"{column} = %s")
            args.append(value)
    if cursor is not None:
        created_at, row_id = decode_cursor(cursor)
        clauses.append("(created_at, id) < (%s, %s)")
        args.extend((created_at, row_id))
    return ("WHERE " + " AND ".join(clauses) if clauses else ""), args
