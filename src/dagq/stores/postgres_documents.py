"""Documents of the PostgreSQL store: one row per key, compare-and-swap on its etag.

Values are ``bytea`` (PostgreSQL compresses and moves large ones out of line, TOAST).
Every write is one statement, so it is atomic on its own and also runs unchanged
inside a batch's transaction. Keys sort bytewise (``COLLATE "C"``), as Python sorts
them.
"""

from __future__ import annotations

from collections.abc import Sequence

from dagq.stores.base import Document, PutOp
from dagq.stores.common import check_limit, check_put, conflict, new_token
from dagq.stores.postgres_database import Conn, Database

_INSERT = "INSERT INTO {s}.documents (key, data, etag) VALUES (%s, %s, %s) ON CONFLICT (key) DO "
_REPLACE = _INSERT + "UPDATE SET data = excluded.data, etag = excluded.etag"
_CREATE = _INSERT + "NOTHING"
_SWAP = "UPDATE {s}.documents SET data = %s, etag = %s WHERE key = %s AND etag = %s"
_DELETE_IF = """
WITH gone AS (DELETE FROM {s}.documents WHERE key = %s AND etag = %s RETURNING 1)
SELECT (SELECT count(*) FROM gone), EXISTS (SELECT 1 FROM {s}.documents WHERE key = %s)
"""


_GUARD = " RETURNING 1) SELECT {s}.fail(%s) WHERE NOT EXISTS (SELECT 1 FROM written)"
_GUARDED_CREATE = "WITH written AS (" + _CREATE + _GUARD
_GUARDED_SWAP = "WITH written AS (" + _SWAP + _GUARD


# A batch's writes of several documents, one statement per kind (keys all different).
_REPLACE_MANY = """
INSERT INTO {s}.documents (key, data, etag)
SELECT * FROM unnest(%b::text[], %b::bytea[], %b::text[])
ON CONFLICT (key) DO UPDATE SET data = excluded.data, etag = excluded.etag
"""
# Fails with the guard of a document whose etag was not the one named (if any).
_SWAP_MANY = """
WITH v AS (
    SELECT * FROM unnest(%b::text[], %b::bytea[], %b::text[], %b::text[], %b::text[])
        AS v (key, data, etag, if_match, guard)
), written AS (
    UPDATE {s}.documents d SET data = v.data, etag = v.etag
    FROM v WHERE d.key = v.key AND d.etag = v.if_match
    RETURNING d.key
)
SELECT {s}.fail(min(v.guard)) FROM v
WHERE v.key NOT IN (SELECT key FROM written) HAVING count(*) > 0
"""


async def put(
    db: Database, conn: Conn, op: PutOp, *, guard: str | None = None, etag: str | None = None
) -> str:
    """One conditional or plain write on ``conn``; the new etag (``etag`` if given).

    A failed condition raises ConflictError; with ``guard`` (in a pipelined batch,
    whose outcome is known only at the end) the statement itself fails instead, with
    ``guard`` as its message (:data:`~dagq.stores.postgres_schema.FAILED`).
    """
    etag = etag or new_token()
    data = bytes(op.data)
    args: tuple[object, ...]
    if op.if_none_match:
        sql, args = (_CREATE, (op.key, data, etag))
    elif op.if_match is None:
        sql, args = (_REPLACE, (op.key, data, etag))
    else:
        sql, args = (_SWAP, (data, etag, op.key, op.if_match))
    if guard is not None and sql is not _REPLACE:
        sql = _GUARDED_CREATE if sql is _CREATE else _GUARDED_SWAP
        await conn.execute(db.sql(sql), (*args, guard))
        return etag
    cur = await conn.execute(db.sql(sql), args)
    if guard is None and cur.rowcount == 0:
        raise conflict(op.key, op.if_match)
    return etag


