"""What the PostgreSQL store adds beside the conformance suite: ``dagq store migrate``,
schema versions, URLs, and wake-ups that cross processes (LISTEN/NOTIFY)."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from dagq.errors import ConflictError, StoreUnavailable
from dagq.stores import open_store, postgres_queues, postgres_wakeups
from dagq.stores.base import IndexRow, OutgoingMessage, Store
from dagq.stores.postgres_arrays import ADAPTERS, bytea_array, float8_array, text_array
from dagq.stores.postgres_schema import VERSION
from dagq.stores.postgres_wakeups import queue_channel
from tests.conftest import postgres_url
from tests.integration.cli_harness import DagqCli
from tests.postgres import Cluster

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def cli(tmp_path: Path, postgres_cluster: Cluster) -> Iterator[DagqCli]:
    with DagqCli(tmp_path) as cli:
        cli.store_url = postgres_url(postgres_cluster)
        yield cli


def _schema(url: str) -> str:
    return url.rpartition("schema=")[2]


def test_store_migrate_creates_the_tables_then_finds_them_up_to_date(cli: DagqCli) -> None:
    first = cli.run("store", "migrate", "--store", cli.store_url)
    assert first.code == 0, first.output
    assert f"created, schema version {VERSION}" in first.stdout
    again = cli.run("store", "migrate", "--store", cli.store_url)
    assert again.code == 0, again.output
    assert f"schema version {VERSION}, up to date" in again.stdout


def test_a_store_of_a_newer_schema_version_is_refused_in_one_line(cli: DagqCli) -> None:
    assert cli.run("store", "migrate", "--store", cli.store_url).code == 0
    server = cli.store_url.partition("?")[0]
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(
            f"UPDATE {_schema(cli.store_url)}.meta SET value = %s WHERE key = 'schema_version'",
            (str(VERSION + 1),),
        )
    for args in (("list",), ("store", "migrate", "--store", cli.store_url)):
        done = cli.run(*args)
        assert done.code == 2, done.output
        [line] = done.stderr.strip().splitlines()
        assert line.startswith("error: ") and f"schema version {VERSION + 1}" in line
        assert "upgrade dagq" in line


def test_a_version_2_store_gains_the_waiters_table_and_keeps_its_messages(cli: DagqCli) -> None:
    assert cli.run("store", "migrate", "--store", cli.store_url).code == 0
    server, schema = cli.store_url.partition("?")[0], _schema(cli.store_url)
    with psycopg.connect(server, autocommit=True) as conn:  # as dagq left it at version 2
        conn.execute(f"DROP TABLE {schema}.waiters")
        conn.execute(f"UPDATE {schema}.meta SET value = '2' WHERE key = 'schema_version'")
        conn.execute(
            f"INSERT INTO {schema}.messages (queue, id, body, enqueued_at, visible_at) "
            "VALUES ('q', 'm1', 'x', 0, 0)"
        )
    done = cli.run("store", "migrate", "--store", cli.store_url)
    assert done.code == 0, done.output
    assert f"migrated from schema version 2 to {VERSION}" in done.stdout
    with psycopg.connect(server, autocommit=True) as conn:
        assert conn.execute(f"SELECT count(*) FROM {schema}.waiters").fetchone() == (0,)
        assert conn.execute(f"SELECT id FROM {schema}.messages").fetchall() == [("m1",)]
        columns = conn.execute(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_schema = %s AND table_name = 'waiters'",
            (schema.strip('"'),),
        ).fetchall()
        assert {"want", "hide", "key"} <= {c for (c,) in columns}  # version 4: handing
    assert VERSION == 4


def test_a_schema_without_a_store_is_not_created_by_commands_that_only_look(
    cli: DagqCli,
) -> None:
    done = cli.run("list")
    assert done.code == 2, done.output
    assert "no dagq store at" in done.stderr
    assert "password" not in done.stderr


@pytest.mark.parametrize(
    ("url", "fault"),
    [
        ("postgresql://localhost", "names no database"),
        ("postgresql://u@127.0.0.1:5432/db?schema=Bad-Name", "schema 'Bad-Name'"),
        ("postgresql://u@127.0.0.1:notaport/db", "bad port"),
    ],
)
def test_a_bad_postgres_url_is_a_one_line_error(tmp_path: Path, url: str, fault: str) -> None:
    with DagqCli(tmp_path) as cli:
        done = cli.run("list", "--store", url)
    assert done.code == 2, done.output
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("error: ") and fault in line


def test_an_unreachable_server_is_a_one_line_error_without_the_password(tmp_path: Path) -> None:
    from tests.postgres import free_port

    url = f"postgresql://u:secret@127.0.0.1:{free_port()}/db"
    with DagqCli(tmp_path) as cli:
        done = cli.run("list", "--store", url, timeout_s=40)
    assert done.code == 2, done.output
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("error: postgres store postgresql://u@127.0.0.1:")
    assert "secret" not in line


_WITHOUT_PSYCOPG = """
import sys
sys.modules["psycopg"] = None  # as if the postgres extra were not installed
from dagq.errors import ValidationError
from dagq.stores import open_store
try:
    open_store("postgresql://u@127.0.0.1:5432/db")
