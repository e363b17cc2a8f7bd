"""What the sqlite backend does beyond the shared contract: files, paths, sharing."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import pytest

from dagq.errors import StoreUnavailable, ValidationError
from dagq.stores.base import OutgoingMessage
from dagq.stores.sqlite import open_sqlite_store, path_from_url


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
    started = time.monotonic()
    await second.queues.send("q", [OutgoingMessage(body=b"x")])
    await asyncio.wait_for(waiter, 5)
    await first.close()
    await second.close()
    assert time.monotonic() - started < 1


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
