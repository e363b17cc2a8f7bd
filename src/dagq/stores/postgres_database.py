"""The connection side of the PostgreSQL store: URL, pool, migrations, errors.

``postgresql://USER[:PASSWORD]@HOST:PORT/DB[?schema=S]`` names a database and the
schema the store's tables live in (default ``dagq``); other query parameters go to
libpq as they are (``sslmode=require``, ...). The pool of psycopg 3 async connections
is opened at first use, in the event loop that uses it (a store belongs to one event
loop, as the azure store does); that first use also applies the migrations of
:mod:`.postgres_schema` (or, with ``create=False``, checks that the store exists).
Driver errors become :class:`~dagq.errors.StoreUnavailable` naming the store.

Arrays (the ``unnest`` of a batch's messages, documents, index rows) are passed in
binary (``%b``): psycopg's text format escapes every byte of a ``bytea`` array in
Python, some twenty times the CPU; and they are encoded by :mod:`.postgres_arrays`,
whose adapters every connection of the store has.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import zlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import psycopg
import psycopg_pool
from psycopg.pq import TransactionStatus

from dagq.errors import StoreUnavailable, ValidationError
from dagq.stores.base import Clock
from dagq.stores.postgres_arrays import ADAPTERS
from dagq.stores.postgres_schema import MIGRATIONS, VERSION, quote_ident

#: Connections per store (per process): a coordinator's and a worker's loops seldom
#: have more statements in flight at once.
POOL_SIZE = 10
#: How long an operation waits for a connection (or the server) before giving up.
CONNECT_TIMEOUT_S = 10.0
DEFAULT_SCHEMA = "dagq"
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,49}")

# The pool logs every failed connection attempt; dagq reports failures itself, once.
if logging.getLogger("psycopg.pool").level == logging.NOTSET:
    logging.getLogger("psycopg.pool").setLevel(logging.CRITICAL)

Conn = psycopg.AsyncConnection[Any]
Cursor = psycopg.AsyncCursor[Any]
#: Statement parameters: positional (``%s``) or named (``%(name)s``).
Args = Sequence[Any] | Mapping[str, Any]


@dataclass(frozen=True)
class PostgresTarget:
    """What a ``postgresql://`` URL names."""

    #: The URL as given, without a password (for messages and ``Store.url``).
    url: str
    #: libpq connection string.
    conninfo: str
    schema: str


def parse_postgres_url(url: str) -> PostgresTarget:
    """Split a store URL into a libpq connection string and a schema name."""
    hint = "write postgresql://USER@HOST:PORT/DATABASE[?schema=NAME]"
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres") or not parts.hostname:
        raise ValidationError(f"store URL {url!r} is not a PostgreSQL URL; {hint}")
    database = unquote(parts.path.lstrip("/"))
    if not database or "/" in database:
        raise ValidationError(f"store URL {url!r} names no database; {hint}")
    params = dict(parse_qsl(parts.query, keep_blank_values=True))
    schema = params.pop("schema", DEFAULT_SCHEMA)
    if not _SCHEMA_NAME.fullmatch(schema):
        raise ValidationError(
            f"store URL {url!r}: schema {schema!r} is not a plain lower-case name "
            "(letters, digits, _; at most 50)"
        )
    try:
        port = parts.port
    except ValueError as exc:
        raise ValidationError(f"store URL {url!r} has a bad port; {hint}") from exc
    conninfo = {
        "host": parts.hostname,
        "port": str(port or 5432),
        "dbname": database,
        "user": unquote(parts.username or "") or os.environ.get("PGUSER", ""),
        "password": unquote(parts.password or ""),
        **params,
    }
    shown = parts._replace(netloc=parts.netloc.rpartition("@")[2])
    user = f"{parts.username}@" if parts.username else ""
    shown_url = shown._replace(netloc=user + shown.netloc).geturl()
    info = " ".join(f"{k}={_conninfo_value(v)}" for k, v in conninfo.items() if v)
    return PostgresTarget(shown_url, info, schema)