except ValidationError as exc:
    print(exc)
"""


def test_a_postgres_url_without_the_extra_names_the_install_command() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_PSYCOPG], capture_output=True, text=True, check=True
    )
    assert "pip install 'dagq[postgres]'" in done.stdout


_SEND_LATER = """
import asyncio, sys, time
from dagq.stores import open_store
from dagq.stores.base import OutgoingMessage

async def main() -> None:
    store = open_store(sys.argv[1])
    await store.queues.depth("q")  # connected: the send below is quick
    print("ready", flush=True)
    sys.stdin.readline()
    await store.queues.send("q", [OutgoingMessage(b"x")])
    await store.close()

asyncio.run(main())
"""


async def test_a_send_in_another_process_wakes_a_waiter_at_once(
    postgres_cluster: Cluster,
) -> None:
    url = postgres_url(postgres_cluster)
    store = open_store(url)
    try:
        await store.queues.wait("q", 0.01)  # the listener is started and checked
        sender = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(_SEND_LATER), url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert sender.stdout is not None and sender.stdin is not None
            assert sender.stdout.readline().strip() == "ready"
            waiter = asyncio.create_task(store.queues.wait("q", 30))
            await asyncio.sleep(0.05)
            started = time.monotonic()
            sender.stdin.write("go\n")
            sender.stdin.flush()
            await asyncio.wait_for(waiter, 10)
            assert time.monotonic() - started < 2  # not the 30 s of a poll
        finally:
            sender.communicate(timeout=20)
        messages = await store.queues.receive("q", max_messages=5, visibility_timeout_s=30)
        assert [m.body for m in messages] == [b"x"]
    finally:
        await store.close()


_SEND_ONE = """
import asyncio, sys
from dagq.stores import open_store
from dagq.stores.base import OutgoingMessage

async def main() -> None:
    store = open_store(sys.argv[1])
    await store.queues.send(sys.argv[2], [OutgoingMessage(b"x")])
    await store.close()

