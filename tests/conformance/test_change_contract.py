"""The change feed of every backend (``Store.changes``): what wakes a watcher.

A batch that writes a document announces its directory, and an index row (batched or
upserted alone) announces :data:`INDEX_TOPIC`; a watcher of another topic is not told
that its topic changed. Where the feed is *complete* (memory, sqlite, postgres) a
change committed by another process wakes it too; azure's is not (its streams poll).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest

from dagq.stores.base import IndexRow, Store
from dagq.stores.changes import ANY, INDEX_TOPIC, topic_of

pytestmark = pytest.mark.timeout(60)

#: A watcher never waits this long in these tests unless nothing woke it.
LONG_S = 20.0


def row(workflow_id: str) -> IndexRow:
    now = time.time()
    return IndexRow(id=workflow_id, name="etl", status="running", created_at=now, updated_at=now)


async def test_a_committed_put_wakes_the_watcher_of_its_directory(store: Store) -> None:
    async with store.changes.watch("history/w1/") as watcher:
        waiting = asyncio.create_task(watcher.wait(LONG_S))
        await asyncio.sleep(0.01)
        batch = store.batch()
        batch.put("history/w1/0000000001", b"x")
        await batch.commit()
        assert await asyncio.wait_for(waiting, 10) == "history/w1/"


async def test_a_change_between_two_waits_is_not_lost(store: Store) -> None:
    async with store.changes.watch("history/w1/") as watcher:
        batch = store.batch()
        batch.put("history/w1/0000000001", b"x")
        await batch.commit()  # no one waits yet
        started = time.monotonic()
        assert await watcher.wait(LONG_S) == "history/w1/"
        assert time.monotonic() - started < 5


async def test_index_rows_wake_the_index_watcher_batched_or_alone(store: Store) -> None:
    async with store.changes.watch(INDEX_TOPIC) as watcher:
        await store.index.upsert(row("w1"))
        assert await asyncio.wait_for(watcher.wait(LONG_S), 10) == INDEX_TOPIC
        batch = store.batch()
        batch.upsert(row("w2"))
        await batch.commit()
        assert await asyncio.wait_for(watcher.wait(LONG_S), 10) == INDEX_TOPIC


async def test_a_watcher_of_another_topic_is_not_told_its_topic_changed(store: Store) -> None:
    async with store.changes.watch("history/w2/") as watcher:
        batch = store.batch()
        batch.put("history/w1/0000000001", b"x")
        await batch.commit()
        # A backend that only knows *that* the store changed wakes everyone broadly.
        assert await watcher.wait(0.2) in (None, ANY)


async def test_a_wait_without_a_change_times_out(store: Store) -> None:
    async with store.changes.watch("history/quiet/") as watcher:
        started = time.monotonic()
        assert await watcher.wait(0.1) in (None, ANY)
        assert time.monotonic() - started < 5


def test_the_topic_of_a_key_is_its_directory() -> None:
    assert topic_of("history/w1/0000000003") == "history/w1/"
    assert topic_of("states/w1") == "states/"
    assert topic_of("flat") == ""


async def test_a_complete_feed_hears_a_commit_of_another_process(
    store: Store, backend: str
) -> None:
    if backend in ("memory", "azure"):
        pytest.skip(f"no other process can write to a {backend} store the feed hears")
    async with store.changes.watch(INDEX_TOPIC) as watcher:
        assert watcher.complete
        assert await watcher.wait(0.05) in (None, ANY)  # whatever opening wrote
        writer = (
            "import asyncio, sys, time\n"
            "from dagq.stores import open_store\n"
            "from dagq.stores.base import IndexRow\n"
            "async def main():\n"
            "    store = open_store(sys.argv[1])\n"
            "    now = time.time()\n"
            "    await store.index.upsert(IndexRow(id='other', name='etl', status='running',"
            " created_at=now, updated_at=now))\n"
            "    await store.close()\n"
            "asyncio.run(main())\n"
        )
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-c", writer, store.url],
            capture_output=True,
            text=True,
            timeout=40,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert await asyncio.wait_for(watcher.wait(LONG_S), 10) in (INDEX_TOPIC, ANY)
        assert (await store.index.get("other")) is not None
