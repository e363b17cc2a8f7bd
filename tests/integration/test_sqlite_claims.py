"""A receive waiting on a queue is served by the commit that sends to it, in the same
transaction (``dagq.stores.sqlite_claims``); the writer waits out another
connection's lock in short pauses. Real sqlite files, a second store object (as
another process would be) to see what the file holds."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from dagq.errors import ConflictError
from dagq.stores.base import OutgoingMessage, Store
from dagq.stores.sqlite import open_sqlite_store

QUEUE = "jobs"
VT = 30.0


@pytest.fixture
async def stores(tmp_path: Path) -> AsyncIterator[tuple[Store, Store]]:
    """The store under test, and another on the same file that only looks."""
    mine = open_sqlite_store(tmp_path / "s.db")
    other = open_sqlite_store(tmp_path / "s.db")
    try:
        yield mine, other
    finally:
        await mine.close()
        await other.close()


async def _waiting(store: Store, *, most: int = 4) -> asyncio.Task[None]:
    """A receive that found the queue empty, then waits on it (as workers do)."""
    assert await store.queues.receive(QUEUE, max_messages=most, visibility_timeout_s=VT) == []
    waiter = asyncio.create_task(store.queues.wait(QUEUE, 60))
    await asyncio.sleep(0.05)  # the wait is under way
    return waiter


async def _send(store: Store, n: int = 1) -> None:
    batch = store.batch()
    batch.send(QUEUE, [OutgoingMessage(f"m{i}".encode()) for i in range(n)])
    await batch.commit()


async def test_a_waiting_receive_is_served_by_the_commit_that_sends(
    stores: tuple[Store, Store],
) -> None:
    mine, other = stores
    waiter = await _waiting(mine)
    await _send(mine)
    await asyncio.wait_for(waiter, 5)
    # Claimed in the commit: nobody else can receive it now, before ours asked again.
    assert await other.queues.receive(QUEUE, max_messages=4, visibility_timeout_s=VT) == []
    got = await mine.queues.receive(QUEUE, max_messages=4, visibility_timeout_s=VT)
    assert [(m.body, m.dequeue_count) for m in got] == [(b"m0", 1)]
    assert await mine.queues.delete(QUEUE, [got[0].receipt]) == 1  # a receipt like any other
    assert (await other.queues.depth(QUEUE)).visible == 0


async def test_a_claim_takes_no_more_than_the_waiting_receive_asked_for(
    stores: tuple[Store, Store],
) -> None:
    mine, other = stores
    waiter = await _waiting(mine, most=1)
    await _send(mine, 3)
    await asyncio.wait_for(waiter, 5)
    others = await other.queues.receive(QUEUE, max_messages=10, visibility_timeout_s=VT)
    assert sorted(m.body for m in others) == [b"m1", b"m2"]
    got = await mine.queues.receive(QUEUE, max_messages=1, visibility_timeout_s=VT)
    assert [m.body for m in got] == [b"m0"]


async def test_after_a_full_claim_the_next_wait_returns_at_once(
    stores: tuple[Store, Store],
) -> None:
    """The claim took all that was asked for: more may be in the file, so the
    receiver must look again rather than sleep through its poll."""
    mine, _ = stores
    waiter = await _waiting(mine, most=1)
    await _send(mine, 2)
    await asyncio.wait_for(waiter, 5)
    first = await mine.queues.receive(QUEUE, max_messages=1, visibility_timeout_s=VT)
    started = time.monotonic()
    await asyncio.wait_for(mine.queues.wait(QUEUE, 60), 5)
    assert time.monotonic() - started < 5
    second = await mine.queues.receive(QUEUE, max_messages=1, visibility_timeout_s=VT)
    assert [m.body for m in first + second] == [b"m0", b"m1"]


async def test_a_receive_that_stopped_waiting_is_not_claimed_for(
    stores: tuple[Store, Store],
) -> None:
    mine, other = stores
    waiter = await _waiting(mine)
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    await _send(mine)
    got = await other.queues.receive(QUEUE, max_messages=4, visibility_timeout_s=VT)
    assert [m.body for m in got] == [b"m0"]


async def test_a_failed_commit_claims_nothing(stores: tuple[Store, Store]) -> None:
    mine, other = stores
    waiter = await _waiting(mine)
    batch = mine.batch()
    batch.put("doc", b"x", if_match="not-its-etag")
    batch.send(QUEUE, [OutgoingMessage(b"lost")])
    with pytest.raises(ConflictError):
        await batch.commit()
    assert (await other.queues.depth(QUEUE)).visible == 0
    assert mine.queues.claims.take(QUEUE, 10) is None  # type: ignore[attr-defined]
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)


async def test_claimed_messages_nobody_took_come_back_when_the_store_closes(
    tmp_path: Path,
) -> None:
    mine = open_sqlite_store(tmp_path / "s.db")
    waiter = await _waiting(mine)
    await _send(mine)
    await asyncio.wait_for(waiter, 5)
    await mine.close()  # its receiver never took the claimed message
    other = open_sqlite_store(tmp_path / "s.db")
    try:
        got = await other.queues.receive(QUEUE, max_messages=4, visibility_timeout_s=VT)
        assert [m.body for m in got] == [b"m0"]
    finally:
        await other.close()


async def test_a_commit_waits_out_another_connections_lock(tmp_path: Path) -> None:
    """The writer's connection does not wait for locks itself: it tries again in
    short pauses until the other connection lets go (not an error)."""
    store = open_sqlite_store(tmp_path / "s.db")
    try:
        await store.queues.depth(QUEUE)  # the file and its tables exist
        held = threading.Event()
        hold_s = 0.3

        def hold() -> None:
            conn = sqlite3.connect(tmp_path / "s.db", isolation_level=None)
            try:
                conn.execute("BEGIN IMMEDIATE")
                held.set()
                time.sleep(hold_s)
                conn.execute("COMMIT")
            finally:
                conn.close()

        holder = threading.Thread(target=hold)
        holder.start()
        assert await asyncio.get_running_loop().run_in_executor(None, held.wait, 5)
        started = time.monotonic()
        await asyncio.wait_for(_send(store), 10)
        waited = time.monotonic() - started
        holder.join()
        assert waited >= hold_s / 2  # it did wait for the lock
        assert (await store.queues.depth(QUEUE)).visible == 1
    finally:
        await store.close()


async def test_a_chain_in_one_process_never_waits_for_a_poll(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Coordinator and worker on one store object (as in ``dagq run``), every poll and
    sweep 30 s away: each step is carried by wake-ups and claims alone, so a lost one
    would stall the chain far past the test's patience."""
    import dagq.coordinator as coordinator_module
    import dagq.worker as worker_module
    from dagq.coordinator import Coordinator, CoordinatorOptions
    from dagq.persistence import read_state
    from dagq.submission import submit
    from dagq.worker import Worker, WorkerOptions
    from tests.helpers import definition

    for module in (coordinator_module, worker_module):
        monkeypatch.setattr(module, "_WOKEN_FIRST_POLL_S", 30.0)
    steps = 30
    tasks = [{"name": "t0", "call": "tests.sample_tasks:echo"}] + [
        {"name": f"t{i}", "call": "tests.sample_tasks:echo", "depends_on": [f"t{i - 1}"]}
        for i in range(1, steps)
    ]
    store = open_sqlite_store(tmp_path / "s.db")
    stop = asyncio.Event()
    coord = Coordinator(store, CoordinatorOptions(poll_interval_s=30, sweep_interval_s=30))
    worker = Worker(store, WorkerOptions(isolation="thread", poll_interval_s=30))
    try:
        submitted = await submit(store, definition(tasks), workflow_id="chain")
        running = [asyncio.create_task(coord.run(stop)), asyncio.create_task(worker.run(stop))]
        began = time.monotonic()
        while coord.stats.finished_workflows == 0:
            assert time.monotonic() - began < 20, f"stalled after {coord.stats.dispatched} steps"
            await asyncio.sleep(0.02)
        found = await read_state(store, "chain", submitted.plan)
        assert found is not None and found[0].status == "completed"
    finally:
        stop.set()
        await asyncio.gather(*running, return_exceptions=True)
        await store.close()