asyncio.run(main())
"""


async def test_a_send_before_the_first_wait_for_a_queue_ends_that_wait_at_once(
    postgres_cluster: Cluster,
) -> None:
    """The first wait for a queue LISTENs for it: what another process sent after the
    receive that found nothing, and before the LISTEN, was announced to nobody here."""
    url = postgres_url(postgres_cluster)
    store = open_store(url)
    try:
        # a: the listener starts; b: it LISTENs on a new connection, for both.
        for queue in ("a", "b"):
            assert await store.queues.receive(queue, max_messages=1, visibility_timeout_s=30) == []
            sender = [sys.executable, "-c", textwrap.dedent(_SEND_ONE), url, queue]
            await asyncio.to_thread(subprocess.run, sender, check=True, timeout=30)
            started = time.monotonic()
            await store.queues.wait(queue, 20)
            assert time.monotonic() - started < 5, queue  # not the 20 s of a poll
            messages = await store.queues.receive(queue, max_messages=5, visibility_timeout_s=30)
            assert [m.body for m in messages] == [b"x"]
    finally:
        await store.close()


async def test_a_send_is_heard_only_by_the_listeners_of_its_queue(
    postgres_cluster: Cluster, tmp_path: Path
) -> None:
    url = postgres_url(postgres_cluster)
    store, other = open_store(url), open_store(url)
    trace = tmp_path / "listen.trace"
    try:
        await store.queues.wait("tasks", 0.01)  # the listener is started and checked
        listening = store.queues._listener._conn  # type: ignore[attr-defined]
        with trace.open("w") as out:
            listening.pgconn.trace(out.fileno())
            try:
                waiter = asyncio.create_task(store.queues.wait("tasks", 30))
                await other.queues.send("events", [OutgoingMessage(b"e")])
                await other.queues.send("tasks", [OutgoingMessage(b"t")])
                await asyncio.wait_for(waiter, 10)
                await asyncio.sleep(0.2)  # a notification of "events" would be in by now
            finally:
                listening.pgconn.untrace()
        heard = [line for line in trace.read_text().splitlines() if "NotificationResponse" in line]
        assert len(heard) == 1 and '"tasks"' in heard[0], heard
    finally:
        await other.close()
        await store.close()


async def test_a_queue_waiter_hears_no_changes_until_its_feed_is_watched(
    postgres_cluster: Cluster, tmp_path: Path
) -> None:
    url = postgres_url(postgres_cluster)
    store, other = open_store(url), open_store(url)
    trace = tmp_path / "listen.trace"
    try:
        await store.queues.wait("tasks", 0.01)  # as a worker waits: the listener is started
        listening = store.queues._listener._conn  # type: ignore[attr-defined]
        with trace.open("w") as out:
            listening.pgconn.trace(out.fileno())
            try:
                waiter = asyncio.create_task(store.queues.wait("tasks", 30))
                batch = other.batch()  # as a coordinator commits: a state and its change
                batch.put("states/w1", b"s")
                batch.send("events", [OutgoingMessage(b"e")])
                await batch.commit()
                await other.queues.send("tasks", [OutgoingMessage(b"t")])
                await asyncio.wait_for(waiter, 10)
                await asyncio.sleep(0.2)  # a change notification would be in by now
            finally:
                listening.pgconn.untrace()
        heard = [line for line in trace.read_text().splitlines() if "NotificationResponse" in line]
        assert len(heard) == 1 and '"tasks"' in heard[0], heard
        # Once a stream watches, the same commits wake it.
        async with store.changes.watch("history/w1/") as watcher:
            woken = asyncio.create_task(watcher.wait(30))
            await asyncio.sleep(0.05)
            batch = other.batch()
            batch.put("history/w1/0001", b"h")
            await batch.commit()
            assert await asyncio.wait_for(woken, 10) == "history/w1/"
    finally:
        await other.close()
        await store.close()


async def test_waiting_for_another_queue_keeps_the_first_one_heard(
    postgres_cluster: Cluster,
) -> None:
    url = postgres_url(postgres_cluster)
    schema = url.rpartition("schema=")[2]
    store = open_store(url)
    try:
        await store.queues.wait("a", 0.01)
        # Listens on a new connection, for all three (as a worker of two queues waits).
        await asyncio.gather(store.queues.wait("b", 0.01), store.queues.wait("c", 0.01))
        with psycopg.connect(postgres_cluster.url, autocommit=True) as admin:
            for queue in ("a", "b", "c"):
                waiter = asyncio.create_task(store.queues.wait(queue, 30))
                await asyncio.sleep(0.05)
                started = time.monotonic()
                admin.execute("SELECT pg_notify(%s, %s)", (queue_channel(schema, queue), queue))
                await asyncio.wait_for(waiter, 10)
                assert time.monotonic() - started < 2  # not the 30 s of a poll
    finally:
        await store.close()


async def test_the_listener_listens_again_soon_after_its_connection_is_killed(
    postgres_cluster: Cluster,
) -> None:
    url = postgres_url(postgres_cluster)
    listen = f'LISTEN "dagq:{url.rpartition("schema=")[2]}"'
    store = open_store(url)
    try:
        await store.queues.wait("q", 0.01)  # the listener is started and checked
        with psycopg.connect(postgres_cluster.url, autocommit=True) as admin:

            def listeners() -> list[int]:
                sql = "SELECT pid FROM pg_stat_activity WHERE query = %s"
                return [pid for (pid,) in admin.execute(sql, (listen,))]

            killed = listeners()
            assert len(killed) == 1
            admin.execute("SELECT pg_terminate_backend(%s)", killed)
            deadline = time.monotonic() + 3  # well within the 5 s a poll would take
            while listeners() in ([], killed):
                assert time.monotonic() < deadline, "nobody LISTENs again"
                await asyncio.sleep(0.02)
            # Twice: the first wait may end on the wake-up every waiter gets once the
            # listener is back; the second only on the notification.
            for _ in range(2):
                waiter = asyncio.create_task(store.queues.wait("q", 30))
                await asyncio.sleep(0.05)
                started = time.monotonic()
                admin.execute("SELECT pg_notify(%s, 'q')", (listen[8:-1],))
                await asyncio.wait_for(waiter, 10)
                assert time.monotonic() - started < 2  # not the 30 s of a poll
    finally:
        await store.close()


async def test_a_batch_with_a_failed_condition_writes_nothing(postgres_cluster: Cluster) -> None:
    store = open_store(postgres_url(postgres_cluster))
    try:
        await store.documents.put("taken", b"1")
        batch = store.batch()
        batch.put("fresh", b"x")
        batch.send("q", [OutgoingMessage(b"m")])
        batch.put("taken", b"2", if_none_match=True)
        with pytest.raises(Exception, match="exists already"):
            await batch.commit()
        assert await store.documents.get("fresh") is None
        assert (await store.queues.depth("q")).visible == 0
    finally:
        await store.close()


async def test_a_batch_commits_in_one_round_trip(postgres_cluster: Cluster, tmp_path: Path) -> None:
    store = open_store(postgres_url(postgres_cluster))
    await store.documents.put("a", b"1")  # opened and migrated
    with _traced(store, tmp_path / "libpq.trace"):
        batch = store.batch()
        batch.put("a", b"2")
        batch.send("q", [OutgoingMessage(b"x")])
        await batch.commit()
    trace = tmp_path / "libpq.trace"
    try:
        lines = trace.read_text().splitlines()
        answers = [line for line in lines if "\tReadyForQuery" in line]
        # One statement (no BEGIN, no COMMIT), one round trip, and one more where the
        # connection prepares it (its first use there).
        assert sum("\tExecute" in line for line in lines) == 1
        assert len(answers) == 1 + sum("\tParse\t" in line for line in lines)
        assert (await store.documents.get("a")).data == b"2"  # type: ignore[union-attr]
    finally:
        await store.close()


async def test_a_workers_report_is_one_statement_without_a_transaction_block(
    postgres_cluster: Cluster, tmp_path: Path
) -> None:
    store = open_store(postgres_url(postgres_cluster))
    try:
        await store.queues.send("tasks", [OutgoingMessage(b"t1"), OutgoingMessage(b"t2")])
        held = await store.queues.receive("tasks", max_messages=2, visibility_timeout_s=60)
        trace = tmp_path / "libpq.trace"
        with _traced(store, trace):
            batch = store.batch()  # as a worker's outbox reports: send, delete what it reports on
            batch.send("events", [OutgoingMessage(b"done")])
            acked = batch.ack("tasks", [held[0].receipt, "stale-receipt"])
            await batch.commit()
        sent = [line for line in trace.read_text().splitlines() if "\tF\t" in line]
        assert not [line for line in sent if "BEGIN" in line or "COMMIT" in line], sent
        assert sum("\tParse\t" in line or "\tBind\t" in line for line in sent) <= 2, sent
        assert acked is not None and acked.deleted == [1]  # the stale receipt deleted nothing
        events = await store.queues.receive("events", max_messages=5, visibility_timeout_s=60)
        assert [m.body for m in events] == [b"done"]
        left = await store.queues.receive("tasks", max_messages=5, visibility_timeout_s=0.1)
        assert left == []  # t2 is still held, t1 gone
        assert (await store.queues.depth("tasks")).invisible == 1
    finally:
        await store.close()


async def test_a_steps_delete_of_its_events_goes_in_its_send_statement(
    postgres_cluster: Cluster, tmp_path: Path
) -> None:
    store = open_store(postgres_url(postgres_cluster))
    try:
        await store.queues.send("events", [OutgoingMessage(b"e1"), OutgoingMessage(b"e2")])
        held = await store.queues.receive("events", max_messages=2, visibility_timeout_s=60)
        trace = tmp_path / "libpq.trace"
        with _traced(store, trace):
            batch = store.batch()  # as a coordinator's step: a state, the next task, the events
            batch.put("states/w1", b"s")
            batch.send("tasks", [OutgoingMessage(b"t")])
            acked = batch.ack("events", [m.receipt for m in held] + ["stale-receipt"])
            await batch.commit()
        sent = [line for line in trace.read_text().splitlines() if "\tF\t" in line]
        assert not [line for line in sent if "DELETE FROM" in line and "WITH" not in line], sent
        assert acked is not None and acked.deleted == [2]
        assert (await store.queues.depth("events")).invisible == 0
        tasks = await store.queues.receive("tasks", max_messages=5, visibility_timeout_s=60)
        assert [m.body for m in tasks] == [b"t"]
        assert (await store.documents.get("states/w1")).data == b"s"  # type: ignore[union-attr]
        # An ack of the queue the batch sends to stays a statement of its own.
        batch = store.batch()
        batch.send("tasks", [OutgoingMessage(b"t2")])
        again = batch.ack("tasks", [tasks[0].receipt])
        await batch.commit()
        assert again is not None and again.deleted == [1]
        assert (await store.queues.depth("tasks")).visible == 1
    finally:
        await store.close()


async def test_a_large_batch_is_a_handful_of_statements(
    postgres_cluster: Cluster, tmp_path: Path
) -> None:
    store = open_store(postgres_url(postgres_cluster))
    etags = [await store.documents.put(f"s{i}", b"0") for i in range(3)]
    trace = tmp_path / "libpq.trace"
    with _traced(store, trace):
        batch = store.batch()
        for i, etag in enumerate(etags):
            batch.put(f"s{i}", b"1", if_match=etag)  # compare-and-swaps
            batch.put(f"p{i}", b"1")  # plain writes
            batch.send("q", [OutgoingMessage(b"m%d" % i)])
            batch.upsert(_row("w1", "running"))
        batch.upsert(_row("w1", "succeeded"))  # the last row of an id wins
        batch.upsert(_row("w2", "running"))
        new_etags = await batch.commit()
    try:
        sent = [line for line in trace.read_text().splitlines() if "\tF\t" in line]
        # One statement: the swaps, the plain writes, the index rows, the sends, the
        # announcement of the changes; no BEGIN nor COMMIT.
        assert sum("\tExecute" in line for line in sent) == 1
        assert len(new_etags) == 6
        for i in range(3):
            assert (await store.documents.get(f"s{i}")).etag == new_etags[2 * i]  # type: ignore[union-attr]
            assert (await store.documents.get(f"p{i}")).data == b"1"  # type: ignore[union-attr]
        got = await store.queues.receive("q", max_messages=10, visibility_timeout_s=30)
        assert [m.body for m in got] == [b"m0", b"m1", b"m2"]
        assert (await store.index.get("w1")).status == "succeeded"  # type: ignore[union-attr]
        assert (await store.index.get("w2")) is not None
    finally:
        await store.close()


async def test_a_batch_of_swaps_with_one_stale_etag_writes_nothing(
    postgres_cluster: Cluster,
) -> None:
    store = open_store(postgres_url(postgres_cluster))
    try:
        etags = [await store.documents.put(f"s{i}", b"0") for i in range(3)]
        await store.documents.put("s1", b"moved on")
        batch = store.batch()
        for i, etag in enumerate(etags):
            batch.put(f"s{i}", b"1", if_match=etag)
        batch.send("q", [OutgoingMessage(b"m")])
        with pytest.raises(ConflictError, match="s1"):
            await batch.commit()
        assert [(await store.documents.get(f"s{i}")).data for i in range(3)] == [  # type: ignore[union-attr]
            b"0",
            b"moved on",
            b"0",
        ]
        assert (await store.queues.depth("q")).visible == 0
    finally:
        await store.close()


def _row(workflow_id: str, status: str) -> IndexRow:
    return IndexRow(id=workflow_id, name="wf", status=status, created_at=1.0, updated_at=2.0)


@contextlib.contextmanager
def _traced(store: Store, trace: Path) -> Iterator[None]:
    """Meanwhile, the protocol messages of the store's batches go to ``trace``."""
    db = store.committer._db  # type: ignore[union-attr]
    pooled, committing = db.connection, db.committing

    def tracing(opened: Any) -> Any:
        @contextlib.asynccontextmanager
        async def traced() -> AsyncIterator[Any]:
            async with opened() as conn:
                with trace.open("w") as out:
                    conn.pgconn.trace(out.fileno())
                    try:
                        yield conn
                    finally:
                        conn.pgconn.untrace()

        return traced

    db.connection, db.committing = tracing(pooled), tracing(committing)
    try:
        yield
    finally:
        db.connection, db.committing = pooled, committing


