"""Batches of writes, on every backend: all applied, or stopped at a failed condition."""

from __future__ import annotations

import pytest

from dagq.errors import ConflictError
from dagq.stores.base import IndexRow, OutgoingMessage, Store


def row(workflow_id: str) -> IndexRow:
    return IndexRow(id=workflow_id, name="n", status="running", created_at=1.0, updated_at=1.0)


async def test_a_batch_applies_every_kind_of_write(store: Store) -> None:
    await store.queues.send("in", [OutgoingMessage(b"event")])
    [received] = await store.queues.receive("in", max_messages=1, visibility_timeout_s=60)
    old = await store.documents.put("old", b"x")
    batch = store.batch()
    first = batch.put("a", b"1")
    second = batch.put("old", b"2", if_match=old)
    batch.delete("gone")
    batch.send("out", [OutgoingMessage(b"task", id="t/1")])
    batch.ack("in", [received.receipt])
    batch.upsert(row("w"))
    etags = await batch.commit()
    assert (first, second) == (0, 1)
    assert (await store.documents.get("a")).etag == etags[0]  # type: ignore[union-attr]
    assert (await store.documents.get("old")).data == b"2"  # type: ignore[union-attr]
    [task] = await store.queues.receive("out", max_messages=5, visibility_timeout_s=60)
    assert task.body == b"task"
    assert (await store.queues.depth("in")).visible + (
        await store.queues.depth("in")
    ).invisible == 0
    assert await store.index.get("w") == row("w")


async def test_a_failed_condition_first_leaves_the_store_untouched(store: Store) -> None:
    current = await store.documents.put("state", b"v1")
    await store.documents.put("state", b"v2")  # someone else moved it on
    batch = store.batch()
    batch.put("state", b"mine", if_match=current)
    batch.put("history", b"h")
    batch.send("out", [OutgoingMessage(b"task")])
    batch.upsert(row("w"))
    with pytest.raises(ConflictError):
        await batch.commit()
    assert (await store.documents.get("state")).data == b"v2"  # type: ignore[union-attr]
    assert await store.documents.get("history") is None
    assert (await store.queues.depth("out")).visible == 0
    assert await store.index.get("w") is None


async def test_an_empty_batch_commits_nothing(store: Store) -> None:
    assert await store.batch().commit() == []


async def test_a_committed_batch_is_empty_again(store: Store) -> None:
    batch = store.batch()
    batch.put("a", b"1")
    await batch.commit()
    assert await batch.commit() == []
