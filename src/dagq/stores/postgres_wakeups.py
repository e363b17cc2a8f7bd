"""Wake-ups across processes for the PostgreSQL store: LISTEN/NOTIFY.

Every send notifies the queue's own channel (:func:`queue_channel`) with the queue's
name as payload, delivered when the send commits. The first ``wait`` of a store opens
one extra connection that LISTENs on the store's channel and on the channel of each
queue waited for in this process, and turns each notification into a local wake-up of
that queue's waiters, so a task chain across processes is not paced by a polling
interval — and a process is woken only by sends to the queues it waits for (workers
are not woken by the completions they send the coordinator, nor the coordinator by
task messages). A wait for a queue not listened to yet has the listener LISTEN on a
new connection (that LISTENs on every channel so far) before the old one is closed,
so no notification falls between them; once a queue is listened to, its waiters are
woken once, since what was sent before that was announced to nobody here. Before
relying on it, the listener checks that a notification of its own actually arrives;
behind a pooler in transaction mode (PgBouncer ``pool_mode = transaction``) it does
not, and the store falls back to polling (``wait`` sleeps its timeout) with a warning.
A notification naming a queue on the store's channel (as earlier versions of dagq sent
them) still wakes that queue's waiters.

Waking one process, not all: the listening connection also LISTENs on a channel of
its own (:attr:`Listener.own`). A receive that found fewer messages than it asked for
registers it in the ``waiters`` table for the queue (:meth:`Listener.waiter`;
:mod:`.postgres_queues`), and a send takes up to one registration per message it sends
and notifies those channels only. It notifies the queue's channel too (every waiting
process) when it found fewer registrations than messages: a registration that commits
while the send runs is not seen by it, and neither was the send by that receive, so
nobody would wake that process otherwise. Registrations expire (``WAITER_S``) and are
withdrawn when the store closes.

Handing messages over: a registration also says how many messages its process would
take (``want``), how long they hide once taken (``hide``) and an advisory lock key
(:attr:`Listener.key`) that the listening connection holds, shared, for as long as it
lives. The send tries that lock for each registration it takes: where the try fails
the waiter is alive and listening, and the send inserts the message it pairs with it
as already received by it (hidden, delivered once, a new receipt) and puts the message
in its notification (:func:`handed_message`); where it succeeds (a process killed, a
listener down) the registration is dropped and handed nothing. The listener keeps a
handed message (:meth:`Listener.handed`) and wakes the queue's waiters; the receive
that follows takes it without a round trip — while the registration still wants more
and no other wake-up came, that is all it takes; otherwise it also looks in the
database (and registers again). A message no receive here takes within :data:`HOLD_S`
(nothing waits for its queue any more: a worker stopping or full) is given back: made
visible again, as if never delivered, and the queue's channel notified; so are those
held when the store closes. Only a notification lost in the instant the listening
connection drops, after the send found it alive, leaves its message hidden until its
hiding time ends, as a received message whose receiver died.

A commit that writes documents or index rows notifies the store's changes channel
(:func:`changes_channel`) with :data:`CHANGES` and the topics it changed
(:mod:`.changes`). Only a process whose change feed is watched (a server's streams)
LISTENs on it, and hands them to the feed, so a stream wakes when another process
commits; coordinators and workers never hear them (each coordinator commit would
otherwise wake every worker's listener: ~0.5 ms of CPU a step each on W2).

Should the listening connection drop (a restarted server, a terminated backend), the
listener connects and LISTENs again at once, then retries with backoff while that
fails; once it listens again, it wakes every waiter and the change feed, since sends
made meanwhile were not announced to it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import hashlib
import logging

import psycopg

from dagq.stores.base import Message
from dagq.stores.changes import ANY, ChangeFeed
from dagq.stores.common import Wakeups, new_token
from dagq.stores.postgres_database import CONNECT_TIMEOUT_S, Conn, Database

log = logging.getLogger("dagq.stores.postgres")

#: How long the start-up check waits for its own notification.
PROBE_TIMEOUT_S = 5.0
#: What starts the payload of a change notification (then topics, one a line).
CHANGES = "\x02"
#: The longest payload PostgreSQL takes is 8,000 bytes; more topics are sent as one
#: broad change.
MAX_PAYLOAD = 7_000
#: After the listening connection could not be opened, how long until the next attempt.
RETRY_AFTER_S = 5.0
#: After the listening connection dropped: the first wait before listening again
#: (doubling, up to :data:`RETRY_AFTER_S`, while that fails).
RELISTEN_FIRST_S = 0.05
#: How long a message handed to this process waits for a receive here to take it
#: before it is made visible again for every process (and its waiters woken).
HOLD_S = 1.0
#: What starts a notification that carries a message (``postgres_queues.HANDED``).
HANDED = "\x03"


class Listener:
    """One LISTENing connection per store and process, started by the first wait."""

    def __init__(self, db: Database, wakeups: Wakeups, changes: ChangeFeed) -> None:
        self._db = db
        self._wakeups = wakeups
        self._changes = changes
        self.channel = f"dagq:{db.target.schema}"
        #: Where the changes of commits are announced (:func:`changes_channel`).
        self.changes = changes_channel(db.target.schema)
        self._task: asyncio.Task[None] | None = None
        self._conn: psycopg.AsyncConnection[object] | None = None
        #: The channels to LISTEN on: of the queues waited for in this process, and the
        #: changes channel once the change feed is watched.
        self._channels: set[str] = set()
        #: Those the listening connection LISTENs on.
        self._heard: frozenset[str] = frozenset()
        #: The queue each queue channel announces (its waiters are woken by name).
        self._queue_of: dict[str, str] = {}
        self._lock: asyncio.Lock | None = None
        self._retry_at = 0.0
        #: This process's own channel: a send that takes this process's registration
        #: as a waiter (:meth:`waiter`) notifies it here, and no other process.
        self.own = f"dagq:w:{new_token()}"
        #: The advisory lock the listening connection holds (shared) while it listens:
        #: a send hands messages only to registrations whose lock is held.
        self.key = int(new_token(), 16) >> 1
        #: False once the start-up check failed: waits poll.
        self.working = True
        #: Messages sends handed this process, by queue: each with when it stops being
        #: hidden and when it arrived (loop time).
        self._handed: dict[str, list[tuple[Message, float, float]]] = {}
        #: Receipts handed lately: a notification heard on two connections at once
        #: (while :meth:`_extend` swaps them) is taken once.
        self._receipts: dict[str, None] = {}
        #: How many more messages each queue's registration wants handed.
        self._wants: dict[str, int] = {}
        #: Plain wake-ups of each queue heard, and how many of them the last receive
        #: that looked in the database had heard before it looked.
        self._plain: dict[str, int] = {}
        self._plain_looked: dict[str, int] = {}
        self._expiry: asyncio.TimerHandle | None = None
        #: Give-backs and wake-ups passed on, under way.
        self._releases: set[asyncio.Task[None]] = set()
        #: Notifications a listening connection heard before its relay started, by
        #: ``id`` of the connection.
        self._early: dict[int, list[psycopg.Notify]] = {}

    async def changes_source(self) -> bool:
        """Listen for the change feed; True once notifications are known to arrive."""
        await self._start(self.changes)
        return self.working and self._task is not None and not self._task.done()

    def _listening(self, channel: str | None) -> bool:
        running = self._task is not None and not self._task.done()
        return running and (channel is None or channel in self._heard)

    def waiter(self, queue: str) -> str | None:
        """The channel under which a receive from ``queue`` that finds fewer messages
        than it asked for registers this process as waiting (a send then wakes it, not
        every listener of the queue); None where nobody here would hear it (the queue
        not waited for here yet, the listener down or not working)."""
        channel = queue_channel(self._db.target.schema, queue)
        return self.own if self.working and self._listening(channel) else None

    def looking(self, queue: str) -> None:
        """A receive is about to look in the database: the plain wake-ups heard so far
        are answered by it."""
        self._plain_looked[queue] = self._plain.get(queue, 0)

    def registered(self, queue: str, want: int) -> None:
        """A receive registered this process as wanting ``want`` messages handed (0:
        none, or withdrawn)."""
        self._wants[queue] = want

    def handed(self, queue: str, most: int) -> tuple[list[Message], bool]:
        """Up to ``most`` of the messages sends handed this process for ``queue`` (those
        past half their hiding time are left to come back by themselves); and whether
        they are all there is to take: the registration still wants more, and no
        wake-up came that a look in the database has not answered."""
        kept = self._handed.get(queue)
        taken: list[Message] = []
        if kept:
            now = self._db.clock()
            fresh = [h for h in kept if now < (h[1] + h[0].enqueued_at) / 2]
            taken = [h[0] for h in fresh[:most]]
            self._handed[queue] = fresh[most:]
        settled = self._wants.get(queue, 0) > 0 and self._plain.get(
            queue, 0
        ) == self._plain_looked.get(queue, 0)
        return taken, settled

    def _hand(self, message: Message, until: float) -> None:
        """Keep a message a send handed this process until a receive takes it, or
        :data:`HOLD_S` passed (then it goes back: :meth:`_expire`)."""
        if message.receipt in self._receipts:
            return
        self._receipts[message.receipt] = None
        if len(self._receipts) > 4096:
            del self._receipts[next(iter(self._receipts))]
        loop = asyncio.get_running_loop()
        self._handed.setdefault(message.queue, []).append((message, until, loop.time()))
        self._wants[message.queue] = self._wants.get(message.queue, 0) - 1
        if self._expiry is None:
            self._expiry = loop.call_later(HOLD_S, self._expire)
        self._wakeups.notify(message.queue)

    def _expire(self) -> None:
        """Give back the handed messages no receive took within :data:`HOLD_S` (nothing
        here waits for their queue any more: a worker stopping, or full)."""
        loop = asyncio.get_running_loop()
        self._expiry = None
        due = loop.time() - HOLD_S
        later: list[float] = []
        for queue, kept in self._handed.items():
            old = [h[0] for h in kept if h[2] <= due]
            if old:
                self._handed[queue] = [h for h in kept if h[2] > due]
                task = loop.create_task(self._release(queue, old))
                self._releases.add(task)
                task.add_done_callback(self._releases.discard)
            later += [h[2] for h in self._handed[queue]]
        if later:
            self._expiry = loop.call_later(min(later) + HOLD_S - loop.time(), self._expire)

    async def _release(self, queue: str, messages: list[Message]) -> None:
        """Make handed messages nobody here took visible again, as if never received,
        and wake the queue's waiters everywhere."""
        args = {
            "now": self._db.clock(),
            "queue": queue,
            "receipts": [m.receipt for m in messages],
            "wake": queue_channel(self._db.target.schema, queue),
        }
        try:
            async with self._db.connection() as conn:
                await conn.execute(self._db.sql(_RELEASE), args)
        except Exception as exc:  # they come back after their hiding time
            log.debug("postgres store %s: handed messages not given back (%s)", self._db.url, exc)

    async def start(self, queue: str | None = None) -> None:
        """Listen (for sends to ``queue`` too), unless listening already or known not to
        work here."""
        if queue is None:
            await self._start(None)
            return
        channel = queue_channel(self._db.target.schema, queue)
        self._queue_of[channel] = queue
        await self._start(channel)

    async def _start(self, channel: str | None) -> None:
        if self._listening(channel):
            return
        loop = asyncio.get_running_loop()
        if not self.working or loop.time() < self._retry_at:
            return
        if self._lock is None:
            self._lock = asyncio.Lock()
        if channel is not None:  # waits for several queues at once need one new connection
            self._channels.add(channel)
        async with self._lock:
            if self._listening(channel):
                return
            running = self._task is not None and not self._task.done()
            heard = self._heard if running else frozenset()
            try:
                await (self._extend() if running else self._listen())
            except (psycopg.Error, OSError) as exc:
                self._retry_at = loop.time() + RETRY_AFTER_S
                log.warning("postgres store %s: cannot LISTEN (%s); polling", self._db.url, exc)
                return
            if not self._listening(None):
                return  # the check failed: waits poll
            # What was sent before the LISTEN took hold (after a caller's receive, before
            # its wait) was announced to nobody here: its waiters look again. (A change
            # feed's reader reads only once its watch is open: that is, listened to.)
            for newly in self._heard - heard:
                if newly in self._queue_of:
                    self._wakeups.notify(self._queue_of[newly])

    async def _extend(self) -> None:
        """LISTEN on every channel (a new one too) on a new connection, then let the
        old one go: both listen meanwhile, so no notification is lost in between."""
        old_task, old_conn = self._task, self._conn
        conn = await self._connect()
        arrived = asyncio.get_running_loop().create_future()
        arrived.set_result(None)  # the check was made on the first connection
        probe = f"\x01probe-{new_token()}"  # never sent
        self._task = asyncio.create_task(self._serve(conn, probe, arrived), name="dagq-pg-listen")
        if old_task is not None:
            old_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await old_task
        if old_conn is not None and old_conn is not conn:
            with contextlib.suppress(psycopg.Error):
                await old_conn.close()

    async def _listen(self) -> None:
        await self._db.pool()  # the schema exists, the URL works
        conn = await self._connect()
        probe = f"\x01probe-{new_token()}"
        arrived = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._serve(conn, probe, arrived), name="dagq-pg-listen")
        async with self._db.connection() as other:
            await other.execute("SELECT pg_notify(%s, %s)", (self.channel, probe))
        try:
            await asyncio.wait_for(asyncio.shield(arrived), PROBE_TIMEOUT_S)
        except TimeoutError:
            self.working = False
            log.warning(
                "postgres store %s: a NOTIFY did not reach LISTEN within %.0fs (a pooler in "
                "transaction mode?); falling back to polling",
                self._db.url,
                PROBE_TIMEOUT_S,
            )
            await self.close()

    async def _connect(self) -> psycopg.AsyncConnection[object]:
        """A new connection that LISTENs on the channel (it is ``self._conn`` then)."""
        conn = await psycopg.AsyncConnection.connect(
            self._db.target.conninfo, autocommit=True, connect_timeout=int(CONNECT_TIMEOUT_S)
        )
        channels = frozenset(self._channels)
        # What arrives while the statements below run is kept for the relay.
        early: list[psycopg.Notify] = []
        self._early[id(conn)] = early
        conn.add_notify_handler(early.append)
        try:
            # The store's channel last: what a look at pg_stat_activity shows.
            for channel in sorted(channels):
                await conn.execute(f"LISTEN {_quote(channel)}")
            await conn.execute(f"LISTEN {_quote(self.own)}")
            # Held while this connection lives: sends hand messages to this process's
            # registrations only meanwhile (a process killed, or not listening, gets none).
            await conn.execute("SELECT pg_advisory_lock_shared(%s)", (self.key,))
            await conn.execute(f"LISTEN {_quote(self.channel)}")
        except BaseException:
            self._early.pop(id(conn), None)
            with contextlib.suppress(psycopg.Error):
                await conn.close()
            raise
        self._conn, self._heard = conn, channels
        return conn

    async def _serve(
        self, conn: psycopg.AsyncConnection[object], probe: str, arrived: asyncio.Future[None]
    ) -> None:
        """Relay notifications until closed; a dropped connection is replaced at once."""
        while True:
            try:
                await self._relay(conn, probe, arrived)
                log.warning("postgres store %s: LISTEN connection closed", self._db.url)
            except psycopg.Error as exc:
                log.warning("postgres store %s: LISTEN connection lost (%s)", self._db.url, exc)
            finally:
                with contextlib.suppress(psycopg.Error):
                    await conn.close()
            conn = await self._relisten()
            log.info("postgres store %s: listening again", self._db.url)
            # Whatever was sent while nobody listened went unannounced: look again (in
            # the database too, not only at what was handed here).
            for queue in self._queue_of.values():
                self._plain[queue] = self._plain.get(queue, 0) + 1
            self._wakeups.notify_all()
            self._changes.notify_all()

    async def _relisten(self) -> psycopg.AsyncConnection[object]:
        """LISTEN on a new connection: soon, then backing off while it fails."""
        delay = RELISTEN_FIRST_S
        while True:
            await asyncio.sleep(delay)
            try:
                return await self._connect()
            except (psycopg.Error, OSError) as exc:
                log.debug("postgres store %s: cannot LISTEN yet (%s)", self._db.url, exc)
            delay = min(delay * 2, RETRY_AFTER_S)

    async def _relay(
        self, conn: psycopg.AsyncConnection[object], probe: str, arrived: asyncio.Future[None]
    ) -> None:
        """Relay notifications until the connection is lost (raises psycopg.Error).

        The event loop reads the connection's socket itself and takes the notifications
        from libpq as they come: psycopg's ``notifies()`` sets up a wait, a future and a
        step of its task for each, ~100 us of CPU a notification against ~35 (and a
        chain's step has two on its path)."""
        loop = asyncio.get_running_loop()
        pgconn = conn.pgconn
        encoding = conn.info.encoding
        lost: asyncio.Future[None] = loop.create_future()

        def readable() -> None:
            try:
                pgconn.consume_input()
            except psycopg.Error as exc:
                # libpq has closed the socket: its number may be reused by the next
                # connection opened before this task resumes; not watched a moment longer.
                loop.remove_reader(socket)
                if not lost.done():
                    lost.set_exception(exc)
                return
            while (notify := pgconn.notifies()) is not None:
                channel = notify.relname.decode(encoding)
                self._heard_one(channel, notify.extra.decode(encoding), probe, arrived)

        # Those heard while the connection's own statements ran (its LISTENs) first.
        early = self._early.pop(id(conn), [])
        with contextlib.suppress(ValueError):
            conn.remove_notify_handler(early.append)
        for notify in early:
            self._heard_one(notify.channel, notify.payload, probe, arrived)
        socket = pgconn.socket
        loop.add_reader(socket, readable)
        try:
            readable()  # what arrived before the reader was in place
            await lost
        finally:
            if not lost.done():  # else readable() stopped watching it, at once: the
                loop.remove_reader(socket)  # number may be another connection's by now

    def _heard_one(
        self, channel: str, payload: str, probe: str, arrived: asyncio.Future[None]
    ) -> None:
        if payload == probe:
            if not arrived.done():
                arrived.set_result(None)
            return
        if payload.startswith(CHANGES):
            topics = payload[len(CHANGES) :].split("\n")
            if ANY in topics:
                self._changes.notify_all()
            else:
                self._changes.notify(topics)
            return
        if payload.startswith(HANDED):
            handed = handed_message(payload)
            if handed is not None:
                self._hand(*handed)
            return
        self._plain[payload] = self._plain.get(payload, 0) + 1
        if channel == self.own and not self._wakeups.waiting(payload):
            # A send took this process's registration, but nothing here waits for that
            # queue now (its receive registered it, then it took other work): pass the
            # wake-up on to every process waiting for the queue.
            task = asyncio.get_running_loop().create_task(self._pass_on(payload))
            self._releases.add(task)
            task.add_done_callback(self._releases.discard)
        self._wakeups.notify(payload)

    async def _pass_on(self, queue: str) -> None:
        channel = queue_channel(self._db.target.schema, queue)
        try:
            async with self._db.connection() as other:
                await other.execute("SELECT pg_notify(%s, %s)", (channel, queue))
        except Exception as exc:  # the others find the message at their next poll
            log.debug("postgres store %s: a wake-up not passed on (%s)", self._db.url, exc)

    async def close(self) -> None:
        """Stop listening."""
        task, self._task = self._task, None
        conn, self._conn = self._conn, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, RuntimeError):
                await task
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        if conn is not None:
            with contextlib.suppress(psycopg.Error, RuntimeError):
                await conn.close()
            # Sends would wake this process, which no longer listens, in place of
            # another: its registrations go (or expire, should this fail).
            with contextlib.suppress(Exception):
                async with self._db.connection() as other:
                    sql = "DELETE FROM {s}.waiters WHERE channel = %s"
                    await other.execute(self._db.sql(sql), (self.own,))
        # Messages handed here and not taken go back at once.
        handed, self._handed = self._handed, {}
        for queue, kept in handed.items():
            if kept:
                await self._release(queue, [h[0] for h in kept])
        for task in list(self._releases):
            with contextlib.suppress(asyncio.CancelledError):
                await task