async def test_overdue_messages_first_in_line_do_not_shorten_a_receive(
    postgres_cluster: Cluster,
) -> None:
    # A receive walks the queue once: the overdue messages it meets go to the dead
    # letters and take places in its limit, so it looks again for the rest.
    now = [1_700_000_000.0]
    store = open_store(postgres_url(postgres_cluster), clock=lambda: now[0], max_deliveries=1)
    try:
        for i in range(2):
            await store.queues.send("q", [OutgoingMessage(b"%d" % i, id=f"m{i}")])
        first = await store.queues.receive("q", max_messages=2, visibility_timeout_s=1)
        assert [m.id for m in first] == ["m0", "m1"]
        now[0] += 2  # m0 and m1 are visible again, delivered once (the limit) ...
        for i in range(2, 4):  # ... and first in line, before these
            await store.queues.send("q", [OutgoingMessage(b"%d" % i, id=f"m{i}")])
        got = await store.queues.receive("q", max_messages=2, visibility_timeout_s=30)
        assert [m.id for m in got] == ["m2", "m3"]
        assert sorted(d.id for d in await store.queues.dead_letters("q")) == ["m0", "m1"]
        assert await store.queues.receive("q", max_messages=2, visibility_timeout_s=30) == []
    finally:
        await store.close()


