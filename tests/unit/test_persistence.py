"""Runtime states in the store: inline for small workflows, base + deltas for large ones."""

from __future__ import annotations

import asyncio
import threading
import zlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st_

from dagq import keys, persistence, snapshots
from dagq.errors import ConflictError, DamagedData
from dagq.group import Group
from dagq.messages import SubmitRequested, TaskFinished
from dagq.persistence import INLINE_TASKS, MAX_DELTAS, create_state, read_state, write_state
from dagq.state import RunState, TaskStatus, dispatch_key, dispatch_parts
from dagq.stores.base import Store
from dagq.stores.intercepting import intercepted
from dagq.stores.memory import open_memory_store
from dagq.stores.sqlite import open_sqlite_store
from tests.helpers import Sim


def wide(n: int) -> Sim:
    sim = Sim([{"name": "root"}] + [{"name": f"t{i}", "depends_on": ["root"]} for i in range(n)])
    sim.apply(SubmitRequested(workflow_id="wf-1"))
    return sim


def finish(sim: Sim, name: str, output: object = None) -> None:
    i = sim.index(name)
    sim.apply(
        TaskFinished(
            workflow_id="wf-1",
            task=i,
            attempt=sim.state.attempt[i],
            at=sim.now,
            ok=True,
            output=output,
        )
    )


@pytest.fixture
def store() -> Store:
    return open_memory_store()


async def parts(store: Store) -> list[str]:
    return await store.documents.list(keys.state_parts_prefix("wf-1"))


async def test_small_workflow_state_is_one_document(store: Store) -> None:
    sim = wide(10)
    stored = persistence.Stored(await create_state(store, sim.state))
    finish(sim, "root", {"n": 1})
    await write_state(store, sim.state, stored)
    assert await parts(store) == []
    loaded, _ = await read_state(store, "wf-1", sim.plan)  # type: ignore[misc]
    assert loaded.outputs == {0: {"n": 1}}


def test_small_task_columns_are_stored_as_they_are_and_compressed_ones_still_read() -> None:
    small, larger = wide(4), wide(60)
    for sim in (small, larger):
        finish(sim, "root", {"n": 1})
    raw = snapshots.encode_tasks(small.state)
    assert raw == msgspec.msgpack.encode(snapshots.copy_tasks(small.state))  # no zlib call
    packed = snapshots.encode_tasks(larger.state)
    assert len(msgspec.msgpack.encode(snapshots.copy_tasks(larger.state))) > snapshots.RAW_BYTES
    assert zlib.decompress(packed)  # over RAW_BYTES: compressed, as before
    # Small columns written compressed (as every version before did) read the same.
    before = zlib.compress(raw)
    for data, sim in ((raw, small), (before, small), (packed, larger)):
        head = snapshots.header(sim.state, inline=data)
        loaded = snapshots.decode(snapshots.encode_header(head), sim.plan)
        assert bytes(loaded.task_status) == bytes(sim.state.task_status)
        assert loaded.outputs == sim.state.outputs
    delta = snapshots.encode_delta(small.state, [0])
    assert snapshots.delta_tasks(delta) == snapshots.delta_tasks(zlib.compress(delta)) == [0]
    # So the unconfirmed dispatches a header lists: a few as they are, many compressed.
    for tasks in ({3}, {3, 7}, set(range(1000))):
        small.state.unconfirmed = {dispatch_key(i) for i in tasks}
        head = snapshots.decode_header(snapshots.encode_header(snapshots.header(small.state)))
        assert head.unconfirmed is not None
        assert snapshots.empty_state(head).unconfirmed == small.state.unconfirmed
        if len(tasks) > snapshots.RAW_BYTES // 4:  # over RAW_BYTES: compressed
            assert zlib.decompress(head.unconfirmed.tasks)
    older = msgspec.structs.replace(head.unconfirmed, tasks=zlib.compress(bytes([3, 0, 0, 0])))
    assert snapshots.empty_state(msgspec.structs.replace(head, unconfirmed=older)).unconfirmed == {
        dispatch_key(3)
    }


async def flush(store: Store, sim: Sim, stored: persistence.Stored) -> persistence.Stored:
    """A flush that comes after any fold begun has finished encoding (a slow coordinator)."""
    if stored.folding is not None:
        await stored.folding.data
    return await write_state(store, sim.state, stored)


