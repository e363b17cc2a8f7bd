"""A large foreach group is stored by chunks, each re-encoded only once its instances changed."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from dagq import group as groups
from dagq import persistence, snapshots
from dagq.group import Group, decode_group, encode_group, is_chunked
from dagq.state import RunState, TaskStatus
from dagq.stores.memory import open_memory_store

N = 1000
SIZE = 64  # chunks of 64 instances: 16 chunks, the last one of 40


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(groups, "CHUNK", SIZE)


def running_foreach(n: int = N) -> RunState:
    """A workflow whose foreach task (index 1) runs ``n`` instances, the first third done."""
    st = RunState("wf-1", 3, 1000.0)
    st.groups[1] = group = Group(n, None, "items")
    st.touch_group(1)
    for k in range(n // 3):
        finish(st, k, output=k % 7)
    group.errors[5] = "boom"
    group.output_refs[7] = "outputs/7"
    group.retry_base[9] = 1
    group.recount()
    return st


def finish(st: RunState, k: int, output: Any = 2) -> None:
    group = st.groups[1]
    group.status[k] = TaskStatus.COMPLETED
    group.attempt[k] += 1
    group.dispatched_at[k], group.started_at[k], group.finished_at[k] = 1.0 + k, 2.0 + k, 3.0 + k
    group.outputs[k] = output
    st.touch_item(1, k)


def same(a: Group, b: Group) -> bool:
    b.recount()  # what finish() left to do
    names = [n for n in Group.__slots__ if n not in ("encoded", "unsent")]
    return all(getattr(a, n) == getattr(b, n) for n in names) and list(a.unsent) == list(b.unsent)


def fresh(group: Group) -> bytes:
    """The group encoded with no chunk kept (what it holds is left as it was)."""
    kept = group.encoded
    group.encoded = {}
    try:
        return encode_group(group)
    finally:
        group.encoded = kept


class Counting:
    """Counts the chunks encoded."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.chunks: list[int] = []
        inner = groups._encode_chunk

        def spy(group: Group, lo: int, hi: int) -> bytes:
            self.chunks.append(lo // SIZE)
            return inner(group, lo, hi)

        monkeypatch.setattr(groups, "_encode_chunk", spy)


def test_a_large_group_reads_back_the_same_from_its_chunks() -> None:
    st = running_foreach()
    group = st.groups[1]
    assert is_chunked(group)
    back = decode_group(encode_group(group))
    assert same(back, group)
    assert (back.sent, back.settled) == (group.sent, group.settled)
    assert not is_chunked(Group(SIZE, None, "items"))  # up to a chunk: one record, as before


def test_only_the_chunks_whose_instances_changed_are_encoded_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    st = running_foreach()
    group = st.groups[1]
    counting = Counting(monkeypatch)
    first = encode_group(group)
    assert sorted(counting.chunks) == list(range(16))
    counting.chunks.clear()
    assert encode_group(group) == first and counting.chunks == []
    for k in (400, 401, 900):
        finish(st, k)
    again = encode_group(group)
    assert sorted(counting.chunks) == [400 // SIZE, 900 // SIZE]
    assert again == fresh(group) != first


def test_a_group_changed_as_a_whole_is_encoded_again_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    st = running_foreach()
    group = st.groups[1]
    encode_group(group)
    counting = Counting(monkeypatch)
    for k in group.pending():  # a cancel: every instance not sent yet is cancelled
        group.settle(k, TaskStatus.CANCELLED)
    st.touch_group(1)
    again = encode_group(group)
    assert sorted(counting.chunks) == list(range(16))
    assert again == fresh(group)


def test_a_read_group_keeps_its_chunks_and_a_replayed_delta_drops_those_it_touches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    st = running_foreach()
    base = snapshots.encode_tasks(st)
    for k in (500, 501):
        finish(st, k)
    delta = snapshots.encode_delta(st, [], changed_items={1: {500, 501}})
    loaded = RunState("wf-1", 3, 1000.0)
    snapshots.load_tasks(loaded, base)
    snapshots.apply_delta(loaded, delta)
    counting = Counting(monkeypatch)
    again = encode_group(loaded.groups[1])
    assert counting.chunks == [500 // SIZE]  # the read chunks were kept, but that one
    assert again == fresh(st.groups[1])


def test_a_group_stored_whole_by_earlier_code_reads_and_is_stored_by_chunks_next() -> None:
    st = running_foreach()
    group = st.groups[1]
    earlier = decode_group(encode_group(group))
    earlier.chunk, earlier.encoded = N, {}  # one record, as code before chunks stored it
    whole = encode_group(earlier)
    assert not groups.precompressed(whole)
    back = decode_group(whole)
    assert same(back, group) and back.encoded == {} and back.chunk == SIZE
    assert decode_group(encode_group(back)).encoded.keys() == set(range(16))


def test_the_header_of_a_state_with_a_chunked_group_says_so() -> None:
    st = running_foreach()
    assert snapshots.header(st).version == snapshots.CHUNKED_VERSION
    small = running_foreach(SIZE)
    assert snapshots.header(small).version == snapshots.FORMAT_VERSION == 3
    unknown = msgspec.structs.replace(snapshots.header(st), version=5)
    with pytest.raises(ValueError, match="format 5 is not supported"):
        snapshots.decode_header(snapshots.encode_header(unknown))


def test_a_base_of_chunks_is_not_compressed_again() -> None:
    st = running_foreach(20 * N)
    data = snapshots.encode_tasks(st)
    assert snapshots._unpacked(data) == data  # stored as it is: its chunks are compressed
    loaded = RunState("wf-1", 3, 1000.0)
    snapshots.load_tasks(loaded, data)
    assert same(loaded.groups[1], st.groups[1])


async def test_flushes_and_folds_of_a_chunked_group_read_back_the_same() -> None:
    store = open_memory_store()
    st = running_foreach(3 * persistence.INLINE_TASKS)
    await persistence.create_state(store, st)
    found = await persistence.read_state(store, "wf-1", _plan())
    assert found is not None
    stored, folds = found[1], 0
    for k in range(st.groups[1].n // 3, st.groups[1].n // 3 + 3 * persistence.MAX_DELTAS):
        finish(st, k)
        if stored.folding is not None:
            await stored.folding.data
        before = stored.base
        stored = await persistence.write_state(store, st, stored)
        folds += stored.base != before
    assert folds >= 2
    found = await persistence.read_state(store, "wf-1", _plan())
    assert found is not None
    assert same(found[0].groups[1], st.groups[1])


def _plan() -> Any:
    from tests.helpers import Sim

    sim = Sim(
        [
            {"name": "root"},
            {"name": "fan", "depends_on": ["root"], "foreach": "inputs.root"},
            {"name": "join", "depends_on": ["fan"]},
        ]
    )
    return sim.plan