async def _notices(conn: psycopg.AsyncConnection[Any], settle_s: float = 0.3) -> list[str]:
    """The channels of the notifications ``conn`` received within ``settle_s``."""
    heard: list[str] = []
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(settle_s):
            async for notify in conn.notifies():
                heard.append(notify.channel)
    return heard


async def _woken(conn: psycopg.AsyncConnection[Any], broadcast: str) -> list[str]:
    """The processes' own channels a send woke, in order, heard on ``conn``. A woken
    process whose wait was not under way at that instant passes the wake-up on to the
    queue's channel (``broadcast``), by design: allowed beside them, never instead."""
    heard = await _notices(conn)
    mine = [channel for channel in heard if channel != broadcast]
    assert len(heard) - len(mine) <= len(mine), heard
    return mine


async def _keep_waiting(store: Store, queue: str) -> None:
    """Keep a wait for ``queue`` under way in this process (not one that returns at
    once for a send since the store's last receive)."""
    wakeups = store.queues._wakeups  # type: ignore[attr-defined]
    while True:
        await wakeups.wait(queue, 1.0)


async def _take(store: Store, most: int = 4) -> list[bytes]:
    """Receive from "tasks" and delete what came: the bodies."""
    got = await store.queues.receive("tasks", max_messages=most, visibility_timeout_s=30)
    assert await store.queues.delete("tasks", [m.receipt for m in got]) == len(got)
    return [m.body for m in got]


