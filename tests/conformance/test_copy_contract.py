"""``copy_store`` on every backend: into it from a memory store, and out of it (where
its queued messages can be read without receiving them) into a memory store."""

from __future__ import annotations

import pytest

from dagq.errors import UsageError
from dagq.stores.base import IndexRow, OutgoingMessage, Store
from dagq.stores.memory import open_memory_store
from dagq.stores.transfer import PendingReader, copy_store


def row(workflow_id: str, created_at: float) -> IndexRow:
    return IndexRow(
        id=workflow_id, name="n", status="running", created_at=created_at, updated_at=1.0
    )


async def fill(store: Store) -> None:
    for n in range(7):
        await store.documents.put(f"states/w{n}", bytes([n]) * (n + 1))
        await store.index.upsert(row(f"w{n}", float(n)))
    await store.queues.send("bad", [OutgoingMessage(b"junk", id="junk")])
    [junk] = await store.queues.receive("bad", max_messages=1, visibility_timeout_s=60)
    await store.queues.dead_letter("bad", junk.receipt, "cannot be parsed")
    await store.queues.send("default", [OutgoingMessage(b"t1", id="t1")])
    await store.queues.send("_completions", [OutgoingMessage(b"e1", id="e1")])
    await store.queues.send("default", [OutgoingMessage(b"t2", id="t2")])


async def check(store: Store) -> None:
    assert await store.documents.list("states/") == [f"states/w{n}" for n in range(7)]
    for n in range(7):
        found = await store.documents.get(f"states/w{n}")
        assert found is not None and found.data == bytes([n]) * (n + 1)
    page = await store.index.query(limit=100)
    assert [r.id for r in page.rows] == [f"w{n}" for n in reversed(range(7))]
    [letter] = await store.queues.dead_letters(None)
    assert (letter.queue, letter.id, letter.body) == ("bad", "junk", b"junk")
    assert letter.reason == "cannot be parsed"
    tasks = await store.queues.receive("default", max_messages=10, visibility_timeout_s=60)
    assert sorted(m.body for m in tasks) == [b"t1", b"t2"]
    events = await store.queues.receive("_completions", max_messages=10, visibility_timeout_s=60)
    assert [m.body for m in events] == [b"e1"]


async def test_a_copy_into_the_store_holds_everything_the_source_held(store: Store) -> None:
    source = open_memory_store()
    await fill(source)

    report = await copy_store(source, store)

    assert (report.documents, report.index_rows, report.messages, report.dead_letters) == (
        7,
        7,
        3,
        1,
    )
    await check(store)


async def test_a_copy_out_of_the_store_holds_everything_it_held(store: Store) -> None:
    if not isinstance(store.queues, PendingReader):
        pytest.skip("this backend cannot read its queues without receiving from them")
    await fill(store)
    copy = open_memory_store()

    await copy_store(store, copy)

    await check(copy)
    await check(store)  # the source is left as it was


async def test_a_copy_into_a_store_that_is_not_empty_is_refused(store: Store) -> None:
    await store.documents.put("anything", b"x")
    with pytest.raises(UsageError, match="is not empty"):
        await copy_store(open_memory_store(), store)
