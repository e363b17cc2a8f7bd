"""Queues of the PostgreSQL store: every queue's messages in one table.

* **send**: one ``INSERT … SELECT FROM unnest(…)`` per batch, ``ON CONFLICT DO
  NOTHING`` on ``(queue, id)`` (a duplicate id still queued is dropped); in the same
  statement, up to one registered waiter per message is taken from ``waiters`` and
  notified on its process's own channel, and the queue's channel (every process
  waiting for the queue) only when there were fewer waiters than messages; delivered
  when the insert commits (see :mod:`.postgres_wakeups`). A live waiter that wants
  messages is handed one in that notification, inserted as received by it.
* **receive**: one statement that claims up to ``max_messages`` visible messages with
  ``FOR UPDATE SKIP LOCKED`` over the ``(queue, visible_at, seq)`` index, so concurrent
  receivers never wait for each other nor take the same message, and moves those of
  them delivered ``max_deliveries`` times already to ``dead_letters``; where this
  process listens for the queue, the same statement registers it in ``waiters`` when
  it took fewer messages than asked (it is about to wait: wanting as many as it did not
  get), and withdraws it otherwise. Messages handed to this process come first, and
  while its registration wants more, without a look in the database.
* **delete**: one ``DELETE … receipt = ANY(…)``: a handled message is deleted, never
  marked, so the table holds only what is pending.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from typing import Any

from dagq.stores.base import AckOp, DeadLetter, Message, OutgoingMessage, QueueDepth, SendOp
from dagq.stores.common import (
    Wakeups,
    check_limit,
    check_outgoing,
    check_receive,
    check_visibility,
    new_message_id,
    new_token,
    stale_receipt,
)
from dagq.stores.postgres_arrays import bytea_array, float8_array, text_array
from dagq.stores.postgres_database import Conn, Cursor, Database
from dagq.stores.postgres_wakeups import Listener, queue_channel
from dagq.stores.transfer import PendingMessage

#: A send of one message, and the registered waiter it takes (the latest registered
#: first: a process gone without withdrawing its registration last). A waiter is alive
#: while its listening connection holds the advisory lock its registration names
#: (``key``, shared): the send's try for that lock fails. A live waiter that still wants
#: messages (``want``) is handed the message (one that :func:`send_args` found fit: at
#: most :data:`HAND_MOST` bytes, not delayed, an id without a unit separator): it is
#: inserted as received by that waiter (hidden for the waiter's ``hide``, delivered
#: once, a new receipt) and the notification to the waiter's channel carries it
#: (:data:`HAND_WAKE`), so the waiter takes it without a receive
#: (:mod:`.postgres_wakeups`). One message, in scalar parameters: the statement of a
#: chain's every step, kept as small as it can be (each node of its plan costs the server
#: at every run).
HAND_SENT = """
picked AS (
    SELECT queue, channel, until, want, hide, key FROM {s}.waiters
    WHERE queue = %(queue)s AND until > %(now)s
    ORDER BY until DESC LIMIT 1 FOR UPDATE SKIP LOCKED
), checked AS (
    SELECT *, key IS NULL OR NOT pg_try_advisory_xact_lock(key) AS alive FROM picked
), pairs AS (
    SELECT channel, %(now)s + hide AS until,
        md5(random()::text || clock_timestamp()::text) AS receipt
    FROM checked WHERE alive AND want > 0 AND key IS NOT NULL
), sent AS (
    INSERT INTO {s}.messages (queue, id, body, enqueued_at, visible_at, receipt, dequeue_count)
    SELECT %(queue)s, %(id)s, %(body)s, %(now)s, coalesce(p.until, %(now)s), p.receipt,
        CASE WHEN p.receipt IS NULL THEN 0 ELSE 1 END
    FROM (SELECT) AS m LEFT JOIN pairs p ON true
    ON CONFLICT (queue, id) DO NOTHING
    RETURNING id, body, receipt, visible_at
), handed AS (
    SELECT s.id, s.body, s.receipt, s.visible_at, p.channel
    FROM sent s JOIN pairs p ON p.receipt = s.receipt
)"""
#: The delete of received messages (of another queue), folded in a send's statement.
ACKED = """
acked AS (
    DELETE FROM {s}.messages WHERE queue = %(acked)s AND receipt = ANY(%(receipts)b)
    RETURNING 1
)"""

#: The registrations the send took: one handed a message that wants more keeps it,
#: wanting one less; the others go (a dead waiter's too). Those long expired go as well
#: (skipping locked rows, a send never waits).
HAND_WOKEN = """
kept AS (
    UPDATE {s}.waiters w SET want = w.want - 1 FROM handed h
    WHERE w.queue = %(queue)s AND w.channel = h.channel AND w.want > 1
), woken AS (
    DELETE FROM {s}.waiters w USING checked c
    WHERE w.queue = c.queue AND w.channel = c.channel
        AND NOT (c.want > 1 AND c.channel IN (SELECT channel FROM handed))
), expired AS (
    DELETE FROM {s}.waiters w USING (
        SELECT queue, channel FROM {s}.waiters
        WHERE queue = %(queue)s AND until < %(now)s - 30.0 FOR UPDATE SKIP LOCKED
    ) p WHERE w.queue = p.queue AND w.channel = p.channel
)"""
#: The largest message body handed to a waiter in its notification (base64 in a
#: payload of at most 8,000 bytes).
HAND_MOST = 4096
#: What starts a notification that carries a message: then the queue, the id, the
#: receipt, until when it is hidden, when it was sent and the body in base64, apart by
#: unit separators (``chr(31)``).
HANDED = "\x03"
#: The waiters handed a message get it in their notification; the other live ones
#: taken are woken on their own channels; the queue's channel, which every process
#: waiting for the queue hears, only when there were fewer live waiters than messages
#: (none registered, a dead one, or one registering while this statement ran).
HAND_WAKE = (
    "(SELECT count(*) FROM handed h, pg_notify(h.channel, chr(3) || %(queue)s "
    "|| chr(31) || h.id || chr(31) || h.receipt || chr(31) || h.visible_at::text "
    "|| chr(31) || %(now)s::float8::text || chr(31) || encode(h.body, 'base64'))), "
    "(SELECT count(*) FROM checked c, pg_notify(c.channel, %(queue)s) "
    "WHERE c.alive AND c.channel NOT IN (SELECT channel FROM handed)), "
    "CASE WHEN (SELECT count(*) FROM checked WHERE alive) < %(n)s "
    "THEN pg_notify(%(wake)s, %(queue)s) END"
)

#: A send of several messages: inserted, and up to one registered waiter a message
#: taken and woken (the latest registered first), none handed one — they would look in
#: the table for the others anyway, and the handing costs each such send more of the
#: server's CPU than it saves.
SENT = """
sent AS (
    INSERT INTO {s}.messages (queue, id, body, enqueued_at, visible_at)
    SELECT %(queue)s, m.id, m.body, %(now)s, %(now)s + m.delay
    FROM unnest(%(ids)b::text[], %(bodies)b::bytea[], %(delays)b::float8[])
        WITH ORDINALITY AS m (id, body, delay, n)
    ORDER BY m.n
    ON CONFLICT (queue, id) DO NOTHING
)"""
WOKEN = """
woken AS (
    DELETE FROM {s}.waiters w USING (
        SELECT queue, channel FROM {s}.waiters
        WHERE queue = %(queue)s AND until > %(now)s
        ORDER BY until DESC LIMIT %(n)s FOR UPDATE SKIP LOCKED
    ) p WHERE w.queue = p.queue AND w.channel = p.channel
    RETURNING w.channel
), expired AS (
    DELETE FROM {s}.waiters w USING (
        SELECT queue, channel FROM {s}.waiters
        WHERE queue = %(queue)s AND until < %(now)s - 30.0 FOR UPDATE SKIP LOCKED
    ) p WHERE w.queue = p.queue AND w.channel = p.channel
)"""
#: The waiters taken are notified on their own channels; the queue's channel only when
#: there were fewer of them than messages.
WAKE = (
    "(SELECT count(*) FROM woken, pg_notify(woken.channel, %(queue)s)), "
    "CASE WHEN (SELECT count(*) FROM woken) < %(n)s "
    "THEN pg_notify(%(wake)s, %(queue)s) END"
)


def send_parts(args: dict[str, Any]) -> tuple[str, str, str]:
    """The CTEs and the columns of a send with ``args`` (:func:`send_args`): a lone
    message is handed to a live waiter, several only wake them."""
    if args["hand"]:
        return HAND_SENT, HAND_WOKEN, HAND_WAKE
    return SENT, WOKEN, WAKE


def _send_statement(*, ack: bool, also: bool, hand: bool) -> str:
    """A send: its messages inserted and waiters for its queue woken (``hand``: a
    lone message handed to one); with ``ack``, the delete of received messages too,
    and how many went as the first column; with ``also``, a notification on the
    store's changes channel (a batch's changes)."""
    sent, woken, wake = send_parts({"hand": hand})
    columns = [wake]
    if also:
        columns.append("pg_notify(%(channel)s, %(also)s)")
    if ack:
        columns.insert(0, "(SELECT count(*) FROM acked)")
    ctes = [ACKED, sent, woken] if ack else [sent, woken]
    return "WITH" + ",".join(ctes) + "\nSELECT " + ", ".join(columns) + "\n"


_SENDS = {
    (ack, also, hand): _send_statement(ack=ack, also=also, hand=hand)
    for ack in (False, True)
    for also in (False, True)
    for hand in (False, True)
}

# One walk of the queue's index, in order, takes up to ``limit`` visible messages;
# those among them delivered ``most`` times already go to ``dead_letters`` instead of
# being handed out. A last row with no id counts them: the caller receives again when
# they took places in the limit. (A separate scan for overdue messages, over a partial
# index, was a bitmap scan: it never marked the index entries of deleted messages
# dead, and walked every one of them, again and again, until vacuum.)
_RECEIVE = """
WITH candidates AS (
    SELECT seq, dequeue_count >= {most} AS overdue FROM {s}.messages
    WHERE queue = %(queue)s AND visible_at <= %(now)s
    ORDER BY visible_at, seq LIMIT %(limit)s FOR UPDATE SKIP LOCKED
), dead AS (
    DELETE FROM {s}.messages m USING candidates c WHERE m.seq = c.seq AND c.overdue
    RETURNING m.queue, m.id, m.body, m.dequeue_count, m.visible_at, m.seq
), buried AS (
    INSERT INTO {s}.dead_letters (queue, id, body, dequeue_count, reason, dead_at)
    SELECT queue, id, body, dequeue_count,
        'delivered ' || dequeue_count || ' times without being deleted', %(now)s
    FROM dead ORDER BY visible_at, seq
), taken AS (
    UPDATE {s}.messages m
    SET visible_at = %(until)s, dequeue_count = m.dequeue_count + 1,
        receipt = md5(m.seq::text || random()::text || clock_timestamp()::text)
    FROM candidates c WHERE m.seq = c.seq AND NOT c.overdue
    RETURNING m.seq, m.id, m.body, m.receipt, m.dequeue_count, m.enqueued_at
)
{waiting}SELECT seq, id, body, receipt, dequeue_count, enqueued_at FROM taken
UNION ALL
SELECT NULL, NULL, NULL, NULL, count(*), NULL FROM dead HAVING count(*) > 0
"""

# A receive that took fewer messages than it asked for registers its process as
# waiting for the queue (or renews its registration), wanting as many messages as it
# did not get, hidden for its visibility timeout once handed, alive while its lock
# ``key`` is held; one that took as many as it asked for withdraws it (the process is
# not waiting). It touches no other process's registration: two receives, each
# renewing its own and deleting the other's as stale, would wait for each other (a
# deadlock). Those of processes gone without withdrawing them are deleted by sends
# (``expired``: skipping locked rows, a send never waits). The last row says how many
# messages the registration wants (none: withdrawn).
_WAITING = """, waiting AS (
    INSERT INTO {s}.waiters (queue, channel, until, want, hide, key)
    SELECT %(queue)s, %(me)s, %(expires)s, %(limit)s - (SELECT count(*) FROM taken),
        %(hide)s, %(key)s
    WHERE (SELECT count(*) FROM taken) < %(limit)s
    ON CONFLICT (queue, channel) DO UPDATE SET until = excluded.until,
        want = excluded.want, hide = excluded.hide, key = excluded.key
    RETURNING want
), withdrawn AS (
    DELETE FROM {s}.waiters WHERE queue = %(queue)s AND channel = %(me)s
        AND (SELECT count(*) FROM taken) >= %(limit)s
)
"""
_WANT = """UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, want FROM waiting
"""

#: How long a registration as a waiter holds without a receive renewing it (a waiting
#: process receives again within its poll interval, well under this).
WAITER_S = 30.0

_DELETE = "DELETE FROM {s}.messages WHERE queue = %s AND receipt = ANY(%s)"

_DEAD_LETTER = """
WITH gone AS (
    DELETE FROM {s}.messages WHERE queue = %s AND receipt = %s
    RETURNING queue, id, body, dequeue_count
)
INSERT INTO {s}.dead_letters (queue, id, body, dequeue_count, reason, dead_at)
SELECT queue, id, body, dequeue_count, %s, %s FROM gone
"""

_DEAD_COLUMNS = "queue, id, body, dequeue_count, reason, dead_at, seq"

#: A dead letter's key: its row number and the microsecond it died.
_DEAD_KEY = re.compile(r"[0-9]{1,18}-[0-9]{1,20}")


def _dead_key(seq: int, dead_at: float) -> str:
    return f"{seq}-{round(dead_at * 1_000_000)}"


def _dead_letter(row: tuple[object, ...]) -> DeadLetter:
    q, i, b, n, r, t, seq = row
    assert isinstance(t, float) and isinstance(seq, int)
    return DeadLetter(str(q), str(i), bytes(b), int(n), str(r), t, key=_dead_key(seq, t))  # type: ignore[call-overload]


async def send(
    db: Database,
    conn: Conn,
    op: SendOp,
    now: float,
    channel: str,
    *,
    also: str | None = None,
    ack: AckOp | None = None,
) -> Cursor:
    """Insert ``op``'s messages on ``conn`` and announce them on the queue's channel
    (and ``also`` on the store's changes ``channel``), in one statement; with ``ack``
    (of another queue), delete the received messages it names in it too: the first
    column of the statement's row is how many went."""
    args = send_args(op, now, db.target.schema)
    args["channel"] = channel
    if also is not None:
        args["also"] = also
    if ack is not None:
        args["acked"], args["receipts"] = ack.queue, text_array(ack.receipts)
    sql = _SENDS[ack is not None, also is not None, args["hand"]]
    return await conn.execute(db.sql(sql), args)


async def deleted_by(cur: Cursor) -> int:
    """How many received messages the send with an ``ack`` on ``cur`` deleted."""
    row = await cur.fetchone()
    return int(row[0]) if row is not None else 0


def send_args(op: SendOp, now: float, schema: str) -> dict[str, Any]:
    """The parameters of a send of ``op``'s messages: of :data:`HAND_SENT` (``hand``) for
    one message that can be handed to a waiter, else of :data:`SENT`, :data:`WOKEN` and
    :data:`WAKE`."""
    ids = [m.id or new_message_id() for m in op.messages]
    args: dict[str, Any] = {
        "queue": op.queue,
        "now": now,
        "n": len(op.messages),
        "wake": queue_channel(schema, op.queue),
    }
    first = op.messages[0] if len(op.messages) == 1 else None
    args["hand"] = hand = (
        first is not None
        and first.delay_s == 0
        and len(first.body) <= HAND_MOST
        and len(ids[0].encode()) <= 200
        and "\x1f" not in ids[0]
        and "\x1f" not in op.queue
        and len(op.queue.encode()) <= 1000
    )
    if hand:
        assert first is not None
        args["id"], args["body"] = ids[0], bytes(first.body)
    else:
        args["ids"] = text_array(ids)
        args["bodies"] = bytea_array([m.body for m in op.messages])
        args["delays"] = float8_array([m.delay_s for m in op.messages])
    return args


async def delete(db: Database, conn: Conn, queue: str, receipts: Sequence[str]) -> Cursor:
    """Delete received messages on ``conn``; the cursor tells how many went (rowcount)."""
    return await conn.execute(db.sql(_DELETE), (queue, list(receipts)))


class PostgresQueues:
    """Messages in the ``messages`` table, dead letters in ``dead_letters``."""

    deduplicates = True
    bundle_size = 1
    #: A worker's completion waits up to this long for its other running tasks' (a
    #: commit is a round trip to the server, a NOTIFY, and a receive for the
    #: coordinator): W1 N=10,000 went from ~1.9 to ~1.4 ms of CPU a task, all
    #: processes and the server together. A lone task (a chain) never waits.
    report_linger_s = 0.005

    def __init__(
        self, db: Database, wakeups: Wakeups, listener: Listener, max_deliveries: int
    ) -> None:
        self._db = db
        self._wakeups = wakeups
        self._listener = listener
        self._seen: dict[str, int] = {}
        receive = _RECEIVE.replace("{most}", str(int(max_deliveries)))
        self._receive = db.sql(receive.replace("{waiting}", ""))
        self._receive_waiting = db.sql(receive.replace("{waiting}", _WAITING) + _WANT)

    @property
    def wakes(self) -> bool:
        """A send from another process wakes ``wait`` (unless the start-up check found
        that notifications do not arrive here)."""
        return self._listener.working

    async def send(self, queue: str, messages: Sequence[OutgoingMessage]) -> None:
        check_outgoing(queue, messages)
        if not messages:
            return
        op = SendOp(queue, messages)
        async with self._db.connection() as conn:
            await send(self._db, conn, op, self._db.clock(), self._listener.changes)
        self._wakeups.notify(queue)

    async def receive(
        self, queue: str, *, max_messages: int, visibility_timeout_s: float
    ) -> list[Message]:
        check_receive(max_messages, visibility_timeout_s)
        self._seen[queue] = self._wakeups.sends(queue)
        listener = self._listener
        # Messages sends handed this process (in their notifications) come first; while
        # its registration still wants more and no other wake-up came, they are all
        # there is to take: no round trip.
        handed, settled = listener.handed(queue, max_messages)
        if handed and (settled or len(handed) >= max_messages):
            return handed
        taken: list[tuple[Any, ...]] = []
        max_messages -= len(handed)
        while True:
            now = self._db.clock()
            args = {
                "queue": queue,
                "now": now,
                "limit": max_messages - len(taken),
                "until": now + visibility_timeout_s,
            }
            sql = self._receive
            me = listener.waiter(queue)
            if me is not None:
                sql = self._receive_waiting
                args.update(
                    me=me, expires=now + WAITER_S, hide=visibility_timeout_s, key=listener.key
                )
            listener.looking(queue)
            async with self._db.dedicated("receive") as conn:
                cur = await conn.execute(sql, args)
                rows = await cur.fetchall()
            got = [r for r in rows if r[0] is not None]
            dead = [r for r in rows if r[0] is None and r[4] is not None]
            if me is not None:  # how many this registration wants handed (0: withdrawn)
                wants = [int(r[5]) for r in rows if r[0] is None and r[4] is None]
                listener.registered(queue, wants[0] if wants else 0)
            taken += got
            # Messages dead-lettered took places in the limit: look again for more.
            if not dead or len(taken) >= max_messages:
                break
        taken.sort()
        return handed + [Message(queue, r[1], bytes(r[2]), r[3], r[4], r[5]) for r in taken]

    async def delete(self, queue: str, receipts: Sequence[str]) -> int:
        if not receipts:
            return 0
        return await self._db.count(_DELETE, (queue, list(receipts)))

    async def extend(self, queue: str, receipt: str, visibility_timeout_s: float) -> str:
        check_visibility(visibility_timeout_s)
        new_receipt = new_token()
        args = (self._db.clock() + visibility_timeout_s, new_receipt, queue, receipt)
        sql = (
            "UPDATE {s}.messages SET visible_at = %s, receipt = %s "
            "WHERE queue = %s AND receipt = %s"
        )
        if await self._db.count(sql, args) == 0:
            raise stale_receipt(queue, receipt)
        return new_receipt

    async def dead_letter(self, queue: str, receipt: str, reason: str) -> None:
        await self._db.count(_DEAD_LETTER, (queue, receipt, reason, self._db.clock()))

    async def dead_letters(self, queue: str | None, *, limit: int = 100) -> list[DeadLetter]:
        check_limit(limit)
        sql = (
            f"SELECT {_DEAD_COLUMNS} FROM {{s}}.dead_letters "
            "WHERE %s::text IS NULL OR queue = %s ORDER BY seq LIMIT %s"
        )
        return [_dead_letter(row) for row in await self._db.rows(sql, (queue, queue, limit))]

    async def dead_letter_of(self, key: str) -> DeadLetter | None:
        if not _DEAD_KEY.fullmatch(key):
            return None
        sql = f"SELECT {_DEAD_COLUMNS} FROM {{s}}.dead_letters WHERE seq = %s"
        row = await self._db.row(sql, (int(key.split("-", maxsplit=1)[0]),))
        if row is None:
            return None
        found = _dead_letter(row)
        return found if found.key == key else None

    async def remove_dead_letters(self, keys: Sequence[str]) -> int:
        # A key names the row and the microsecond it died, as on sqlite.
        wanted = {k for k in keys if _DEAD_KEY.fullmatch(k)}
        if not wanted:
            return 0
        seqs = [int(k.split("-")[0]) for k in wanted]
        sql = "SELECT seq, dead_at FROM {s}.dead_letters WHERE seq = ANY(%s)"
        matching = [
            seq for seq, t in await self._db.rows(sql, (seqs,)) if _dead_key(seq, t) in wanted
        ]
        if not matching:
            return 0
        return await self._db.count("DELETE FROM {s}.dead_letters WHERE seq = ANY(%s)", (matching,))

    async def depth(self, queue: str) -> QueueDepth:
        now = self._db.clock()
        sql = (
            "SELECT count(*), count(*) FILTER (WHERE visible_at <= %s), min(enqueued_at) "
            "FROM {s}.messages WHERE queue = %s"
        )
        row = await self._db.row(sql, (now, queue))
        assert row is not None
        total, visible, oldest = row
        age = 0.0 if oldest is None else max(0.0, now - oldest)
        return QueueDepth(visible, total - visible, age)

    async def wait(self, queue: str, timeout_s: float) -> None:
        # Noted before the listener starts: a send meanwhile ends the wait at once.
        seen = self._seen.get(queue, self._wakeups.sends(queue))
        started = time.monotonic()
        await self._listener.start(queue)
        left = timeout_s - (time.monotonic() - started)
        await self._wakeups.wait(queue, max(left, 0.0), seen=seen)

    async def pending(self, *, after: int, limit: int) -> list[tuple[int, PendingMessage]]:
        """Queued messages of every queue after row ``after``, read without receiving
        them (for :func:`~dagq.stores.transfer.copy_store`)."""
        sql = "SELECT seq, queue, id, body FROM {s}.messages WHERE seq > %s ORDER BY seq LIMIT %s"
        rows = await self._db.rows(sql, (after, limit))
        return [(seq, PendingMessage(q, i, bytes(b))) for seq, q, i, b in rows]
