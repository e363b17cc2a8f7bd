"""The coordinator's memory is bounded, a store error drops only what it touched, and a
purged workflow is forgotten (memory store, fake clock)."""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import msgspec
import pytest

from dagq import keys
from dagq.coordinator import Coordinator, CoordinatorOptions
from dagq.errors import StoreUnavailable
from dagq.maintenance import purge
from dagq.messages import TaskStarted
from dagq.stores.base import Store
from dagq.stores.memory import open_memory_store
from dagq.submission import submit
from tests.conformance.conftest import FakeClock
from tests.helpers import definition
from tests.unit.test_containment import post, status, work

pytestmark = pytest.mark.timeout(60)


class CountingGets:
    """Counts document reads by key prefix."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.gets: Counter[str] = Counter()

    async def get(self, key: str) -> Any:
        self.gets[key.split("/", maxsplit=1)[0]] += 1
        return await self.inner.get(key)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(clock: FakeClock) -> Store:
    store = open_memory_store(clock=clock)
    store.documents = CountingGets(store.documents)
    return store


def one_task(**task: Any) -> Any:
    return definition([{"name": "t", **task}])


async def test_the_cache_holds_at_most_cache_size_states_active_ones_included(
    store: Store, clock: FakeClock
) -> None:
    for n in range(12):
        await submit(store, one_task(), workflow_id=f"w{n}", clock=clock)
    coord = Coordinator(store, CoordinatorOptions(cache_size=4), clock=clock)

    await coord.step()  # all twelve start; their tasks are queued

    assert coord.active_count == 12
    assert coord.cached_count <= 4
    await work(store, clock)
    for _ in range(3):
        await coord.step()
        assert coord.cached_count <= 4
    for n in range(12):
        assert await status(store, f"w{n}") == "completed"
    assert coord.active_count == 0


async def test_sweeps_reload_only_the_evicted_workflows_whose_time_has_come(
    store: Store, clock: FakeClock
) -> None:
    for n in range(6):
        await submit(store, one_task(timeout_s=5), workflow_id=f"w{n}", clock=clock)
    coord = Coordinator(store, CoordinatorOptions(cache_size=2, timeout_grace_s=1), clock=clock)
    await coord.step()
    messages = await store.queues.receive("default", max_messages=10, visibility_timeout_s=60)
    assert len(messages) == 6  # taken by workers that then vanish
    await post(
        store, *[TaskStarted(workflow_id=f"w{n}", task=0, attempt=1, at=clock()) for n in range(6)]
    )
    await coord.step()
    gets = store.documents.gets  # type: ignore[attr-defined]

    before = gets["definitions"]
    await coord.sweep()  # nothing is due: nothing is loaded
    assert gets["definitions"] == before
    assert coord.cached_count <= 2

    clock.advance(10)  # every attempt outlived its timeout and grace
    await coord.sweep()

    for n in range(6):
        assert await status(store, f"w{n}") == "failed"
    assert coord.cached_count <= 2


async def test_a_store_error_outside_any_workflow_keeps_every_cached_state(
    store: Store, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    for n in range(3):
        await submit(store, one_task(), workflow_id=f"w{n}", clock=clock)
    coord = Coordinator(store, CoordinatorOptions(poll_interval_s=0.01), clock=clock)
    await coord.step()
    assert coord.cached_count == 3

    async def unreachable(*args: Any, **kwargs: Any) -> Any:
        raise StoreUnavailable("the completion queue cannot be reached")

    monkeypatch.setattr(store.queues, "receive", unreachable)
    coord._stop.set()  # cut the backoff wait short
    assert await coord._guarded(coord.step) == 0

    assert coord.cached_count == 3
    assert all(coord.state_of(f"w{n}") is not None for n in range(3))


async def test_a_purged_workflow_is_forgotten_not_swept_forever(
    store: Store, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    await submit(store, one_task(), workflow_id="w", clock=clock)
    coord = Coordinator(store, clock=clock)
    await coord.step()
    assert coord.active_count == 1
    await purge(store, "w", force=True)

    with caplog.at_level(logging.DEBUG, logger="dagq.coordinator"):
        await work(store, clock)  # the task's completion arrives after the purge
        for _ in range(5):
            await coord.step()
            clock.advance(1)
            await coord.sweep()

    assert coord.active_count == 0
    assert coord.cached_count == 0
    said = [r.getMessage() for r in caplog.records]
    assert sum("forgetting workflow w" in line for line in said) == 1
    assert not any(line.startswith("dropping 0 event") for line in said)
    assert await store.documents.get(keys.state("w")) is None


async def test_a_forced_purge_tells_workers_to_stop_everything_of_the_workflow(
    store: Store, clock: FakeClock
) -> None:
    await submit(store, one_task(), workflow_id="w", clock=clock)
    coord = Coordinator(store, clock=clock)
    await coord.step()

    await purge(store, "w", force=True)

    doc = await store.documents.get(keys.control("w"))
    assert doc is not None
    control = msgspec.json.decode(doc.data)
    assert control["stop_through"] >= 2**31  # every epoch's attempts
    assert control["run"] == clock.now  # of the run submitted then


async def test_a_workflow_submitted_again_after_a_forced_purge_starts_clean(
    store: Store, clock: FakeClock
) -> None:
    await submit(store, one_task(), workflow_id="w", clock=clock)
    coord = Coordinator(store, clock=clock)
    await coord.step()
    purged_run = clock.now
    await purge(store, "w", force=True)
    clock.advance(5)

    await submit(store, one_task(), workflow_id="w", clock=clock)
    await coord.step()

    # The marker stays (deleting it cost every run a request) and names the purged
    # run, not this one: workers stop this run's tasks by it no more.
    doc = await store.documents.get(keys.control("w"))
    assert doc is not None and msgspec.json.decode(doc.data)["run"] == purged_run
    [state] = [coord.state_of("w")]
    assert state is not None and state.created_at != purged_run
    await work(store, clock)
    await coord.step()
    assert await status(store, "w") == "completed"