async def test_a_send_hands_its_messages_to_registered_waiters(
    postgres_cluster: Cluster,
) -> None:
    url = postgres_url(postgres_cluster)
    first, second, sender = open_store(url), open_store(url), open_store(url)
    own = {s: s.queues._listener.own for s in (first, second)}  # type: ignore[attr-defined]
    schema = _schema(url)
    broadcast = queue_channel(schema, "tasks")
    conninfo = first.queues._db.target.conninfo  # type: ignore[attr-defined]
    ear = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
    try:
        for channel in [*own.values(), broadcast]:
            await ear.execute(f'LISTEN "{channel}"')
        for store in (first, second):  # as idle workers: listening, a receive found nothing
            await store.queues.wait("tasks", 0.01)
            assert await _take(store) == []
        keepers = [asyncio.ensure_future(_keep_waiting(s, "tasks")) for s in (first, second)]
        await sender.queues.send("tasks", [OutgoingMessage(b"1")])
        woken = await _woken(ear, broadcast)
        assert len(woken) == 1 and woken[0] in own.values(), woken  # one of them, alone
        taker = first if woken[0] == own[first] else second
        # Handed: received by the taker already (hidden), taken without a look.
        depth = await sender.queues.depth("tasks")
        assert (depth.visible, depth.invisible) == (0, 1)
        assert await _take(taker) == [b"1"]
        # Several messages: each registered waiter woken, none handed one (they look in
        # the table for the others anyway), and the registrations go.
        await sender.queues.send("tasks", [OutgoingMessage(b"2"), OutgoingMessage(b"3")])
        assert sorted(await _woken(ear, broadcast)) == sorted(own.values())
        depth = await sender.queues.depth("tasks")
        assert (depth.visible, depth.invisible) == (2, 0)
        assert sorted([*await _take(first), *await _take(second)]) == [b"2", b"3"]
        # A registration wanting one is handed one and goes.
        assert await _take(first) == []  # registered again, after ``second``
        await ear.execute(f"UPDATE {schema}.waiters SET want = 1")
        await sender.queues.send("tasks", [OutgoingMessage(b"4")])
        assert await _woken(ear, broadcast) == [own[first]]
        cur = await ear.execute(f"SELECT channel FROM {schema}.waiters")
        assert [row[0] for row in await cur.fetchall()] == [own[second]]
        assert await _take(first) == [b"4"]
        await ear.execute(f"DELETE FROM {schema}.waiters")
        # Nobody registered: every listener, and the message waits in the table.
        await sender.queues.send("tasks", [OutgoingMessage(b"6")])
        assert set(await _notices(ear)) == {broadcast}
        # A receive that gets what it asked for is not waiting: it withdraws.
        assert await _take(first, 1) == [b"6"]
        assert await _take(second, 9) == []
        cur = await ear.execute(f"SELECT channel FROM {schema}.waiters WHERE queue = 'tasks'")
        assert [row[0] for row in await cur.fetchall()] == [own[second]]
        for keeper in keepers:
            keeper.cancel()
        # Closed: its registration goes.
        await second.close()
        cur = await ear.execute(f"SELECT count(*) FROM {schema}.waiters")
        assert await cur.fetchone() == (0,)
    finally:
        await ear.close()
        for store in (first, second, sender):
            await store.close()


async def test_a_message_that_cannot_be_handed_waits_in_the_table_and_wakes_the_waiter(
    postgres_cluster: Cluster,
) -> None:
    # Too large for a notification, or delayed: the one message of a send goes in the
    # table, visible (or not yet), and the registered waiter is woken to look.
    url = postgres_url(postgres_cluster)
    waiter, sender = open_store(url), open_store(url)
    own = waiter.queues._listener.own  # type: ignore[attr-defined]
    broadcast = queue_channel(_schema(url), "tasks")
    conninfo = waiter.queues._db.target.conninfo  # type: ignore[attr-defined]
    ear = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
    try:
        for channel in (own, broadcast):
            await ear.execute(f'LISTEN "{channel}"')
        await waiter.queues.wait("tasks", 0.01)
        keeper = asyncio.ensure_future(_keep_waiting(waiter, "tasks"))
        large = b"x" * (postgres_queues.HAND_MOST + 1)
        delayed = OutgoingMessage(b"d", delay_s=30.0)
        for message, visible in ((OutgoingMessage(large), 1), (delayed, 0)):
            assert await _take(waiter) == []  # registered
            await sender.queues.send("tasks", [message])
            assert await _woken(ear, broadcast) == [own]
            depth = await sender.queues.depth("tasks")
            assert (depth.visible, depth.invisible) == (visible, 1 - visible)
            if visible:
                assert await _take(waiter) == [large]
        keeper.cancel()
    finally:
        await ear.close()
        await waiter.close()
        await sender.close()


