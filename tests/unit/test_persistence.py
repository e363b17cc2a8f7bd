"""Runtime states in the store: inline for small workflows, base + deltas for large ones."""

from __future__ import annotations

import msgspec
import pytest

from dagq import keys, persistence, snapshots
from dagq.errors import ConflictError
from dagq.messages import SubmitRequested, TaskFinished
from dagq.persistence import INLINE_TASKS, MAX_DELTAS, create_state, read_state, write_state
from dagq.state import RunState
from dagq.stores.base import Store
from dagq.stores.memory import open_memory_store
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


async def test_large_workflow_writes_deltas_of_only_what_changed(store: Store) -> None:
    sim = wide(INLINE_TASKS + 500)
    stored = persistence.Stored(await create_state(store, sim.state))
    stored = await write_state(store, sim.state, stored)  # the first flush writes a base
    assert stored.base is not None and stored.deltas == []
    finish(sim, "root")  # dispatches every task: a delta as large as the base...
    stored = await write_state(store, sim.state, stored)
    stored = await write_state(store, sim.state, stored)  # ...so the next flush folds it in
    assert stored.deltas == []
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


async def test_deltas_are_folded_into_a_new_base_and_old_parts_deleted(store: Store) -> None:
    sim = wide(INLINE_TASKS + 10)
    stored = await write_state(
        store, sim.state, persistence.Stored(await create_state(store, sim.state))
    )
    first_base = stored.base
    finish(sim, "root")
    for i in range(MAX_DELTAS + 1):
        finish(sim, f"t{i}")
        stored = await write_state(store, sim.state, stored)
    assert stored.base != first_base
    assert sorted(await parts(store)) == sorted([stored.base, *stored.deltas])
    loaded, _ = await read_state(store, "wf-1", sim.plan)  # type: ignore[misc]
    assert loaded.counts == sim.state.counts


async def test_a_stale_writer_conflicts_and_its_delta_is_cleaned_up_later(store: Store) -> None:
    sim = wide(INLINE_TASKS + 10)
    stored = await write_state(
        store, sim.state, persistence.Stored(await create_state(store, sim.state))
    )
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
        current = await write_state(store, sim.state, current)
    assert not orphans & set(await parts(store))


def test_unconfirmed_dispatches_survive_the_header_and_older_headers_say_unknown() -> None:
    st = RunState("w", 10, 1.0)
    st.unconfirmed = {(1, -1, False), (2, 3, False), (2, 0, False), (4, -1, True)}
    head = snapshots.decode_header(snapshots.encode_header(snapshots.header(st)))
    assert snapshots.empty_state(head).unconfirmed == st.unconfirmed
    older = msgspec.structs.replace(head, unconfirmed=None)  # written before it was kept
    assert snapshots.empty_state(older).unconfirmed is None
    fresh = snapshots.decode_header(
        snapshots.encode_header(snapshots.header(RunState("v", 3, 1.0)))
    )
    assert snapshots.empty_state(fresh).unconfirmed == set()
