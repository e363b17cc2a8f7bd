"""What the sqlite backend does beyond the shared contract: files, paths, sharing."""

from __future__ import annotations

import asyncio
import gc
import os
import sqlite3
import threading
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from dagq.errors import StoreUnavailable, ValidationError
from dagq.stores.base import OutgoingMessage, Store
from dagq.stores.sqlite import open_sqlite_store, path_from_url
from dagq.stores.sqlite_schema import SCHEMA_VERSION


async def test_opening_creates_the_file_and_its_parent_directories(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "dagq.db"
    store = open_sqlite_store(path)
    await store.close()
    assert path.is_file()


async def test_the_file_is_in_wal_mode(tmp_path: Path) -> None:
    store = open_sqlite_store(tmp_path / "dagq.db")
    await store.close()
    with sqlite3.connect(tmp_path / "dagq.db") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()


async def test_data_survives_closing_and_reopening(tmp_path: Path) -> None:
    store = open_sqlite_store(tmp_path / "dagq.db")
    etag = await store.documents.put("a", b"kept")
    await store.queues.send("q", [OutgoingMessage(body=b"queued")])
    await store.close()

    reopened = open_sqlite_store(tmp_path / "dagq.db")
    document = await reopened.documents.get("a")
    [message] = await reopened.queues.receive("q", max_messages=10, visibility_timeout_s=30)
    await reopened.close()
    assert document is not None and (document.data, document.etag) == (b"kept", etag)
    assert message.body == b"queued"


async def test_opening_a_store_does_not_wait_for_another_process_write(tmp_path: Path) -> None:
    # A coordinator's long commit holds the write lock; `dagq status` opening the same
    # file must not queue behind it (before the schema version was recorded, every
    # open ran the schema script in BEGIN IMMEDIATE and failed here after the busy timeout).
    path = tmp_path / "dagq.db"
    store = open_sqlite_store(path)
    await store.documents.put("a", b"kept")
    await store.close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        reopened = open_sqlite_store(path, create=False)
        document = await reopened.documents.get("a")
        await reopened.close()
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert document is not None and document.data == b"kept"


async def test_a_store_made_before_the_schema_version_was_recorded_opens(tmp_path: Path) -> None:
    path = tmp_path / "dagq.db"
    store = open_sqlite_store(path)
    await store.documents.put("a", b"kept")
    await store.close()
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("PRAGMA user_version = 0")
    reopened = open_sqlite_store(path, create=False)
    document = await reopened.documents.get("a")
    await reopened.close()
    with closing(sqlite3.connect(path)) as conn:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
    assert document is not None and document.data == b"kept"
    assert version == SCHEMA_VERSION


async def test_two_stores_on_one_file_share_messages_without_duplicates(tmp_path: Path) -> None:
    first = open_sqlite_store(tmp_path / "dagq.db")
    second = open_sqlite_store(tmp_path / "dagq.db")
    await first.queues.send("q", [OutgoingMessage(body=b"x")])
    taken = await second.queues.receive("q", max_messages=10, visibility_timeout_s=30)
    again = await first.queues.receive("q", max_messages=10, visibility_timeout_s=30)
    await first.close()
    await second.close()
    assert len(taken) == 1 and again == []


async def test_wait_wakes_on_a_send_through_another_store_on_the_same_file(
    tmp_path: Path,
) -> None:
    first = open_sqlite_store(tmp_path / "dagq.db")
    second = open_sqlite_store(tmp_path / "dagq.db")
    waiter = asyncio.create_task(first.queues.wait("q", 30))
    await asyncio.sleep(0.01)
    await second.queues.send("q", [OutgoingMessage(body=b"x")])
    sent = time.monotonic()  # a commit under load can itself take a second
    await asyncio.wait_for(waiter, 5)
    woken_s = time.monotonic() - sent
    await first.close()
    await second.close()
    assert woken_s < 1  # woken by the send, not at the end of its 30 s


async def test_a_closed_store_raises_store_unavailable(tmp_path: Path) -> None:
    store = open_sqlite_store(tmp_path / "dagq.db")
    await store.close()
    with pytest.raises(StoreUnavailable, match="closed"):
        await store.documents.get("a")


def test_a_path_below_a_regular_file_names_the_path(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    path = tmp_path / "file" / "dagq.db"
    with pytest.raises(StoreUnavailable, match=str(path)):
        open_sqlite_store(path)


def test_a_directory_as_the_path_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(StoreUnavailable, match=str(tmp_path)):
        open_sqlite_store(tmp_path)


def test_a_file_that_is_not_a_database_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_bytes(b"this is not a sqlite database, just text. " * 100)
    with pytest.raises(StoreUnavailable, match=str(path)):
        open_sqlite_store(path)


def test_sqlite_urls_with_three_slashes_are_relative_and_with_four_absolute() -> None:
    assert path_from_url("sqlite:///data/dagq.db") == Path("data/dagq.db")
    assert path_from_url("sqlite:////var/dagq.db") == Path("/var/dagq.db")


@pytest.mark.parametrize("url", ["sqlite:///", "sqlite://dagq.db", "sqlite:dagq.db"])
def test_a_malformed_sqlite_url_is_rejected(url: str) -> None:
    with pytest.raises(ValidationError, match="sqlite:///"):
        path_from_url(url)


# --- off the event loop -----------------------------------------------------------------


async def _every_primitive(store: Store) -> None:
    await store.documents.put("doc", b"x" * 100_000)
    await store.documents.get("doc")
    await store.documents.list("d")
    await store.queues.send("q", [OutgoingMessage(body=b"m")])
    [message] = await store.queues.receive("q", max_messages=1, visibility_timeout_s=30)
    receipt = await store.queues.extend("q", message.receipt, 30)
    await store.queues.depth("q")
    batch = store.batch()
    batch.put("other", b"y")
    batch.ack("q", [receipt])
    await batch.commit()
    await store.index.query(limit=10)
    lease = await store.leases.acquire("lease", "me", 30)
    await store.leases.renew(lease, 30)
    await store.leases.get("lease")


async def test_no_statement_runs_on_the_event_loop_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: set[int] = set()
    connect = sqlite3.connect

    def traced(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn = connect(*args, **kwargs)
        conn.set_trace_callback(lambda _: threads.add(threading.get_ident()))
        return conn

    monkeypatch.setattr(sqlite3, "connect", traced)
    store = open_sqlite_store(tmp_path / "dagq.db")
    await _every_primitive(store)
    await store.close()
    assert threads and threading.get_ident() not in threads


async def test_a_run_of_store_calls_lets_other_tasks_run_between_them(tmp_path: Path) -> None:
    store = open_sqlite_store(tmp_path / "dagq.db")
    await store.documents.put("doc", b"x")
    turns = 0

    async def other_task() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    ticking = asyncio.create_task(other_task())
    await asyncio.sleep(0)
    turns = 0
    for _ in range(200):  # a sweep over many workflows, say
        await store.documents.get("doc")
        await store.index.get("wf")
    ticking.cancel()
    await store.close()
    assert turns >= 200  # the loop went round between the calls


async def test_a_write_waiting_for_another_process_lock_waits_off_the_loop(
    tmp_path: Path,
) -> None:
    store = open_sqlite_store(tmp_path / "dagq.db")
    holder = sqlite3.connect(tmp_path / "dagq.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    sending = asyncio.create_task(store.queues.send("q", [OutgoingMessage(body=b"m")]))
    started = time.monotonic()
    for _ in range(20):  # the loop keeps turning while the send waits for the lock
        await asyncio.sleep(0.01)
    assert not sending.done()
    assert time.monotonic() - started < 5
    holder.execute("COMMIT")
    holder.close()
    await asyncio.wait_for(sending, 10)
    assert len(await store.queues.receive("q", max_messages=5, visibility_timeout_s=30)) == 1
    await store.close()


async def test_a_receive_of_an_empty_queue_does_not_wait_for_another_process_lock(
    tmp_path: Path,
) -> None:
    # Two workers woken by one send: the one that finds the queue empty must not take
    # (nor wait for) the write lock the other process's commits need.
    store = open_sqlite_store(tmp_path / "dagq.db")
    await store.queues.send("other", [OutgoingMessage(body=b"m")])
    holder = sqlite3.connect(tmp_path / "dagq.db", isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        empty = await asyncio.wait_for(
            store.queues.receive("q", max_messages=5, visibility_timeout_s=30), 2
        )
        assert empty == []
        taking = asyncio.create_task(
            store.queues.receive("other", max_messages=5, visibility_timeout_s=30)
        )
        for _ in range(10):  # a visible message: the receive waits for the lock
            await asyncio.sleep(0.01)
        assert not taking.done()
        holder.execute("COMMIT")
        [message] = await asyncio.wait_for(taking, 10)
        assert message.body == b"m"
    finally:
        holder.close()
        await store.close()


async def test_closing_the_store_ends_its_threads(tmp_path: Path) -> None:
    before = set(threading.enumerate())
    store = open_sqlite_store(tmp_path / "dagq.db")
    await _every_primitive(store)
    assert {t.name for t in set(threading.enumerate()) - before} >= {"dagq-sqlite-writer-0"}
    await store.close()
    assert not [t for t in set(threading.enumerate()) - before if t.name.startswith("dagq-sqlite")]


async def test_a_store_dropped_without_closing_ends_its_threads(tmp_path: Path) -> None:
    before = set(threading.enumerate())
    store = open_sqlite_store(tmp_path / "dagq.db")
    await _every_primitive(store)
    del store
    gc.collect()
    deadline = time.monotonic() + 30
    while [t for t in set(threading.enumerate()) - before if t.name.startswith("dagq-sqlite")]:
        assert time.monotonic() < deadline, "the threads of a dropped store kept running"
        await asyncio.sleep(0.01)


def test_a_forked_child_uses_the_store_with_threads_of_its_own(tmp_path: Path) -> None:
    store = open_sqlite_store(tmp_path / "dagq.db")
    asyncio.run(_every_primitive(store))  # the parent's threads are running

    async def read_in_child() -> bool:
        found = await asyncio.wait_for(store.documents.get("other"), 10)
        await asyncio.wait_for(store.documents.put("child", b"z"), 10)
        return found is not None and found.data == b"y"

    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit code
        try:
            os._exit(0 if asyncio.run(read_in_child()) else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert asyncio.run(store.documents.get("child")) is not None
    asyncio.run(store.close())