async def test_a_registration_whose_listener_is_gone_is_handed_nothing(
    postgres_cluster: Cluster,
) -> None:
    """A process killed while registered holds no lock: its registration is dropped,
    the message stays visible and every listener of the queue is woken."""
    url = postgres_url(postgres_cluster)
    live, sender = open_store(url), open_store(url)
    schema = _schema(url)
    conninfo = live.queues._db.target.conninfo  # type: ignore[attr-defined]
    ear = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
    try:
        await live.queues.wait("tasks", 0.01)
        assert await _take(live) == []
        own = live.queues._listener.own  # type: ignore[attr-defined]
        for channel in (own, "dagq:w:gone", queue_channel(schema, "tasks")):
            await ear.execute(f'LISTEN "{channel}"')
        # Renewed after the live one's (so taken first), and its lock is held by nobody.
        await ear.execute(
            f"INSERT INTO {schema}.waiters (queue, channel, until, want, hide, key) "
            "VALUES ('tasks', 'dagq:w:gone', %s, 4, 30, 12345)",
            (time.time() + 60,),
        )
        await sender.queues.send("tasks", [OutgoingMessage(b"1")])
        assert await _notices(ear) == [queue_channel(schema, "tasks")]
        depth = await sender.queues.depth("tasks")
        assert (depth.visible, depth.invisible) == (1, 0)
        cur = await ear.execute(f"SELECT channel FROM {schema}.waiters")
        assert [row[0] for row in await cur.fetchall()] == [own]
        assert await _take(live) == [b"1"]
    finally:
        await ear.close()
        for store in (live, sender):
            await store.close()


