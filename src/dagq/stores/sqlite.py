"""The sqlite backend: one file in WAL mode, shared safely by several processes.

No SQL runs on the event loop: writes go to one writer thread that owns its
connection, reads to a small pool of reader threads (WAL lets them read beside the
writer), and a statement that waits for another process's lock waits there. Operations
of more than one statement run in ``BEGIN IMMEDIATE`` transactions, so processes
never interleave them; a single statement is atomic on its own. Driver errors become
:class:`~dagq.errors.StoreUnavailable` naming the file. The tables are in
:mod:`dagq.stores.sqlite_schema`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import re
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from contextlib import closing, contextmanager
from pathlib import Path
from queue import SimpleQueue
from typing import Any, TypeVar

import msgspec

from dagq.errors import LeaseHeld, LeaseLost, StoreUnavailable, ValidationError
from dagq.garbage import release
from dagq.stores.base import (
    DEFAULT_MAX_DELIVERIES,
    AckOp,
    BatchOp,
    Clock,
    DeadLetter,
    DeleteOp,
    Document,
    FenceOp,
    IndexPage,
    IndexRow,
    Lease,
    Message,
    OutgoingMessage,
    PutOp,
    QueueDepth,
    SendOp,
    Store,
)
from dagq.stores.changes import INDEX_TOPIC, ChangeFeed
from dagq.stores.common import (
    Wakeups,
    check_batch,
    check_limit,
    check_max_deliveries,
    check_outgoing,
    check_page_size,
    check_put,
    check_receive,
    check_statuses,
    check_ttl,
    check_visibility,
    conflict,
    count_filters,
    count_statuses,
    decode_cursor,
    decode_row,
    encode_cursor,
    encode_row,
    lease_lost,
    new_message_id,
    new_token,
    stale_receipt,
    too_many_deliveries,
)
from dagq.stores.sqlite_changes import DataVersionWatch
from dagq.stores.sqlite_claims import Ask, Claims
from dagq.stores.sqlite_handover import MAX_HANDED_BYTES, Delivery, Handed
from dagq.stores.sqlite_schema import SCHEMA, SCHEMA_VERSION
from dagq.stores.sqlite_wakeups import WakeChannel
from dagq.stores.transfer import PendingMessage

_T = TypeVar("_T")

log = logging.getLogger("dagq.stores.sqlite")

#: How long a statement waits for another process's write lock before giving up.
BUSY_TIMEOUT_S = 10.0
#: Reader threads (and connections) per store: reads run beside the writer under WAL.
READERS = 2

# Sends from any store on the same file in this process wake that file's waiters.
_WAKEUPS: dict[Path, Wakeups] = {}
_CHANGES: dict[Path, ChangeFeed] = {}
_WAKEUPS_LOCK = threading.Lock()


def path_from_url(url: str) -> Path:
    """The file of a ``sqlite:///relative.db`` or ``sqlite:////absolute.db`` URL."""
    if not url.startswith("sqlite:///") or url == "sqlite:///":
        raise ValidationError(
            f"store URL {url!r} is not a sqlite URL; write sqlite:///relative/path.db "
            "or sqlite:////absolute/path.db"
        )
    return Path(url.removeprefix("sqlite:///"))


def open_sqlite_store(
    path: str | os.PathLike[str],
    *,
    clock: Clock = time.time,
    max_deliveries: int = DEFAULT_MAX_DELIVERIES,
    create: bool = True,
) -> Store:
    """Open the store in one sqlite file (also given as a sqlite URL).

    ``create=False`` refuses a file that does not exist yet, so a mistyped path is an
    error rather than a new, empty store.
    """
    check_max_deliveries(max_deliveries)
    file = (
        path_from_url(path) if isinstance(path, str) and path.startswith("sqlite:") else Path(path)
    )
    if not create and not file.exists():
        raise StoreUnavailable(
            f"no dagq store at {file}: nothing was ever submitted there; "
            "check --store or DAGQ_STORE"
        )
    db = _Database(file, clock)
    with _WAKEUPS_LOCK:
        wakeups = _WAKEUPS.setdefault(file.resolve(), Wakeups())
        changes = _CHANGES.get(file.resolve())
        if changes is None:
            watch = DataVersionWatch(file.resolve())
            changes = _CHANGES[file.resolve()] = ChangeFeed(complete=True, source=watch)
    # Other processes on this file are woken through sockets beside it.
    channel = WakeChannel(file.resolve(), wakeups)
    queues = SqliteQueues(db, wakeups, channel, max_deliveries)
    return Store(
        url=f"sqlite:///{file}",
        documents=SqliteDocuments(db),
        queues=queues,
        index=SqliteIndex(db, changes),
        leases=SqliteLeases(db),
        closers=[channel.close, db.close, queues.release_claims],
        committer=_Committer(db, wakeups, channel, queues),
        changes=changes,
    )


def _connect(path: Path) -> sqlite3.Connection:
    hint = "check that the path is a writable file location"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
    except (OSError, sqlite3.Error) as exc:
        raise StoreUnavailable(f"cannot open sqlite store {path}: {exc}; {hint}") from exc
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        _retry_while_locked(lambda: conn.execute("PRAGMA journal_mode = WAL"))
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.create_function("dead_letter_reason", 1, too_many_deliveries, deterministic=True)
        if conn.execute("PRAGMA user_version").fetchone()[0] < SCHEMA_VERSION:
            _retry_while_locked(lambda: conn.executescript(SCHEMA))
        conn.execute("PRAGMA busy_timeout = 0")  # waits in _patiently, in shorter pauses
    except sqlite3.Error as exc:
        conn.close()
        raise StoreUnavailable(f"cannot open sqlite store {path}: {exc}; {hint}") from exc
    return conn