async def test_large_workflow_writes_deltas_of_only_what_changed(store: Store) -> None:
    sim = wide(INLINE_TASKS + 500)
    await create_state(store, sim.state)  # a large state starts with a base
    _, stored = await read_state(store, "wf-1", sim.plan)  # type: ignore[misc]
    assert stored.base is not None and stored.deltas == []
    finish(sim, "root")  # dispatches every task: a delta as large as the base...
    stored = await write_state(store, sim.state, stored)
    assert stored.folding is not None  # ...so a new base is being encoded, off the loop
    stored = await flush(store, sim, stored)  # ...and the next flush stages it
    assert stored.deltas == [] and stored.folding is None
    for i in range(3):
        finish(sim, f"t{i}", {"i": i})
        stored = await write_state(store, sim.state, stored)
    assert len(stored.deltas) == 3
    for i, key in enumerate(stored.deltas):
        doc = await store.documents.get(key)
        assert doc is not None
        assert snapshots.delta_tasks(doc.data) == [sim.index(f"t{i}")]
    loaded, again = await read_state(store, "wf-1", sim.plan)  # type: ignore[misc]
    assert again.deltas == stored.deltas
    assert loaded.outputs == sim.state.outputs
    assert bytes(loaded.task_status) == bytes(sim.state.task_status)
    assert list(loaded.dispatched_at) == list(sim.state.dispatched_at)


