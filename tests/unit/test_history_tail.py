"""A run's last history chunks live in its state document (no write of their own);
past the tail's bounds they spill, in order, to documents of their own, and readers
see one history either way (memory store, fake clock, a real coordinator)."""

from __future__ import annotations

import pytest

from dagq import keys
from dagq.client import Client
from dagq.coordinator import Coordinator, CoordinatorOptions
from dagq.history import (
    TAIL_BYTES,
    TAIL_CHUNKS,
    HistoryEntry,
    read_chunks,
    read_history,
    stage_chunk,
)
from dagq.persistence import read_state, stage_state
from dagq.stores.base import Store
from dagq.stores.changes import batch_topics, topic_of
from dagq.stores.memory import open_memory_store
from tests.conformance.conftest import FakeClock
from tests.helpers import definition
from tests.unit.test_containment import drive

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(clock: FakeClock) -> Store:
    return open_memory_store(clock=clock)


def chain(n: int) -> object:
    tasks = [{"name": "t0"}] + [{"name": f"t{i}", "depends_on": [f"t{i - 1}"]} for i in range(1, n)]
    return definition(tasks)


async def run(store: Store, clock: FakeClock, n: int) -> None:
    await Client(store).submit(chain(n), workflow_id="w")  # type: ignore[arg-type]
    coord = Coordinator(store, CoordinatorOptions(), clock=clock)
    await drive(coord, store, clock, rounds=n + 3)
    assert (await Client(store).status("w")).status == "completed"


async def test_a_small_runs_history_is_kept_in_its_state_document(
    store: Store, clock: FakeClock
) -> None:
    await run(store, clock, 3)
    assert await store.documents.list(keys.history_prefix("w")) == []
    kinds = [entry.kind for entry in await read_history(store, "w")]
    assert kinds[0] == "submitted" and kinds[-1] == "workflow_completed", kinds
    assert kinds.count("completed") == 3, kinds


async def test_a_long_runs_history_spills_to_documents_and_reads_as_one(
    store: Store, clock: FakeClock
) -> None:
    n = 3 * TAIL_CHUNKS
    await run(store, clock, n)
    spilled = await store.documents.list(keys.history_prefix("w"))
    assert len(spilled) >= TAIL_CHUNKS
    chunks = await read_chunks(store, "w")
    seqs = [seq for seq, _ in chunks]
    assert seqs == list(range(len(seqs))) and len(seqs) > len(spilled)  # the rest: inline
    kinds = [entry.kind for _, entries in chunks for entry in entries]
    assert kinds.count("completed") == n and kinds[-1] == "workflow_completed"
    for after in (0, len(spilled) - 1, len(spilled), len(seqs) - 1):  # across the boundary
        later = await read_chunks(store, "w", after=after)
        assert [seq for seq, _ in later] == seqs[after + 1 :]


def test_a_state_write_wakes_the_readers_of_its_history() -> None:
    topics = batch_topics([keys.state("w"), keys.definition("v")], 0)
    assert topic_of(keys.history("w", 0)) in topics
    assert topic_of(keys.history("v", 0)) not in topics


async def test_a_chunk_in_the_state_outranks_a_document_an_unfinished_spill_left(
    store: Store, clock: FakeClock
) -> None:
    """On a store without transactions (Azure) a spill's documents can be written and
    its state not (a throttled put, a crash, a fenced holder): the flush is applied again,
    and a smaller chunk fits the tail. The state is the commit point: its chunk is the
    one at that sequence number, not the document the failed flush left."""
    await Client(store).submit(chain(3), workflow_id="w")  # type: ignore[arg-type]
    coord = Coordinator(store, CoordinatorOptions(), clock=clock)
    await drive(coord, store, clock, rounds=6)
    plan = coord.plan_of("w")
    assert plan is not None
    found = await read_state(store, "w", plan)
    assert found is not None
    st, _ = found
    seq = st.history_seq
    big = [HistoryEntry(at=clock(), kind="note", detail="x" * TAIL_BYTES)]
    cut_short = store.batch()
    stage_chunk(cut_short, st, big)  # spills: the tail and this chunk to documents...
    assert cut_short.ops
    await cut_short.commit()  # ...and its state is never written
    found = await read_state(store, "w", plan)
    assert found is not None
    st, stored = found
    small = [HistoryEntry(at=clock(), kind="note", detail="applied again")]
    again = store.batch()
    stage_chunk(again, st, small)  # fits the tail this time
    stage_state(again, st, stored)
    await again.commit()
    chunks = await read_chunks(store, "w")
    assert [s for s, _ in chunks] == list(range(seq + 1))
    assert chunks[-1] == (seq, small)
    assert all(e.detail != big[0].detail for e in await read_history(store, "w"))


async def test_a_state_document_that_cannot_be_decompressed_hides_no_spilled_chunk(
    store: Store, clock: FakeClock
) -> None:
    await run(store, clock, 3 * TAIL_CHUNKS)
    spilled = await store.documents.list(keys.history_prefix("w"))
    assert spilled
    await store.documents.put(keys.state("w"), b"z not zlib")  # zlib.error, not ValueError
    chunks = await read_chunks(store, "w")
    assert [seq for seq, _ in chunks] == list(range(len(spilled)))