async def test_claimed_messages_a_smaller_receive_leaves_go_back_to_the_queue(
    stores: tuple[Store, Store],
) -> None:
    """The claim asks what the last receive asked (4); the next receive wants fewer (a
    worker's slots filled meanwhile) and may not receive again for as long as its
    tasks run: what it leaves is visible to others at once, not hidden in this store
    object until its visibility runs out, and not counted as delivered."""
    mine, other = stores
    waiter = await _waiting(mine, most=4)
    await _send(mine, 3)
    await asyncio.wait_for(waiter, 5)
    got = await mine.queues.receive(QUEUE, max_messages=1, visibility_timeout_s=VT)
    assert [m.body for m in got] == [b"m0"]
    others = await other.queues.receive(QUEUE, max_messages=10, visibility_timeout_s=VT)
    assert sorted((m.body, m.dequeue_count) for m in others) == [(b"m1", 1), (b"m2", 1)]


async def test_a_claimed_message_near_its_timeout_is_received_again_at_once(
    tmp_path: Path,
) -> None:
    """A claim kept past half its visibility timeout is not handed out (it may time
    out in the receiver's hands); the receive finds it in the store, visible again,
    and its delivery counted once — not hidden until the timeout ends."""
    mine = open_sqlite_store(tmp_path / "s.db")
    short = 0.6
    try:
        assert await mine.queues.receive(QUEUE, max_messages=1, visibility_timeout_s=short) == []
        waiter = asyncio.create_task(mine.queues.wait(QUEUE, 60))
        await asyncio.sleep(0.05)  # the wait is under way
        await _send(mine)
        await asyncio.wait_for(waiter, 5)
        await asyncio.sleep(short / 2)  # the claim is kept past half its timeout
        got = await mine.queues.receive(QUEUE, max_messages=1, visibility_timeout_s=VT)
        assert [(m.body, m.dequeue_count) for m in got] == [(b"m0", 1)]
    finally:
        await mine.close()


