"""The PostgreSQL backend: one schema of a database, shared by processes on many machines.

``open_store("postgresql://USER@HOST:PORT/DB?schema=S")`` opens it without touching
the network; the first operation opens the pool and applies the migrations
(:mod:`.postgres_database`, :mod:`.postgres_schema`). The primitives:
:mod:`.postgres_documents`, :mod:`.postgres_queues` (wake-ups by LISTEN/NOTIFY,
:mod:`.postgres_wakeups`), :mod:`.postgres_index`, :mod:`.postgres_leases`. Times come
from the ``clock`` of the process, as on sqlite: machines sharing a store keep their
clocks in step (NTP).

A batch commits in one transaction (:class:`_Committer`): all of it or none, and a
fence holds the lease row until the commit.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import psycopg
from psycopg.pq import TransactionStatus

from dagq.errors import DagqError
from dagq.stores.base import (
    DEFAULT_MAX_DELIVERIES,
    AckOp,
    BatchOp,
    Clock,
    DeleteOp,
    FenceOp,
    OutgoingMessage,
    PutOp,
    SendOp,
    Store,
    UpsertOp,
)
from dagq.stores.changes import ChangeFeed, batch_topics
from dagq.stores.common import (
    Wakeups,
    check_batch,
    check_max_deliveries,
    conflict,
    new_token,
)
from dagq.stores.postgres_commit import plan, statement
from dagq.stores.postgres_database import Conn, Cursor, Database, parse_postgres_url
from dagq.stores.postgres_documents import PostgresDocuments, put_many
from dagq.stores.postgres_documents import delete as delete_document
from dagq.stores.postgres_documents import put as put_document
from dagq.stores.postgres_index import PostgresIndex, upsert
from dagq.stores.postgres_leases import PostgresLeases, fence, fence_lost
from dagq.stores.postgres_queues import PostgresQueues, deleted_by
from dagq.stores.postgres_queues import delete as delete_messages
from dagq.stores.postgres_queues import send as send_messages
from dagq.stores.postgres_schema import FAILED, VERSION
from dagq.stores.postgres_wakeups import Listener, changes_payload, notify_changes

__all__ = ["migrate_postgres_store", "open_postgres_store"]

# Sends from any store on the same database and schema in this process wake its waiters.
_WAKEUPS: dict[tuple[str, str], Wakeups] = {}
_WAKEUPS_LOCK = threading.Lock()


def open_postgres_store(
    url: str,
    *,
    clock: Clock = time.time,
    max_deliveries: int = DEFAULT_MAX_DELIVERIES,
    create: bool = True,
) -> Store:
    """Open the store a ``postgresql://`` URL names (no network until used).

    ``create=False`` refuses, at first use, a schema that holds no store.
    """
    check_max_deliveries(max_deliveries)
    target = parse_postgres_url(url)
    db = Database(target, clock, create=create)
    with _WAKEUPS_LOCK:
        wakeups = _WAKEUPS.setdefault((target.conninfo, target.schema), Wakeups())
    # Each handle has its own feed, fed by its own listener (whatever commits, in this
    # process too, is announced through the database).
    changes = ChangeFeed(complete=True, source=lambda _feed: listener.changes_source())
    listener = Listener(db, wakeups, changes)
    db.on_close.append(listener.close)
    return Store(
        url=target.url,
        documents=PostgresDocuments(db),
        queues=PostgresQueues(db, wakeups, listener, max_deliveries),
        index=PostgresIndex(db, listener.changes),
        leases=PostgresLeases(db),
        closers=[db.close],
        committer=_Committer(db, wakeups, listener.changes),
        changes=changes,
    )


class _Committer:
    """Commits a whole batch in one transaction: all or nothing."""

    #: All or nothing: a submit's writes may share a batch, and a coordinator may take
    #: completions handed over in its process (:func:`.base.takes_handoff`).
    atomic = True

    def __init__(self, db: Database, wakeups: Wakeups, channel: str) -> None:
        self._db = db
        self._wakeups = wakeups
        self._channel = channel
        #: The statement of each set of parts, for this store's schema.
        self._sql: dict[frozenset[str], str] = {}

    async def __call__(self, ops: Sequence[BatchOp]) -> list[str]:
        check_batch(ops)
        done = await self._one_statement(ops)
        if done is not None:
            return done
        etags: list[str] = []
        failures: dict[str, DagqError] = {}
        acks: list[tuple[AckOp, Cursor, bool]] = []
        async with self._db.committing() as conn:
            # Pipelined, in one round trip: BEGIN, every statement, COMMIT, and the one
            # Sync that leaving the block sends (an explicit ``sync()`` before it would
            # cost a second round trip: the block syncs again). A guarded statement
            # whose condition is false raises, which aborts the transaction: nothing of
            # the batch is written.
            try:
                async with conn.pipeline():
                    await conn.execute("BEGIN")
                    await self._send_all(conn, ops, etags, failures, acks)
                    await conn.execute("COMMIT")
            except psycopg.Error as exc:
                if conn.info.transaction_status != TransactionStatus.IDLE:
                    await conn.execute("ROLLBACK")
                message = exc.diag.message_primary or ""
                if exc.sqlstate == FAILED and message in failures:
                    raise failures[message] from None
                raise
        for op, cur, folded in acks:
            op.deleted.append(await deleted_by(cur) if folded else max(cur.rowcount, 0))
        for queue in {op.queue for op in ops if isinstance(op, SendOp)}:
            self._wakeups.notify(queue)
        return etags

    async def _one_statement(self, ops: Sequence[BatchOp]) -> list[str] | None:
        """Commit the batch as one statement, its own transaction (no BEGIN, no
        COMMIT: :mod:`.postgres_commit`); its etags. None for a batch left to the
        transaction."""
        db = self._db
        written = [op.key for op in ops if isinstance(op, PutOp | DeleteOp)]
        upserts = sum(isinstance(op, UpsertOp) for op in ops)
        topics = batch_topics(written, upserts) if written or upserts else None
        changes = changes_payload(topics) if topics is not None else None
        found = plan(ops, db.clock(), db.target.schema, changes)
        if found is None:
            return None
        found.args["channel"] = self._channel
        sql = self._sql.get(found.parts)
        if sql is None:
            sql = self._sql[found.parts] = db.sql(statement(found.parts))
        async with db.committing() as conn:
            try:
                cur = await conn.execute(sql, found.args)
            except psycopg.Error as exc:
                message = exc.diag.message_primary or ""
                if exc.sqlstate == FAILED and message in found.failures:
                    raise found.failures[message] from None
                raise
            if found.ack is not None:
                found.ack.deleted.append(await deleted_by(cur))
        if found.queue is not None:
            self._wakeups.notify(found.queue)
        return found.etags

    async def _send_all(
        self,
        conn: Conn,
        ops: Sequence[BatchOp],
        etags: list[str],
        failures: dict[str, DagqError],
        acks: list[tuple[AckOp, Cursor, bool]],
    ) -> None:
        """Queue the batch's statements on ``conn``: few of them, whatever its size.

        Writes of documents, sends to one queue and index rows go out as one statement
        each (arrays unnested), unless a key is written twice: then its writes go one
        by one, in order. A send's notification is folded in its statement, so each
        queue is announced once per transaction, and so is a lone delete of received
        messages (the events a coordinator's step handled) of a queue not sent to.
        """
        db, now = self._db, self._db.clock()
        rows = [op.row for op in ops if isinstance(op, UpsertOp)]
        written = [op.key for op in ops if isinstance(op, PutOp | DeleteOp)]
        together = len(set(written)) == len(written)
        puts: list[tuple[PutOp, str, str]] = []
        sends: dict[str, list[OutgoingMessage]] = {}
        deletes = [op for op in ops if isinstance(op, AckOp)]
        sent_to = {op.queue for op in ops if isinstance(op, SendOp)}
        # Folded in a send's statement only where it cannot meet a row that statement
        # inserts (both see one snapshot): a delete of another queue.
        fold = None
        if len(deletes) == 1 and sent_to and deletes[0].queue not in sent_to:
            fold = deletes[0]
        for n, op in enumerate(ops):
            guard = f"dagq batch operation {n}"
            if isinstance(op, FenceOp):
                failures[guard] = fence_lost(op.name)
                await fence(db, conn, op.name, op.token, guard)
            elif isinstance(op, PutOp):
                failures[guard] = conflict(op.key, op.if_match)
                if together and not op.if_none_match:
                    etags.append(new_token())
                    puts.append((op, etags[-1], guard))
                else:
                    etags.append(await put_document(db, conn, op, guard=guard))
            elif isinstance(op, DeleteOp):
                await delete_document(db, conn, op.key)
            elif isinstance(op, SendOp):
                sends.setdefault(op.queue, []).extend(op.messages)
            elif isinstance(op, AckOp) and op is not fold:
                cur = await delete_messages(db, conn, op.queue, op.receipts)
                acks.append((op, cur, False))
        await put_many(db, conn, puts)
        if rows:  # an index row is never read within the batch: all at the end
            await upsert(db, conn, rows)
        # What changed is announced when (if) the transaction commits: by the last
        # send's statement, if there is one.
        topics = batch_topics(written, len(rows)) if written or rows else None
        last = list(sends)[-1] if sends else None
        for queue, messages in sends.items():
            also = changes_payload(topics) if topics is not None and queue == last else None
            ack = fold if queue == last else None
            op = SendOp(queue, messages)
            cur = await send_messages(db, conn, op, now, self._channel, also=also, ack=ack)
            if ack is not None:
                acks.append((ack, cur, True))
        if topics is not None and last is None:
            await notify_changes(conn, self._channel, topics)


async def migrate_postgres_store(url: str) -> tuple[int | None, int]:
    """Apply the migrations a store still lacks; its schema versions before and after.

    A store newer than this dagq is refused (StoreUnavailable), and left as it is.
    """
    db = Database(parse_postgres_url(url), time.time, create=True)
    try:
        await db.pool()  # opening migrates
        return db.found_version, VERSION
    finally:
        await db.close()