async def test_flushes_go_on_writing_deltas_while_a_new_base_is_encoded(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()
    encode = snapshots.encode_copy

    def slow_encode(columns: Any) -> bytes:
        release.wait(30)
        return encode(columns)

    sim = wide(INLINE_TASKS + 10)
    await create_state(store, sim.state)
    _, stored = await read_state(store, "wf-1", sim.plan)  # type: ignore[misc]
    monkeypatch.setattr(snapshots, "encode_copy", slow_encode)
    finish(sim, "root")  # a delta as large as the base: a fold begins
    stored = await write_state(store, sim.state, stored)
    folding = stored.folding
    assert folding is not None and folding.upto == 1
    for i in range(5):  # the encoding is slow: flushes are not held up by it
        finish(sim, f"t{i}")
        stored = await write_state(store, sim.state, stored)
    assert len(stored.deltas) == 6 and stored.folding is folding
    release.set()
    await folding.data
    finish(sim, "t5")
    stored = await write_state(store, sim.state, stored)
    # The new base holds the first delta; the five written meanwhile and this one follow.
    assert stored.base == folding.key and len(stored.deltas) == 6
    loaded, _ = await read_state(store, "wf-1", sim.plan)  # type: ignore[misc]
    assert bytes(loaded.task_status) == bytes(sim.state.task_status)
    assert loaded.counts == sim.state.counts


async def test_a_fold_keeps_the_previous_generation_and_deletes_older_ones(store: Store) -> None:
    sim = wide(INLINE_TASKS + 10)
    await create_state(store, sim.state)
    _, stored = await read_state(store, "wf-1", sim.plan)  # type: ignore[misc]
    finish(sim, "root")
    generations = [stored.parts()]
    for i in range(3 * MAX_DELTAS):
        finish(sim, f"t{i}")
        before = stored
        stored = await flush(store, sim, stored)
        if stored.base != before.base:
            generations.append(stored.parts())
            # Readers may follow the header before: everything it named is still there.
            assert set(await parts(store)) == stored.parts() | before.parts()
    assert len(generations) >= 3
    assert not generations[0] & set(await parts(store))
    loaded, _ = await read_state(store, "wf-1", sim.plan)  # type: ignore[misc]
    assert loaded.counts == sim.state.counts


async def test_a_stale_writer_conflicts_and_its_delta_is_cleaned_up_later(store: Store) -> None:
    sim = wide(INLINE_TASKS + 10)
    await create_state(store, sim.state)
    _, stored = await read_state(store, "wf-1", sim.plan)  # type: ignore[misc]
    finish(sim, "root")
    await write_state(store, sim.state, stored)
    finish(sim, "t0")
    with pytest.raises(ConflictError):
        await write_state(store, sim.state, stored)  # stored is the old version
    current = (await read_state(store, "wf-1", sim.plan))[1]  # type: ignore[index]
    orphans = set(await parts(store)) - {current.base, *current.deltas}
    assert len(orphans) == 1
    for i in range(1, MAX_DELTAS + 2):
        finish(sim, f"t{i}")
        current = await flush(store, sim, current)
    assert not orphans & set(await parts(store))


def test_unconfirmed_dispatches_survive_the_header_and_older_headers_say_unknown() -> None:
    st = RunState("w", 10, 1.0)
    st.unconfirmed = {
        dispatch_key(1),
        dispatch_key(2, 3),
        dispatch_key(2, 0),
        dispatch_key(4, undo=True),
    }
    head = snapshots.decode_header(snapshots.encode_header(snapshots.header(st)))
    assert snapshots.empty_state(head).unconfirmed == st.unconfirmed
    older = msgspec.structs.replace(head, unconfirmed=None)  # written before it was kept
    assert snapshots.empty_state(older).unconfirmed is None
    fresh = snapshots.decode_header(
        snapshots.encode_header(snapshots.header(RunState("v", 3, 1.0)))
    )
    assert snapshots.empty_state(fresh).unconfirmed == set()


# --- readers and folds ----------------------------------------------------------------


@pytest.fixture(params=["memory", "sqlite"])
async def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    if request.param == "memory":
        yield open_memory_store()
        return
    store = open_sqlite_store(tmp_path / "store.db")
    yield store
    await store.close()


class PausedReader:
    """A view of a store whose reader stops after the header, before the parts, until
    released; it counts the header reads."""

    def __init__(self, store: Store) -> None:
        self.reached = asyncio.Event()
        self.release = asyncio.Event()
        self.header_reads = 0
        self.store = intercepted(store, self._hook)

    async def _hook(self, operation: str, args: tuple[Any, ...], call: Any) -> Any:
        if operation == "documents.get" and args[0] == keys.state("wf-1"):
            self.header_reads += 1
        elif operation == "documents.get" and not self.reached.is_set():
            self.reached.set()
            await self.release.wait()
        return await call()


async def fold(store: Store, sim: Sim, stored: persistence.Stored) -> persistence.Stored:
    """Flush until the state has a new base (the coordinator compacting once)."""
    base = stored.base
    for i in range(INLINE_TASKS):
        if stored.base != base:
            return stored
        if sim.state.task_status[sim.index(f"t{i}")] != TaskStatus.COMPLETED:
            finish(sim, f"t{i}")
        stored = await flush(store, sim, stored)
    raise AssertionError("no fold")


async def started_large(store: Store) -> tuple[Sim, persistence.Stored]:
    sim = wide(INLINE_TASKS + 10)
    await create_state(store, sim.state)
    _, stored = await read_state(store, "wf-1", sim.plan)  # type: ignore[misc]
    finish(sim, "root")
    return sim, await write_state(store, sim.state, stored)


async def test_a_reader_of_the_header_before_a_fold_still_finds_its_parts(
    any_store: Store,
) -> None:
    sim, stored = await started_large(any_store)
    reader = PausedReader(any_store)
    reading = asyncio.create_task(read_state(reader.store, "wf-1", sim.plan))
    await asyncio.wait_for(reader.reached.wait(), 10)  # the header read, the parts not yet
    stored = await fold(any_store, sim, stored)
    reader.release.set()
    found = await asyncio.wait_for(reading, 10)
    assert found is not None and reader.header_reads == 1  # no retry was needed


async def test_a_reader_slower_than_two_folds_follows_the_new_header(any_store: Store) -> None:
    sim, stored = await started_large(any_store)
    reader = PausedReader(any_store)
    reading = asyncio.create_task(read_state(reader.store, "wf-1", sim.plan))
    await asyncio.wait_for(reader.reached.wait(), 10)
    stored = await fold(any_store, sim, stored)
    stored = await fold(any_store, sim, stored)
    reader.release.set()
    found = await asyncio.wait_for(reading, 10)
    assert found is not None and reader.header_reads == 2
    state, where = found
    assert where.etag == stored.etag
    assert bytes(state.task_status) == bytes(sim.state.task_status)
    assert state.counts == sim.state.counts


async def test_a_part_missing_under_the_current_header_is_damage(any_store: Store) -> None:
    sim, stored = await started_large(any_store)
    assert stored.base is not None
    await any_store.documents.delete(stored.base)
    with pytest.raises(DamagedData, match=r"state of wf-1 is damaged: .*base-.* is missing"):
        await read_state(any_store, "wf-1", sim.plan)


@given(
    task=st_.integers(0, 2**31),
    item=st_.integers(-1, 2**32 - 2),
    undo=st_.booleans(),
)
def test_a_dispatch_key_gives_back_its_task_item_and_undo(task: int, item: int, undo: bool) -> None:
    assert dispatch_parts(dispatch_key(task, item, undo)) == (task, item, undo)


async def test_an_inline_state_is_compressed_only_once_its_run_has_ended(store: Store) -> None:
    sim = wide(200)  # columns well over RAW_BYTES, but inline
    stored = persistence.Stored(await create_state(store, sim.state))
    finish(sim, "root", 1)
    stored = await write_state(store, sim.state, stored)
    doc = await store.documents.get(keys.state("wf-1"))
    assert doc is not None
    running = snapshots.decode_header(doc.data).inline
    assert running is not None and len(running) > snapshots.RAW_BYTES
    assert running == msgspec.msgpack.encode(snapshots.copy_tasks(sim.state))  # no zlib
    for i in range(200):
        finish(sim, f"t{i}", i)
    assert sim.state.status == "completed"
    await write_state(store, sim.state, stored)
    doc = await store.documents.get(keys.state("wf-1"))
    assert doc is not None
    ended = snapshots.decode_header(doc.data).inline
    assert ended is not None and zlib.decompress(ended)  # at rest: compressed
    loaded, _ = await read_state(store, "wf-1", sim.plan)  # type: ignore[misc]
    assert loaded.outputs == sim.state.outputs and loaded.status == "completed"


def test_a_large_base_takes_more_deltas_before_a_fold_up_to_a_bound() -> None:
    small = persistence.Stored("e", "base", ["d"] * MAX_DELTAS, 100_000, 1_000)
    assert persistence._compact(small)  # a small base folds after MAX_DELTAS, as before
    large = persistence.Stored("e", "base", ["d"] * MAX_DELTAS, 5_000_000, 40_000)
    assert not persistence._compact(large)  # its fold would cost 50 times as much
    at_limit = persistence.delta_limit(large.base_bytes)
    assert MAX_DELTAS < at_limit <= persistence.DELTA_LIMIT
    assert persistence._compact(msgspec.structs.replace(large, deltas=["d"] * at_limit))
    outweighed = msgspec.structs.replace(large, delta_bytes=large.base_bytes + 1)
    assert persistence._compact(outweighed)  # deltas heavier than the base: fold now
    assert persistence.delta_limit(10**12) == persistence.DELTA_LIMIT
    assert persistence.most_deltas(10**12) == 2 * persistence.DELTA_LIMIT


def test_deltas_of_foreach_instances_replayed_then_recounted_once_read_the_same() -> None:
    st = RunState("w", 2, 1.0)
    st.groups[1] = Group(10, None, "ref")
    base = snapshots.encode_tasks(st)
    deltas = []
    for k, status in ((0, TaskStatus.READY), (1, TaskStatus.RUNNING), (0, TaskStatus.COMPLETED)):
        st.groups[1].status[k] = status
        st.groups[1].outputs[k] = k
        deltas.append(snapshots.encode_delta(st, [], changed_items={1: {k}}))
    st.groups[1].recount()
    for recount in (True, False):
        loaded = RunState("w", 2, 1.0)
        snapshots.load_tasks(loaded, base)
        for delta in deltas:
            snapshots.apply_delta(loaded, delta, recount=recount)
        group = loaded.groups[1]
        if not recount:
            assert (group.sent, group.settled, len(group.unsent)) == (0, 0, 10)  # as loaded
            group.recount()
        want = st.groups[1]
        assert (group.sent, group.settled, list(group.unsent)) == (1, 1, list(want.unsent))
        assert bytes(group.status) == bytes(want.status) and group.outputs == want.outputs