async def test_a_claim_its_receiver_does_not_come_for_goes_back_with_the_next_commit(
    stores: tuple[Store, Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker waiting on two queues is claimed for on both; it takes from one, its
    slots fill, and it does not receive from the other for as long as its tasks run.
    The next commit of its store makes what it left there visible to others (a
    delivery not counted), not hidden until the visibility timeout ends."""
    from dagq.stores import sqlite_claims

    monkeypatch.setattr(sqlite_claims, "KEEP_S", 0.2)
    mine, other = stores
    for queue in ("a", "b"):
        assert await mine.queues.receive(queue, max_messages=1, visibility_timeout_s=VT) == []
    waiters = [asyncio.create_task(mine.queues.wait(q, 60)) for q in ("a", "b")]
    await asyncio.sleep(0.05)  # the waits are under way
    batch = mine.batch()
    batch.send("a", [OutgoingMessage(b"for a")])
    batch.send("b", [OutgoingMessage(b"for b")])
    await batch.commit()
    await asyncio.wait_for(asyncio.gather(*waiters), 5)
    got = await mine.queues.receive("a", max_messages=1, visibility_timeout_s=VT)
    assert [m.body for m in got] == [b"for a"]
    assert await other.queues.receive("b", max_messages=1, visibility_timeout_s=VT) == []
    await asyncio.sleep(0.3)  # past the claim's time
    await mine.queues.delete("a", [got[0].receipt])  # some later write of this store
    batch = mine.batch()
    batch.put("doc", b"x")
    await batch.commit()
    found = await other.queues.receive("b", max_messages=1, visibility_timeout_s=VT)
    assert [(m.body, m.dequeue_count) for m in found] == [(b"for b", 1)]