async def put_many(db: Database, conn: Conn, puts: Sequence[tuple[PutOp, str, str]]) -> None:
    """Plain writes and compare-and-swaps (no creates) of different keys on ``conn``,
    each given as (operation, new etag, guard): one statement per kind. A failed
    condition fails the statement with its guard, as :func:`put` with ``guard`` does."""
    replaces = [(op, etag) for op, etag, _ in puts if op.if_match is None]
    swaps = [(op, etag, guard) for op, etag, guard in puts if op.if_match is not None]
    if len(replaces) == 1:
        await put(db, conn, replaces[0][0], etag=replaces[0][1])
    elif replaces:
        keys = [op.key for op, _ in replaces]
        data = [bytes(op.data) for op, _ in replaces]
        await conn.execute(db.sql(_REPLACE_MANY), (keys, data, [e for _, e in replaces]))
    if len(swaps) == 1:
        await put(db, conn, swaps[0][0], guard=swaps[0][2], etag=swaps[0][1])
    elif swaps:
        keys = [op.key for op, _, _ in swaps]
        data = [bytes(op.data) for op, _, _ in swaps]
        etags = [e for _, e, _ in swaps]
        matches = [op.if_match for op, _, _ in swaps]
        guards = [g for _, _, g in swaps]
        await conn.execute(db.sql(_SWAP_MANY), (keys, data, etags, matches, guards))


async def delete(db: Database, conn: Conn, key: str) -> None:
    """Delete unconditionally on ``conn``."""
    await conn.execute(db.sql("DELETE FROM {s}.documents WHERE key = %s"), (key,))


def prefix_end(prefix: str) -> str | None:
    """The smallest string after every string starting with ``prefix`` (None: no bound)."""
    while prefix:
        last = ord(prefix[-1])
        if last < 0x10FFFF and not 0xD800 <= last + 1 <= 0xDFFF:
            return prefix[:-1] + chr(last + 1)
        prefix = prefix[:-1]
    return None


class PostgresDocuments:
    """Documents in the ``documents`` table; a write names the etag it replaces."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def get(self, key: str) -> Document | None:
        row = await self._db.row("SELECT data, etag FROM {s}.documents WHERE key = %s", (key,))
        return None if row is None else Document(bytes(row[0]), row[1])

    async def get_many(self, keys: Sequence[str]) -> list[Document | None]:
        """The documents at ``keys``, in their order: one statement, one snapshot
        (:func:`~dagq.stores.base.get_many`)."""
        if not keys:
            return []
        sql = "SELECT key, data, etag FROM {s}.documents WHERE key = ANY(%s)"
        rows = await self._db.rows(sql, (list(dict.fromkeys(keys)),))
        found = {key: Document(bytes(data), etag) for key, data, etag in rows}
        return [found.get(key) for key in keys]

    async def put(
        self, key: str, data: bytes, *, if_match: str | None = None, if_none_match: bool = False
    ) -> str:
        check_put(if_match, if_none_match)
        async with self._db.connection() as conn:
            return await put(self._db, conn, PutOp(key, data, if_match, if_none_match))

    async def delete(self, key: str, *, if_match: str | None = None) -> bool:
        if if_match is None:
            return await self._db.count("DELETE FROM {s}.documents WHERE key = %s", (key,)) > 0
        row = await self._db.row(_DELETE_IF, (key, if_match, key))
        assert row is not None
        if row[0]:
            return True
        if row[1]:
            raise conflict(key, if_match)
        return False

    async def list(
        self, prefix: str, *, start_after: str | None = None, limit: int | None = None
    ) -> list[str]:
        check_limit(limit)
        clauses, args = ["key >= %s"], [prefix]
        if start_after is not None:
            clauses.append("key > %s")
            args.append(start_after)
        end = prefix_end(prefix)
        if end is not None:
            clauses.append("key < %s")
            args.append(end)
        sql = f"SELECT key FROM {{s}}.documents WHERE {' AND '.join(clauses)} ORDER BY key"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return [key for (key,) in await self._db.rows(sql, args)]