#: Handed messages given back: visible at once, as if never delivered, and the queue's
#: waiters woken.
_RELEASE = """
WITH back AS (
    UPDATE {s}.messages SET visible_at = %(now)s,
        dequeue_count = greatest(dequeue_count - 1, 0)
    WHERE queue = %(queue)s AND receipt = ANY(%(receipts)s)
    RETURNING 1
)
SELECT CASE WHEN EXISTS (SELECT 1 FROM back) THEN pg_notify(%(wake)s, %(queue)s) END
"""


def handed_message(payload: str) -> tuple[Message, float] | None:
    """The message a send handed this process in ``payload``, and until when it is
    hidden; None for a payload that does not parse."""
    fields = payload[len(HANDED) :].split("\x1f")
    if len(fields) != 6:
        return None
    queue, id_, receipt, until, enqueued, body = fields
    try:
        message = Message(queue, id_, base64.b64decode(body), receipt, 1, float(enqueued))
        return message, float(until)
    except ValueError:
        return None


def changes_payload(topics: set[str]) -> str:
    """The notification that announces a change of ``topics``."""
    payload = CHANGES + "\n".join(sorted(topics))
    if len(payload.encode()) > MAX_PAYLOAD:
        payload = CHANGES + ANY
    return payload


async def notify_changes(conn: Conn, channel: str, topics: set[str]) -> None:
    """Announce, when the transaction on ``conn`` commits, that it changed ``topics``."""
    await conn.execute("SELECT pg_notify(%s, %s)", (channel, changes_payload(topics)))


def changes_channel(schema: str) -> str:
    """The channel on which the commits to the store in ``schema`` announce what they
    changed (a schema name is at most 50 characters: it fits the 63 of a channel)."""
    return f"dagq:c:{schema}"


@functools.lru_cache(maxsize=1024)
def queue_channel(schema: str, queue: str) -> str:
    """The channel on which sends to ``queue`` of the store in ``schema`` are announced.

    A digest of both, so that it fits PostgreSQL's 63-byte names whatever their length.
    """
    digest = hashlib.blake2b(f"{schema}\0{queue}".encode(), digest_size=12).hexdigest()
    return f"dagq:q:{digest}"


def _quote(channel: str) -> str:
    return '"' + channel.replace('"', '""') + '"'