def _retry_while_locked(statement: Callable[[], object]) -> None:
    # Switching to WAL and creating tables need locks that other processes opening
    # the same file may hold; sqlite does not always apply the busy timeout here.
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            statement()
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


@contextmanager
def _immediate(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


class _Database:
    """Every statement of a store runs off the event loop, in threads that own connections.

    Writes (and every operation of more than one statement) go to the one writer
    thread, in the order they were handed over; reads go to a small pool of reader
    threads, each with its own connection, which WAL lets run beside the writer. A
    statement waiting for another process's write lock waits in its thread, so the
    event loop never waits for the database: it hands work over and goes on.
    """

    def __init__(self, path: Path, clock: Clock, *, readers: int = READERS) -> None:
        self.path = path
        self.clock = clock
        self._closed = False
        self._writer = _Lane(lambda: _connect(path), "dagq-sqlite-writer", threads=1)
        try:
            self._writer.call(_nothing)  # open errors surface at open, not at first use
        except BaseException:
            self._writer.stop()
            raise
        self._readers = _Lane(lambda: _connect_reader(path), "dagq-sqlite-reader", readers)

    async def write(self, work: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run ``work`` on the writer connection, in its thread."""
        return await self._run(self._writer, work)

    async def read(self, work: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run ``work`` (statements that only read) on a reader connection, in its thread."""
        return await self._run(self._readers, work)

    async def _run(self, lane: _Lane, work: Callable[[sqlite3.Connection], _T]) -> _T:
        if self._closed:
            raise StoreUnavailable(f"sqlite store {self.path} is closed")
        try:
            return await lane.submit(work)
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"sqlite store {self.path}: {exc}") from exc

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        lanes = (self._readers, self._writer)
        for lane in lanes:
            lane.stop()
        # Joining waits for work already handed over: in a thread, not on the loop.
        await asyncio.get_running_loop().run_in_executor(None, _join, lanes)


#: What a lane is handed: the work, and the future (of a loop, or of a blocking caller).
_Job = tuple[
    Callable[[sqlite3.Connection], Any],
    "asyncio.Future[Any] | Future[Any]",
    asyncio.AbstractEventLoop | None,
]


class _Lane:
    """Threads, each owning one connection, that run work in the order it was handed over.

    A hand-over is a queue put; the result comes back with one
    ``call_soon_threadsafe``, cheaper than an executor's two futures. Threads start at
    the first hand-over and connect at their first job, so a store that is never read
    opens no reader connections; a connection that cannot be opened fails that job
    and is tried again at the next. The threads hold the queue, not the lane: a store
    dropped without being closed still ends them.
    """

    def __init__(self, connect: Callable[[], sqlite3.Connection], name: str, threads: int) -> None:
        self._connect = connect
        self._name = name
        self._size = threads
        self._pid = 0
        self._jobs: SimpleQueue[_Job | None] = SimpleQueue()
        self._threads: list[threading.Thread] = []
        self.stop = weakref.finalize(self, _stop, self._jobs, self._threads)

    def submit(self, work: Callable[[sqlite3.Connection], _T]) -> asyncio.Future[_T]:
        """Hand ``work`` over; the loop's future of its result."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[_T] = loop.create_future()
        self._hand_over((work, future, loop))
        return future

    def call(self, work: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run ``work`` and wait for it, blocking the caller (opening a store)."""
        future: Future[_T] = Future()
        self._hand_over((work, future, None))
        return future.result()

    def _hand_over(self, job: _Job) -> None:
        if self._pid != os.getpid():  # the first job, or in a forked child (no threads there)
            self._start()
        self._jobs.put(job)

    def _start(self) -> None:
        if self._pid:  # forked: neither the parent's threads nor its connections are ours
            self._jobs, self._threads = SimpleQueue(), []
            self.stop = weakref.finalize(self, _stop, self._jobs, self._threads)
        self._pid = os.getpid()
        for n in range(self._size):
            thread = threading.Thread(
                target=_serve, args=(self._jobs, self._connect), name=f"{self._name}-{n}"
            )
            thread.daemon = True
            self._threads.append(thread)
            thread.start()

    def join(self) -> None:
        for thread in self._threads:
            thread.join()


def _stop(jobs: SimpleQueue[_Job | None], threads: list[threading.Thread]) -> None:
    """No more work: each thread finishes what it was handed, closes, and ends."""
    for _ in threads:
        jobs.put(None)


def _serve(jobs: SimpleQueue[_Job | None], connect: Callable[[], sqlite3.Connection]) -> None:
    conn: sqlite3.Connection | None = None
    try:
        while (job := jobs.get()) is not None:
            conn = _run(job, conn, connect)
            del job  # hold nothing (a result, a loop) while waiting for the next
    finally:
        if conn is not None:
            conn.close()


def _run(
    job: _Job, conn: sqlite3.Connection | None, connect: Callable[[], sqlite3.Connection]
) -> sqlite3.Connection | None:
    """Run one job and send its result back; the connection, opened if need be."""
    work, future, loop = job
    try:
        if conn is None:
            conn = connect()
        result = _patiently(work, conn)
    except BaseException as exc:
        _settle(future, loop, None, exc)
    else:
        _settle(future, loop, result, None)
    return conn


def _patiently(work: Callable[[sqlite3.Connection], _T], conn: sqlite3.Connection) -> _T:
    """Run ``work``; while another process holds the write lock, try it again soon.

    The writer's connection does not wait for a lock itself (``busy_timeout`` 0):
    SQLite's own wait sleeps a whole millisecond first, then 2, 5 and more, while a
    chain step's transactions hold the lock a tenth of that. Here the pauses start at
    0.1 ms and double up to 2 ms, for up to ``BUSY_TIMEOUT_S`` in all. Trying again is
    safe: the lock is taken by a transaction's first statement (``BEGIN IMMEDIATE``)
    or by a lone statement, before anything was written.
    """
    pause = _FIRST_PAUSE_S
    deadline = 0.0
    while True:
        try:
            return work(conn)
        except sqlite3.OperationalError as exc:
            if not _busy(exc) or conn.in_transaction:
                raise
            now = time.monotonic()
            if not deadline:
                deadline = now + BUSY_TIMEOUT_S
            elif now >= deadline:
                raise
            time.sleep(pause)
            pause = min(pause * 2, _LAST_PAUSE_S)


#: The pauses of :func:`_patiently`.
_FIRST_PAUSE_S = 0.0001
_LAST_PAUSE_S = 0.002


def _busy(exc: sqlite3.OperationalError) -> bool:
    """Did a statement fail because another connection holds the lock it needs?"""
    return getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_BUSY or (
        "database is locked" in str(exc)
    )


def _settle(
    future: asyncio.Future[Any] | Future[Any],
    loop: asyncio.AbstractEventLoop | None,
    result: Any,
    exc: BaseException | None,
) -> None:
    if loop is None:
        _resolve(future, result, exc)
        return
    with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
        loop.call_soon_threadsafe(_resolve, future, result, exc)


def _resolve(
    future: asyncio.Future[Any] | Future[Any], result: Any, exc: BaseException | None
) -> None:
    if future.cancelled():
        return
    if exc is None:
        future.set_result(result)
    else:
        future.set_exception(exc)


def _nothing(_: sqlite3.Connection) -> None:
    pass


def _join(lanes: Sequence[_Lane]) -> None:
    for lane in lanes:
        lane.join()


def _connect_reader(path: Path) -> sqlite3.Connection:
    """A connection that only reads (the writer's open made the file and its tables)."""
    try:
        conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        conn.execute("PRAGMA query_only = ON")
    except sqlite3.Error as exc:
        raise StoreUnavailable(f"cannot open sqlite store {path}: {exc}") from exc
    return conn


class SqliteDocuments:
    """Documents in the ``documents`` table; a write names the etag it replaces."""

    def __init__(self, db: _Database) -> None:
        self._db = db

    async def get(self, key: str) -> Document | None:
        sql = "SELECT data, etag FROM documents WHERE key = ?"
        row = await self._db.read(lambda c: c.execute(sql, (key,)).fetchone())
        return None if row is None else Document(row[0], row[1])

    async def put(
        self, key: str, data: bytes, *, if_match: str | None = None, if_none_match: bool = False
    ) -> str:
        check_put(if_match, if_none_match)
        op = PutOp(key, data, if_match, if_none_match)
        return await self._db.write(lambda c: _put(c, op))

    async def delete(self, key: str, *, if_match: str | None = None) -> bool:
        def work(c: sqlite3.Connection) -> bool:
            if if_match is None:
                return c.execute("DELETE FROM documents WHERE key = ?", (key,)).rowcount > 0
            with _immediate(c):
                sql = "DELETE FROM documents WHERE key = ? AND etag = ?"
                if c.execute(sql, (key, if_match)).rowcount > 0:
                    return True
                sql = "SELECT 1 FROM documents WHERE key = ?"
                if c.execute(sql, (key,)).fetchone() is not None:
                    raise conflict(key, if_match)
                return False

        return await self._db.write(work)

    async def list(
        self, prefix: str, *, start_after: str | None = None, limit: int | None = None
    ) -> list[str]:
        check_limit(limit)
        after_prefix = start_after is not None and start_after >= prefix
        sql = f"SELECT key FROM documents WHERE key {'>' if after_prefix else '>='} ? ORDER BY key"
        first = start_after if after_prefix else prefix

        def work(c: sqlite3.Connection) -> list[str]:
            # Keys come in order, so the first one without the prefix ends the scan.
            keys: list[str] = []
            with closing(c.execute(sql, (first,))) as rows:
                for (key,) in rows:
                    if len(keys) == limit or not key.startswith(prefix):
                        break
                    keys.append(key)
            return keys

        return await self._db.read(work)


def _put(c: sqlite3.Connection, op: PutOp) -> str:
    """One conditional or plain document write (a single statement: atomic)."""
    etag = new_token()
    sql = "INSERT INTO documents (key, data, etag) VALUES (?, ?, ?) ON CONFLICT (key) DO "
    args: tuple[Any, ...] = (op.key, bytes(op.data), etag)
    if op.if_none_match:
        sql += "NOTHING"
    elif op.if_match is None:
        sql += "UPDATE SET data = excluded.data, etag = excluded.etag"
    else:
        sql = "UPDATE documents SET data = ?, etag = ? WHERE key = ? AND etag = ?"
        args = (bytes(op.data), etag, op.key, op.if_match)
    if c.execute(sql, args).rowcount == 0:
        raise conflict(op.key, op.if_match)
    return etag


_INSERT_MESSAGE = (
    "INSERT OR IGNORE INTO messages (queue, id, body, enqueued_at, visible_at) "
    "VALUES (?, ?, ?, ?, ?)"
)
_DELETE_MESSAGE = "DELETE FROM messages WHERE queue = ? AND receipt = ?"
_UPSERT_ROW = (
    "INSERT OR REPLACE INTO index_rows "
    "(id, name, status, tenant, created_at, updated_at, row) VALUES (?, ?, ?, ?, ?, ?, ?)"
)
#: A row rewritten as its run moves on changes its status, times and counts, never its
#: name, tenant or creation: updated in place, only the indexes of the columns it sets
#: are touched (a replace deletes and inserts the row in all five: ~90 against ~50 us
#: of CPU a row, measured on 100,000 rows). No row changed: none there, or one of
#: another run under the same id — :data:`_UPSERT_ROW` then.
_UPDATE_ROW = (
    "INSERT INTO index_rows "
    "(id, name, status, tenant, created_at, updated_at, row) VALUES (?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (id) DO UPDATE SET "
    "status = excluded.status, updated_at = excluded.updated_at, row = excluded.row "
    "WHERE name = excluded.name AND tenant = excluded.tenant "
    "AND created_at = excluded.created_at"
)


def _message_rows(op: SendOp, now: float) -> list[tuple[Any, ...]]:
    return [
        (op.queue, m.id or new_message_id(), bytes(m.body), now, now + m.delay_s)
        for m in op.messages
    ]


def _row_args(row: IndexRow) -> tuple[Any, ...]:
    return (
        row.id,
        row.name,
        row.status,
        row.tenant,
        row.created_at,
        row.updated_at,
        encode_row(row),
    )


def _apply(c: sqlite3.Connection, op: BatchOp, now: float, etags: list[str]) -> None:
    """One batch operation, inside the caller's transaction."""
    if isinstance(op, PutOp):
        etags.append(_put(c, op))
    elif isinstance(op, DeleteOp):
        c.execute("DELETE FROM documents WHERE key = ?", (op.key,))
    elif isinstance(op, SendOp):
        rows = _message_rows(op, now)
        c.executemany(_INSERT_MESSAGE, rows)
        release(rows)  # a fan-out's 100,000 rows: not freed in one go (dagq.garbage)
    elif isinstance(op, AckOp):
        deleted = c.executemany(_DELETE_MESSAGE, [(op.queue, r) for r in op.receipts]).rowcount
        op.deleted.append(deleted)
    elif isinstance(op, FenceOp):
        held = c.execute("SELECT token FROM leases WHERE name = ?", (op.name,)).fetchone()
        if held is None or held[0] != op.token:
            raise LeaseLost(f"lease {op.name!r} is no longer held; nothing was written")
    else:
        _upsert_row(c, _row_args(op.row))


def _upsert_row(c: sqlite3.Connection, args: tuple[Any, ...]) -> None:
    """Write an index row: in place if it is the same run's (:data:`_UPDATE_ROW`)."""
    if c.execute(_UPDATE_ROW, args).rowcount == 0:
        c.execute(_UPSERT_ROW, args)


class _Committer:
    """Commits a whole batch in one ``BEGIN IMMEDIATE`` transaction: all or nothing.

    A batch that sends to a queue on which a receive of this store waits claims the
    messages for it in the same transaction (:mod:`dagq.stores.sqlite_claims`).
    """

    #: All or nothing: writes whose order matters may share a batch (a submit's).
    atomic = True

    def __init__(
        self, db: _Database, wakeups: Wakeups, channel: WakeChannel, queues: SqliteQueues
    ) -> None:
        self._db = db
        self._wakeups = wakeups
        self._channel = channel
        self._queues = queues

    async def __call__(self, ops: Sequence[BatchOp]) -> list[str]:
        now = self._db.clock()
        queues = {op.queue for op in ops if isinstance(op, SendOp)}

        def work(c: sqlite3.Connection) -> tuple[list[str], list[Delivery]]:
            check_batch(ops)  # here: a fan-out's batch carries 100,000 messages
            etags: list[str] = []
            handed: list[Delivery] = []
            with _immediate(c):
                for op in ops:
                    _apply(c, op, now, etags)
                claimed = self._queues.claim(c, queues, now) if queues else ()
                rung = queues
                if queues:  # messages for waiters of other processes
                    handed, rung = self._queues.hand(c, queues, now)
                expired = self._queues.unclaim_expired(c, now)
            for keep in claimed:  # committed: the waiting receives find them
                keep()
            # Committed: hand over and ring other processes from here, not after the
            # hop back; a waiter handed a message is not rung again.
            failed = self._channel.hand(handed) if handed else []
            if rung or expired:
                skip = frozenset(d.target.path for d in handed)
                self._channel.ring(rung | expired, skip=skip)
            return etags, failed

        etags, failed = await self._db.write(work)
        for queue in queues:
            self._wakeups.notify(queue)
        if failed:  # visible again for every receiver
            await self._queues.give_back([(d.queue, d.handed.receipt) for d in failed])
        return etags


#: A dead letter's key: its row number and the microsecond it died.
_DEAD_KEY = re.compile(r"[0-9]{1,18}-[0-9]{1,20}")


def _dead_key(seq: int, dead_at: float) -> str:
    return f"{seq}-{round(dead_at * 1_000_000)}"


_DEAD_LETTER_OVERDUE = """
INSERT INTO dead_letters (queue, id, body, dequeue_count, reason, dead_at)
SELECT queue, id, body, dequeue_count, dead_letter_reason(dequeue_count), ?
FROM messages INDEXED BY messages_overdue
WHERE queue = ? AND dequeue_count >= ? AND visible_at <= ? ORDER BY visible_at, seq
"""

_TAKE_VISIBLE = """
UPDATE messages
SET visible_at = ?, receipt = lower(hex(randomblob(8))), dequeue_count = dequeue_count + 1
WHERE seq IN (
    SELECT seq FROM messages WHERE queue = ? AND visible_at <= ? ORDER BY visible_at, seq LIMIT ?
)
RETURNING seq, id, body, receipt, dequeue_count, enqueued_at
"""


def _take(
    c: sqlite3.Connection, queue: str, now: float, *, vt: float, limit: int, most: int
) -> list[Any]:
    """A receive's statements, in the caller's transaction: messages delivered ``most``
    times and due again are dead-lettered; up to ``limit`` visible ones are taken."""
    if c.execute(_DEAD_LETTER_OVERDUE, (now, queue, most, now)).rowcount > 0:
        c.execute(
            "DELETE FROM messages INDEXED BY messages_overdue "
            "WHERE queue = ? AND dequeue_count >= ? AND visible_at <= ?",
            (queue, most, now),
        )
    return c.execute(_TAKE_VISIBLE, (now + vt, queue, now, limit)).fetchall()


#: How many messages of a queue are visible, counted up to two.
_VISIBLE_TWO = (
    "SELECT count(*) FROM (SELECT 1 FROM messages WHERE queue = ? AND visible_at <= ? LIMIT 2)"
)

#: Is any message of a queue visible (to take, or to dead-letter)? Read without a lock.
_ANY_VISIBLE = "SELECT 1 FROM messages WHERE queue = ? AND visible_at <= ? LIMIT 1"


def _none_visible(c: sqlite3.Connection, queue: str, now: float) -> bool:
    """No message :func:`_take` would touch, as of the last commit: a receive that
    finds the queue empty (another receiver was woken by the same send and took it,
    or a poll of an idle queue) then ends without the write lock, which every other
    process's commit on the file needs (WAL: this read waits for no writer)."""
    return c.execute(_ANY_VISIBLE, (queue, now)).fetchone() is None


def _messages(queue: str, rows: list[Any]) -> list[Message]:
    return [Message(queue, row[1], row[2], row[3], row[4], row[5]) for row in sorted(rows)]


#: A claimed message no receive took, visible again as if never delivered.
_UNCLAIM = (
    "UPDATE messages SET visible_at = ?, dequeue_count = max(dequeue_count - 1, 0) "
    "WHERE queue = ? AND receipt = ?"
)


class SqliteQueues:
    """Messages in the ``messages`` table; a receive claims rows in one transaction."""

    deduplicates = True
    bundle_size = 1

    def __init__(
        self, db: _Database, wakeups: Wakeups, channel: WakeChannel, max_deliveries: int
    ) -> None:
        self._db = db
        self._wakeups = wakeups
        self._channel = channel
        self._seen: dict[str, int] = {}
        self._max_deliveries = max_deliveries
        #: What the last receive of each queue asked for (a claim asks the same).
        self._asked: dict[str, Ask] = {}
        self.claims = Claims()
        #: Giving back messages handed to this process that it cannot use.
        self._giving: set[asyncio.Task[None]] = set()
        channel.on_handed = self._handed

    @property
    def wakes(self) -> bool:
        """A send from another process on this file wakes ``wait`` (until the wake-up
        channel turned out to be unavailable here)."""
        return self._channel.available

    async def send(self, queue: str, messages: Sequence[OutgoingMessage]) -> None:
        check_outgoing(queue, messages)
        rows = _message_rows(SendOp(queue, messages), self._db.clock())

        def work(c: sqlite3.Connection) -> None:
            with _immediate(c):
                c.executemany(_INSERT_MESSAGE, rows)
            if rows:
                self._channel.ring({queue})

        await self._db.write(work)
        if rows:
            self._wakeups.notify(queue)

    async def receive(
        self, queue: str, *, max_messages: int, visibility_timeout_s: float
    ) -> list[Message]:
        check_receive(max_messages, visibility_timeout_s)
        self._asked[queue] = Ask(max_messages, visibility_timeout_s)
        claimed = self.claims.take(queue, max_messages)
        taken: list[Message] = []
        if claimed is not None:  # a commit received them for this store already
            messages, seen, again, unwanted = claimed
            if unwanted:  # visible to every receiver again, not held until they time out
                with contextlib.suppress(StoreUnavailable):  # else: after their timeout
                    await self._unclaim([(queue, m.receipt) for m in unwanted])
                    self._channel.ring({queue})
            # Sends announced since these were claimed (or more left when they were)
            # may wait in the store: taken now, in the round trip a receive would make
            # next, so a burst's messages go in one batch, not one claim and the rest.
            more = again or self._wakeups.sends(queue) != seen
            if messages and (not more or len(messages) >= max_messages):
                self._seen[queue] = -1 if again else seen  # again: the next wait returns at once
                return messages
            taken = messages
            max_messages -= len(taken)
        self._seen[queue] = self._wakeups.sends(queue)
        now = self._db.clock()
        most = self._max_deliveries

        def work(c: sqlite3.Connection) -> list[Any]:
            if not self.claims.holding() and _none_visible(c, queue, now):
                return []  # nothing to take nor dead-letter: the write lock is not taken
            with _immediate(c):
                expired = self.unclaim_expired(c, now)
                rows = _take(c, queue, now, vt=visibility_timeout_s, limit=max_messages, most=most)
            if expired:
                self._channel.ring(expired)
            return rows

        rows = await self._db.write(work)
        return taken + _messages(queue, rows)

    def claim(
        self, c: sqlite3.Connection, queues: set[str], now: float
    ) -> list[Callable[[], None]]:
        """In a transaction that sends to ``queues``: receive for the receives of this
        store waiting on them; what keeps the messages once it has committed."""
        kept: list[Callable[[], None]] = []
        for queue, asks in self.claims.waiting(queues).items():
            wanted = sum(a.max_messages for a in asks)
            vt = min(a.visibility_timeout_s for a in asks)
            rows = _take(c, queue, now, vt=vt, limit=wanted, most=self._max_deliveries)
            if rows:
                seen = self._wakeups.sends(queue) + 1  # once this commit has announced it
                messages = _messages(queue, rows)
                capped = len(rows) >= wanted
                kept.append(
                    functools.partial(
                        self.claims.keep, queue, messages, seen=seen, capped=capped, vt=vt
                    )
                )
        return kept

    def hand(
        self, c: sqlite3.Connection, queues: set[str], now: float
    ) -> tuple[list[Delivery], set[str]]:
        """In a transaction that sends to ``queues``: where a queue holds one visible
        message alone (a chain's next step, a lone completion), take it for a receiver
        of another process waiting there (:mod:`dagq.stores.sqlite_handover`). The
        messages to hand over once committed, and the queues whose listeners are to be
        rung as before (messages are left there: many at once are received in a batch
        by whoever comes, and a receiver woken at once for each would take them a few
        at a time)."""
        handed: list[Delivery] = []
        rung: set[str] = set()
        for queue in queues:
            delivery = self._hand_lone(c, queue, now)
            if delivery is None:
                rung.add(queue)
            else:
                handed.append(delivery)
        return handed, rung

    def _hand_lone(self, c: sqlite3.Connection, queue: str, now: float) -> Delivery | None:
        """The lone visible message of ``queue``, taken for a waiter (None: not alone,
        nobody waits for it, or too large)."""
        targets = self._channel.targets(queue)  # none in a process alone on the file
        if not targets or c.execute(_VISIBLE_TWO, (queue, now)).fetchone()[0] != 1:
            return None
        target = targets[0]
        rows = _take(c, queue, now, vt=target.vt_s, limit=1, most=self._max_deliveries)
        if not rows:  # dead-lettered
            return None
        _, id_, body, receipt, count, enqueued_at = rows[0]
        if len(body) + len(id_.encode()) > MAX_HANDED_BYTES:  # received as before, once rung
            # (the datagram holds both: a longer one would be cut short by the reader)
            c.execute(_UNCLAIM, (now, queue, receipt))
            return None
        message = Handed(id_, bytes(body), receipt, count, enqueued_at, target.vt_ms, False)
        return Delivery(target, queue, message)

    def _handed(self, queue: str, handed: list[Handed]) -> None:
        """Messages handed to this process (from the loop, before its waiters wake):
        kept for the next receive, or given back if it cannot use them."""
        ask = self._asked.get(queue)
        vt_ms = None if ask is None else round(ask.visibility_timeout_s * 1000)
        usable = [h for h in handed if h.vt_ms == vt_ms]
        unusable = [(queue, h.receipt) for h in handed if h.vt_ms != vt_ms]
        if usable and ask is not None:
            self.claims.keep(
                queue,
                [
                    Message(queue, h.id, h.body, h.receipt, h.dequeue_count, h.enqueued_at)
                    for h in usable
                ],
                seen=self._wakeups.sends(queue) + 1,  # the wake-up that follows announces them
                capped=any(h.more for h in usable),
                vt=ask.visibility_timeout_s,
            )
        if unusable:
            task = asyncio.get_running_loop().create_task(self.give_back(unusable))
            self._giving.add(task)
            task.add_done_callback(self._giving.discard)

    async def give_back(self, taken: list[tuple[str, str]]) -> None:
        """Make messages taken for a receiver that will not have them visible again, as
        if never delivered, and ring their queues' listeners; if the store cannot be
        reached, they come back after their visibility timeout."""
        try:
            await self._unclaim(taken)
        except StoreUnavailable as exc:
            log.warning("%d handed message(s) not given back: %s", len(taken), exc)
            return
        self._channel.ring({queue for queue, _ in taken})

    async def release_claims(self) -> None:
        """Make the messages claimed for receives that never took them visible again
        (those handed over by other processes too)."""
        left = [(queue, h.receipt) for queue, h in self._channel.seal()]
        for task in list(self._giving):
            with contextlib.suppress(Exception):
                await task
        kept = self.claims.release() + left
        if kept:
            with contextlib.suppress(StoreUnavailable):
                await self._unclaim(kept)
                self._channel.ring({queue for queue, _ in kept})

    async def _unclaim(self, claimed: list[tuple[str, str]]) -> None:
        """Make claimed messages no receiver took visible again, as if never delivered
        (their receipt no longer holds them: one received since matches nothing)."""
        now = self._db.clock()
        rows = [(now, queue, receipt) for queue, receipt in claimed]

        def work(c: sqlite3.Connection) -> None:
            with _immediate(c):  # all or none: tried again whole, never counted twice
                c.executemany(_UNCLAIM, rows)

        await self._db.write(work)

    def unclaim_expired(self, c: sqlite3.Connection, now: float) -> set[str]:
        """In a transaction of the writer: make the claims no receive took in time
        visible again (:data:`~dagq.stores.sqlite_claims.KEEP_S`); their queues (whose
        listeners elsewhere are to be rung once committed)."""
        expired = self.claims.expired()
        if expired:
            c.executemany(_UNCLAIM, [(now, queue, receipt) for queue, receipt in expired])
        return {queue for queue, _ in expired}

    async def delete(self, queue: str, receipts: Sequence[str]) -> int:
        def work(c: sqlite3.Connection) -> int:
            with _immediate(c):
                return sum(
                    c.execute(_DELETE_MESSAGE, (queue, receipt)).rowcount for receipt in receipts
                )

        return await self._db.write(work)

    async def extend(self, queue: str, receipt: str, visibility_timeout_s: float) -> str:
        check_visibility(visibility_timeout_s)
        new_receipt = new_token()
        args = (self._db.clock() + visibility_timeout_s, new_receipt, queue, receipt)
        sql = "UPDATE messages SET visible_at = ?, receipt = ? WHERE queue = ? AND receipt = ?"
        if await self._db.write(lambda c: c.execute(sql, args).rowcount) == 0:
            raise stale_receipt(queue, receipt)
        return new_receipt

    async def dead_letter(self, queue: str, receipt: str, reason: str) -> None:
        now = self._db.clock()

        def work(c: sqlite3.Connection) -> None:
            with _immediate(c):
                row = c.execute(
                    "DELETE FROM messages WHERE queue = ? AND receipt = ? "
                    "RETURNING id, body, dequeue_count",
                    (queue, receipt),
                ).fetchone()
                if row is not None:  # a stale receipt is ignored, as by delete
                    c.execute(
                        "INSERT INTO dead_letters (queue, id, body, dequeue_count, reason, "
                        "dead_at) VALUES (?, ?, ?, ?, ?, ?)",
                        (queue, *row, reason, now),
                    )

        await self._db.write(work)

    async def dead_letters(self, queue: str | None, *, limit: int = 100) -> list[DeadLetter]:
        check_limit(limit)
        sql = (
            "SELECT queue, id, body, dequeue_count, reason, dead_at, seq FROM dead_letters "
            "WHERE ? IS NULL OR queue = ? ORDER BY seq LIMIT ?"
        )
        args = (queue, queue, limit)
        rows = await self._db.read(lambda c: c.execute(sql, args).fetchall())
        return [
            DeadLetter(q, i, bytes(b), n, r, t, key=_dead_key(seq, t))
            for q, i, b, n, r, t, seq in rows
        ]

    async def dead_letter_of(self, key: str) -> DeadLetter | None:
        if not _DEAD_KEY.fullmatch(key):
            return None
        sql = (
            "SELECT queue, id, body, dequeue_count, reason, dead_at, seq FROM dead_letters "
            "WHERE seq = ?"
        )
        seq = int(key.split("-", maxsplit=1)[0])
        row = await self._db.read(lambda c: c.execute(sql, (seq,)).fetchone())
        if row is None or _dead_key(row[6], row[5]) != key:
            return None
        q, i, b, n, r, t, _ = row
        return DeadLetter(q, i, bytes(b), n, r, t, key=key)

    async def remove_dead_letters(self, keys: Sequence[str]) -> int:
        # A key names the row and its time: a row number SQLite reuses after a delete
        # never matches a key listed before.
        wanted = {k for k in keys if _DEAD_KEY.fullmatch(k)}

        def work(c: sqlite3.Connection) -> int:
            gone = 0
            with _immediate(c):
                for key in wanted:
                    seq = int(key.split("-")[0])
                    row = c.execute(
                        "SELECT seq, dead_at FROM dead_letters WHERE seq = ?", (seq,)
                    ).fetchone()
                    if row is not None and _dead_key(*row) == key:
                        gone += c.execute("DELETE FROM dead_letters WHERE seq = ?", (seq,)).rowcount
            return gone

        return await self._db.write(work) if wanted else 0

    async def depth(self, queue: str) -> QueueDepth:
        now = self._db.clock()
        sql = (
            "SELECT count(*), coalesce(sum(visible_at <= ?), 0), min(enqueued_at) "
            "FROM messages WHERE queue = ?"
        )
        total, visible, oldest = await self._db.read(
            lambda c: c.execute(sql, (now, queue)).fetchone()
        )
        age = 0.0 if oldest is None else max(0.0, now - oldest)
        return QueueDepth(visible, total - visible, age)

    async def wait(self, queue: str, timeout_s: float) -> None:
        # A send from another process rings this process's socket for the queue: from
        # the first wait on, so one made before that is found by the next poll.
        ask = self._asked.get(queue)
        self._channel.listen(queue, None if ask is None else ask.visibility_timeout_s)
        if ask is None or timeout_s <= 0:
            await self._wakeups.wait(queue, timeout_s, seen=self._seen.get(queue))
            return
        self.claims.ask(queue, ask)  # a send this store commits meanwhile receives for it
        self._channel.waiting(queue, True)  # and one of another process hands it messages
        try:
            await self._wakeups.wait(queue, timeout_s, seen=self._seen.get(queue))
        finally:
            self._channel.waiting(queue, False)
            self.claims.withdraw(queue, ask)

    async def pending(self, *, after: int, limit: int) -> list[tuple[int, PendingMessage]]:
        """Queued messages of every queue after row ``after``, read without receiving
        them (for :func:`~dagq.stores.transfer.copy_store`)."""
        sql = "SELECT seq, queue, id, body FROM messages WHERE seq > ? ORDER BY seq LIMIT ?"
        rows = await self._db.read(lambda c: c.execute(sql, (after, limit)).fetchall())
        return [(seq, PendingMessage(q, i, bytes(b))) for seq, q, i, b in rows]


class SqliteIndex:
    """Index rows in the ``index_rows`` table, with the filtered columns alongside."""

    def __init__(self, db: _Database, changes: ChangeFeed) -> None:
        self._db = db
        self._changes = changes

    async def upsert(self, row: IndexRow) -> None:
        args = _row_args(row)
        await self._db.write(lambda c: _upsert_row(c, args))
        self._changes.notify([INDEX_TOPIC])

    async def get(self, workflow_id: str) -> IndexRow | None:
        sql = "SELECT row FROM index_rows WHERE id = ?"
        found = await self._db.read(lambda c: c.execute(sql, (workflow_id,)).fetchone())
        return None if found is None else decode_row(found[0])

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
        where, args = _index_filters(status, name, tenant, cursor)
        sql = f"SELECT row FROM index_rows {where} ORDER BY created_at DESC, id DESC LIMIT ?"
        found = await self._db.read(lambda c: c.execute(sql, (*args, limit + 1)).fetchall())
        rows = [decode_row(data) for (data,) in found]
        if len(rows) > limit:
            return IndexPage(rows[:limit], encode_cursor(rows[limit - 1]))
        return IndexPage(rows)

    async def changed(self, after: float, *, limit: int = 100) -> list[IndexRow]:
        check_page_size(limit)
        sql = (
            "SELECT row FROM index_rows INDEXED BY index_rows_updated WHERE updated_at > ? "
            "ORDER BY updated_at, id LIMIT ?"
        )
        found = await self._db.read(lambda c: c.execute(sql, (after, limit)).fetchall())
        return [decode_row(data) for (data,) in found]

    async def count(
        self,
        *,
        name: str | None = None,
        tenant: str | None = None,
        labels: Mapping[str, str] | None = None,
        created_after: float | None = None,
        created_before: float | None = None,
    ) -> dict[str, int]:
        where, args = count_filters(name, tenant, created_after, created_before, "?")
        if not labels:  # counted by the database, on the index of the filter
            sql = f"SELECT status, count(*) FROM index_rows {where} GROUP BY status"
            found = await self._db.read(lambda c: c.execute(sql, args).fetchall())
            return {status: int(n) for status, n in found}
        sql = f"SELECT row FROM index_rows {where}"  # labels are inside the row

        def work(c: sqlite3.Connection) -> dict[str, int]:
            return count_statuses((decode_row(d) for (d,) in c.execute(sql, args)), labels)

        return await self._db.read(work)

    async def delete(self, workflow_id: str) -> bool:
        sql = "DELETE FROM index_rows WHERE id = ?"
        return await self._db.write(lambda c: c.execute(sql, (workflow_id,)).rowcount > 0)


def _index_filters(
    status: Sequence[str] | None, name: str | None, tenant: str | None, cursor: str | None
) -> tuple[str, list[Any]]:
    clauses: list[str] = []
    args: list[Any] = []
    if status is not None:
        clauses.append(f"status IN ({', '.join('?' for _ in status)})" if status else "0")
        args.extend(status)
    for column, value in (("name", name), ("tenant", tenant)):
        if value is not None:
            clauses.append(f"{column} = ?")
            args.append(value)
    if cursor is not None:
        created_at, row_id = decode_cursor(cursor)
        clauses.append("(created_at, id) < (?, ?)")
        args.extend((created_at, row_id))
    return ("WHERE " + " AND ".join(clauses) if clauses else ""), args


class SqliteLeases:
    """Leases in the ``leases`` table; acquisition reads and writes in one transaction."""

    def __init__(self, db: _Database) -> None:
        self._db = db

    async def acquire(self, name: str, owner: str, ttl_s: float, *, force: bool = False) -> Lease:
        check_ttl(name, ttl_s)
        now = self._db.clock()
        lease = Lease(name, owner, new_token(), now, now + ttl_s)

        def work(c: sqlite3.Connection) -> None:
            with _immediate(c):
                held = c.execute(
                    "SELECT owner, acquired_at, expires_at FROM leases WHERE name = ?", (name,)
                ).fetchone()
                if held is not None and not force and held[0] != owner and held[2] > now:
                    raise LeaseHeld(name, held[0], now - held[1], held[2] - now)
                c.execute(
                    "INSERT OR REPLACE INTO leases (name, owner, token, acquired_at, expires_at) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (name, owner, lease.token, now, lease.expires_at),
                )

        await self._db.write(work)
        return lease

    async def renew(self, lease: Lease, ttl_s: float) -> Lease:
        check_ttl(lease.name, ttl_s)
        expires_at = self._db.clock() + ttl_s
        sql = "UPDATE leases SET expires_at = ? WHERE name = ? AND token = ?"
        args = (expires_at, lease.name, lease.token)
        if await self._db.write(lambda c: c.execute(sql, args).rowcount) == 0:
            raise lease_lost(lease)
        return msgspec.structs.replace(lease, expires_at=expires_at)

    async def release(self, lease: Lease) -> None:
        sql = "DELETE FROM leases WHERE name = ? AND token = ?"
        await self._db.write(lambda c: c.execute(sql, (lease.name, lease.token)))

    async def get(self, name: str) -> Lease | None:
        sql = (
            "SELECT name, owner, token, acquired_at, expires_at FROM leases "
            "WHERE name = ? AND expires_at > ?"
        )
        now = self._db.clock()
        row = await self._db.read(lambda c: c.execute(sql, (name, now)).fetchone())
        return None if row is None else Lease(*row)