def _conninfo_value(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


class Database:
    """The pool of one store, opened (and the schema migrated) at first use."""

    def __init__(self, target: PostgresTarget, clock: Clock, *, create: bool) -> None:
        self.target = target
        self.clock = clock
        self.create = create
        self.schema = quote_ident(target.schema)
        self._pool: psycopg_pool.AsyncConnectionPool[Conn] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid = 0
        self._lock: asyncio.Lock | None = None
        self._closed = False
        #: The connections kept out of the pool for one kind of statement each
        #: (:meth:`dedicated`), and the kinds whose connection is in use.
        self._own: dict[str, Conn] = {}
        self._busy: set[str] = set()
        #: The schema version found at opening (None: a new store), before migrating.
        self.found_version: int | None = None
        self.on_close: list[Callable[[], Any]] = []

    @property
    def url(self) -> str:
        return self.target.url

    def sql(self, template: str) -> str:
        """A statement with ``{s}`` replaced by the store's schema."""
        return template.replace("{s}", self.schema)

    async def pool(self) -> psycopg_pool.AsyncConnectionPool[Conn]:
        """The pool, opened and the schema migrated (or checked) on first use."""
        loop = asyncio.get_running_loop()
        if self._pool is not None and self._pid == os.getpid():
            if self._loop is not loop:
                raise StoreUnavailable(
                    f"postgres store {self.url} is used from a second event loop; open one "
                    "store per event loop"
                )
            return self._pool
        if self._closed:
            raise StoreUnavailable(f"postgres store {self.url} is closed")
        if self._lock is None or self._pid != os.getpid():
            self._lock, self._pool, self._pid = asyncio.Lock(), None, os.getpid()
            self._own, self._busy = {}, set()
        async with self._lock:
            if self._pool is None:
                self._pool = await self._open()
                self._loop = loop
        return self._pool

    async def _open(self) -> psycopg_pool.AsyncConnectionPool[Conn]:
        # One plain connection first: a wrong URL or a server that is down fails at
        # once with the driver's reason, rather than after the pool's retries.
        try:
            conn = await psycopg.AsyncConnection.connect(
                self.target.conninfo,
                autocommit=True,
                context=ADAPTERS,
                connect_timeout=int(CONNECT_TIMEOUT_S),
            )
            async with conn:
                await self._prepare(conn)
        except psycopg.Error as exc:
            raise self.unavailable(exc) from exc
        pool: psycopg_pool.AsyncConnectionPool[Conn] = psycopg_pool.AsyncConnectionPool(
            self.target.conninfo,
            min_size=1,
            max_size=POOL_SIZE,
            # Statements are prepared on first use: a few dozen texts, run again and again.
            kwargs={
                "autocommit": True,
                "context": ADAPTERS,
                "connect_timeout": int(CONNECT_TIMEOUT_S),
                "prepare_threshold": 0,
            },
            timeout=CONNECT_TIMEOUT_S,
            open=False,
            name=f"dagq-{self.target.schema}",
        )
        await pool.open(wait=False)
        return pool

    async def _prepare(self, conn: Conn) -> None:
        version = await schema_version(conn, self.schema)
        self.found_version = version
        if version is not None and version > VERSION:
            raise StoreUnavailable(
                f"postgres store {self.url} has schema version {version}, newer than this "
                f"dagq's {VERSION}; upgrade dagq to use it"
            )
        if version == VERSION:
            return
        if not self.create:
            raise StoreUnavailable(
                f"no dagq store at {self.url}: nothing was ever submitted there; "
                "check --store or DAGQ_STORE (or run `dagq store migrate`)"
            )
        await migrate(conn, self.schema)

    def unavailable(self, exc: BaseException) -> StoreUnavailable:
        """A driver error as the error dagq raises."""
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return StoreUnavailable(f"postgres store {self.url}: {detail}")

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[Conn]:
        """A pooled connection (autocommit) for one operation."""
        pool = await self.pool()
        try:
            async with pool.connection() as conn:
                yield conn
        except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
            raise self.unavailable(exc) from exc

    @asynccontextmanager
    async def dedicated(self, kind: str) -> AsyncIterator[Conn]:
        """A connection (autocommit) for one ``kind`` of statement ("commit",
        "receive"): the store's own for that kind while no other statement of the kind
        uses it, else a pooled one.

        A coordinator's and a worker's commits are on the critical path of a chain: the
        pool's checkout and return cost each some 20-40 us of CPU, before the statement
        goes out and after. And the server plans a prepared statement afresh at its first
        runs on each connection: statements of a kind spread over the whole pool were
        planned some ten times as often. A connection left broken or in a transaction
        goes back to the pool (which discards or resets it)."""
        pool = await self.pool()
        if kind in self._busy:
            async with self.connection() as pooled:
                yield pooled
            return
        self._busy.add(kind)
        try:
            own = self._own.get(kind)
            if own is None:
                own = self._own[kind] = await pool.getconn()
            try:
                yield own
            finally:
                # close() meanwhile took the store's own connections but this one (busy),
                # left to its user: it goes back to the closed pool, which closes it.
                kept = self._own.get(kind) is own
                if not kept or own.broken or own.info.transaction_status != TransactionStatus.IDLE:
                    if kept:
                        del self._own[kind]
                    await pool.putconn(own)
        except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
            raise self.unavailable(exc) from exc
        finally:
            self._busy.discard(kind)

    def committing(self) -> contextlib.AbstractAsyncContextManager[Conn]:
        """The connection of a batch's commit (:meth:`dedicated`)."""
        return self.dedicated("commit")

    async def rows(self, sql: str, args: Args = ()) -> list[tuple[Any, ...]]:
        """Run one statement; its rows."""
        async with self.connection() as conn:
            cur = await conn.execute(self.sql(sql), args)
            return await cur.fetchall()

    async def row(self, sql: str, args: Args = ()) -> tuple[Any, ...] | None:
        """Run one statement; its first row, if any."""
        async with self.connection() as conn:
            cur = await conn.execute(self.sql(sql), args)
            return await cur.fetchone()

    async def count(self, sql: str, args: Args = ()) -> int:
        """Run one statement; how many rows it changed."""
        async with self.connection() as conn:
            cur = await conn.execute(self.sql(sql), args)
            return cur.rowcount

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for close in reversed(self.on_close):
            result = close()
            if hasattr(result, "__await__"):
                await result
        pool, self._pool = self._pool, None
        own, self._own = self._own, {}
        if pool is not None and self._pid == os.getpid():
            try:
                if self._loop is asyncio.get_running_loop():
                    for kind, conn in own.items():
                        if kind not in self._busy:  # else its user gives it back, done
                            await pool.putconn(conn)
                    await pool.close()
            except RuntimeError:
                pass


async def schema_version(conn: Conn, schema: str) -> int | None:
    """The version recorded in ``schema``, or None where there is no store."""
    cur = await conn.execute(
        "SELECT to_regclass(%s) IS NOT NULL", (f"{schema}.meta",), prepare=False
    )
    found = await cur.fetchone()
    if not found or not found[0]:
        return None
    cur = await conn.execute(
        f"SELECT value FROM {schema}.meta WHERE key = 'schema_version'", prepare=False
    )
    row = await cur.fetchone()
    return None if row is None else int(row[0])


async def migrate(conn: Conn, schema: str) -> tuple[int | None, int]:
    """Bring ``schema`` to :data:`VERSION`; the versions before and after.

    One transaction under an advisory lock named after the schema: two processes
    migrating at once take turns, and the second finds nothing left to do.
    """
    lock = zlib.crc32(f"dagq-migrate:{schema}".encode())
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (lock,), prepare=False)
        await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}", prepare=False)
        await conn.execute(
            f"CREATE TABLE IF NOT EXISTS {schema}.meta (key text PRIMARY KEY, value text NOT NULL)",
            prepare=False,
        )
        before = await schema_version(conn, schema)
        if before is not None and before > VERSION:
            return before, before
        for version in range(1, VERSION + 1):
            if before is not None and version <= before:
                continue
            for statement in MIGRATIONS[version]:
                await conn.execute(statement.replace("{s}", schema), prepare=False)
        await conn.execute(
            f"INSERT INTO {schema}.meta (key, value) VALUES ('schema_version', %s) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (str(VERSION),),
            prepare=False,
        )
    return before, VERSION