async def test_a_handed_message_no_receive_takes_soon_is_given_back(
    postgres_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Handed to a process that registered, then stopped receiving (stopping, full):
    visible again for everyone after HOLD_S, not after its hiding time."""
    monkeypatch.setattr(postgres_wakeups, "HOLD_S", 0.2)
    url = postgres_url(postgres_cluster)
    busy, other, sender = open_store(url), open_store(url), open_store(url)
    conninfo = busy.queues._db.target.conninfo  # type: ignore[attr-defined]
    ear = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
    try:
        own = busy.queues._listener.own  # type: ignore[attr-defined]
        for channel in (own, queue_channel(_schema(url), "tasks")):
            await ear.execute(f'LISTEN "{channel}"')
        await busy.queues.wait("tasks", 0.01)
        assert await _take(busy) == []
        await sender.queues.send("tasks", [OutgoingMessage(b"1")])
        depth = await sender.queues.depth("tasks")
        assert (depth.visible, depth.invisible) == (0, 1)  # handed to ``busy``: hidden
        deadline = time.monotonic() + 5  # given back after HOLD_S, not its 30 s
        while (await sender.queues.depth("tasks")).visible == 0:
            assert time.monotonic() < deadline, "not given back"
            await asyncio.sleep(0.05)
        [back] = await other.queues.receive("tasks", max_messages=2, visibility_timeout_s=30)
        assert back.body == b"1" and back.dequeue_count == 1  # as never delivered
        assert await _take(busy) == []  # not kept there either
        # Handed to ``busy`` alone, then every listener of the queue woken for it.
        assert await _notices(ear) == [own, queue_channel(_schema(url), "tasks")]
    finally:
        await ear.close()
        for store in (busy, other, sender):
            await store.close()


async def test_a_handed_message_not_taken_goes_back_when_the_store_closes(
    postgres_cluster: Cluster,
) -> None:
    url = postgres_url(postgres_cluster)
    closing, sender = open_store(url), open_store(url)
    schema = _schema(url)
    conninfo = sender.queues._db.target.conninfo  # type: ignore[attr-defined]
    ear = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
    try:
        await ear.execute(f'LISTEN "{closing.queues._listener.own}"')  # type: ignore[attr-defined]
        await closing.queues.wait("tasks", 0.01)
        assert await _take(closing) == []
        await sender.queues.send("tasks", [OutgoingMessage(b"1")])
        assert len(await _notices(ear)) == 1
        await closing.close()
        cur = await ear.execute(f"SELECT count(*) FROM {schema}.waiters")
        assert await cur.fetchone() == (0,)
        assert await _take(sender) == [b"1"]
    finally:
        await ear.close()
        for store in (closing, sender):
            await store.close()


async def test_a_send_wakes_the_latest_registered_waiter_first(
    postgres_cluster: Cluster,
) -> None:
    """A process killed while registered is woken last: its registration is not renewed."""
    url = postgres_url(postgres_cluster)
    gone, live, sender = open_store(url), open_store(url), open_store(url)
    conninfo = live.queues._db.target.conninfo  # type: ignore[attr-defined]
    ear = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
    try:
        for store in (gone, live):
            await store.queues.wait("tasks", 0.01)
            await ear.execute(f'LISTEN "{store.queues._listener.own}"')  # type: ignore[attr-defined]
        for store in (live, gone, live):  # live renewed last
            assert (
                await store.queues.receive("tasks", max_messages=4, visibility_timeout_s=30) == []
            )
            await asyncio.sleep(0.01)
        await sender.queues.send("tasks", [OutgoingMessage(b"1")])
        assert await _notices(ear) == [live.queues._listener.own]  # type: ignore[attr-defined]
    finally:
        await ear.close()
        for store in (gone, live, sender):
            await store.close()


async def test_arrays_encoded_by_the_store_read_back_as_they_were(
    postgres_cluster: Cluster,
) -> None:
    texts = ["a", "", "é ✓ \x1f", None, "x" * 5000]
    blobs = [b"", b"\x00\xff" * 3000, b"plain"]
    floats = [0.0, -1.5, 1e300, 1796191311.4335434]
    async with await psycopg.AsyncConnection.connect(
        postgres_cluster.url, autocommit=True, context=ADAPTERS
    ) as conn:
        cur = await conn.execute(
            "SELECT %b::text[], %b::bytea[], %b::float8[], %b::text[], %b::bytea[], %b::float8[],"
            " %b::text[], %b::text[], %b::bytea[]",
            (
                text_array(texts),
                bytea_array(blobs),
                float8_array(floats),
                text_array([]),
                bytea_array([]),
                float8_array([]),
                text_array(["é ✓"]),
                text_array([None]),
                bytea_array([b"\x00\xff"]),
            ),
        )
        row = await cur.fetchone()
    assert row == (texts, blobs, floats, [], [], [], ["é ✓"], [None], [b"\x00\xff"])


async def test_commits_share_the_stores_own_connection_one_at_a_time(
    postgres_cluster: Cluster,
) -> None:
    # A commit uses the store's own connection while no other commit does, a pooled
    # one meanwhile; a connection that broke under a commit is not used again.
    store = open_store(postgres_url(postgres_cluster))
    try:
        await store.documents.put("a", b"0")
        db = store.committer._db  # type: ignore[union-attr]
        pids = []

        async def commit(n: int) -> None:
            async with db.committing() as conn:
                pids.append(conn.info.backend_pid)
                await asyncio.sleep(0.01)  # the next one starts meanwhile
            batch = store.batch()
            batch.put(f"k{n}", str(n).encode())
            batch.send("q", [OutgoingMessage(str(n).encode())])
            await batch.commit()

        await asyncio.gather(*(commit(n) for n in range(3)))
        own = pids[0]
        assert own not in pids[1:], pids  # the first on the own connection, the others pooled
        async with db.committing() as conn:
            assert conn.info.backend_pid == own
        for n in range(3):
            assert (await store.documents.get(f"k{n}")).data == str(n).encode()  # type: ignore[union-attr]
        with psycopg.connect(postgres_cluster.url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (own,))
        batch = store.batch()
        batch.put("a", b"1")
        with pytest.raises(StoreUnavailable):
            await batch.commit()
        batch = store.batch()
        batch.put("a", b"2")
        await batch.commit()
        assert (await store.documents.get("a")).data == b"2"  # type: ignore[union-attr]
        async with db.committing() as conn:
            assert conn.info.backend_pid != own
    finally:
        await store.close()


async def test_a_commit_under_way_when_the_store_closes_completes(
    postgres_cluster: Cluster,
) -> None:
    """close() leaves a connection in use to its user, who gives it back to the closed
    pool when done (which closes it): the statement under way completes (it once
    failed with a KeyError from the store's bookkeeping of its own connections)."""
    store = open_store(postgres_url(postgres_cluster))
    await store.documents.put("a", b"0")
    db = store.committer._db  # type: ignore[union-attr]
    entered = asyncio.Event()

    async def slow() -> int:
        async with db.committing() as conn:
            entered.set()
            cur = await conn.execute("SELECT 1 FROM pg_sleep(0.3)")
            row = await cur.fetchone()
            return int(row[0])

    task = asyncio.ensure_future(slow())
    await entered.wait()
    await store.close()
    assert await asyncio.wait_for(task, 30) == 1
    assert not db._own
