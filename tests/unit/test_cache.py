"""The coordinator's working copies under their bound (:mod:`dagq.cache`): a state
its submit left unwritten (the coordinator's first commit writes it) is the only
copy, and no eviction takes it."""

from __future__ import annotations

from dagq.cache import Entry, WorkflowCache
from dagq.persistence import Stored
from dagq.plan import compile_plan, resolve_params
from dagq.state import RunState
from tests.helpers import definition

_DEFINITION = definition([{"name": "a"}])
_PLAN = compile_plan(_DEFINITION, resolve_params(_DEFINITION, {}))


def _entry(workflow_id: str, *, written: bool, owing: bool = False) -> Entry:
    entry = Entry(
        _PLAN,
        RunState(workflow_id, len(_PLAN.tasks), 1000.0),
        Stored("e" if written else "", absent=not written),
        "test",
        "",
    )
    entry.confirm_owed = owing
    return entry


def _cache(size: int) -> WorkflowCache:
    return WorkflowCache(size, due=lambda _: float("inf"))


def test_a_state_not_written_yet_is_never_evicted() -> None:
    cache = _cache(4)
    for i in range(12):  # as a step loads the new runs handed over while it was busy
        cache.add(f"new{i}", _entry(f"new{i}", written=False), active=True)
    assert len(cache) == 12  # over the bound until their commit writes them
    assert all(f"new{i}" in cache for i in range(12))
    assert _entry("x", written=False).owes()
    for i in range(12):  # committed: written now
        entry = cache.peek(f"new{i}")
        assert entry is not None
        entry.stored = Stored("e")
    for i in range(2):  # the next loads bring the cache back under its bound
        cache.add(f"next{i}", _entry(f"next{i}", written=True), active=True)
    assert len(cache) <= 4 and "next1" in cache


def test_written_states_make_room_owing_ones_last() -> None:
    cache = _cache(4)
    cache.add("owing", _entry("owing", written=True, owing=True), active=True)
    cache.add("new0", _entry("new0", written=False), active=True)
    cache.add("idle", _entry("idle", written=True), active=True)
    cache.add("new1", _entry("new1", written=False), active=True)
    cache.add("new2", _entry("new2", written=False), active=True)  # 5 > 4: trimmed to 3
    assert list(cache.ids()) == ["new0", "new1", "new2"]  # "idle" first, then "owing"
    assert cache.is_active("owing") and cache.is_active("idle")  # known, to be reloaded
