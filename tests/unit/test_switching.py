"""While a coordinator or a worker runs, the GIL switch interval is at most theirs."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable, Iterator

import pytest

from dagq import keys
from dagq.coordinator import Coordinator, CoordinatorOptions
from dagq.stores.base import Store
from dagq.stores.memory import open_memory_store
from dagq.worker import Worker, WorkerOptions


@pytest.fixture(autouse=True)
def interpreter_default() -> Iterator[None]:
    """Each test starts from the interpreter's default interval, and leaves it so."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


async def until(condition: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = time.monotonic() + 10
    while not await condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


async def _coordinating(store: Store) -> bool:
    return await store.leases.get(keys.COORDINATOR_LEASE) is not None


async def test_a_running_coordinator_shortens_the_interval_and_gives_it_back() -> None:
    store = open_memory_store()
    stop = asyncio.Event()
    options = CoordinatorOptions(switch_interval_s=0.001)
    running = asyncio.create_task(Coordinator(store, options).run(stop))
    try:
        await until(lambda: _coordinating(store), "the coordinator's lease")
        assert sys.getswitchinterval() == pytest.approx(0.001)
    finally:
        stop.set()
        await running
    assert sys.getswitchinterval() == pytest.approx(0.005)


async def test_none_leaves_the_interval_alone_and_a_shorter_one_is_kept() -> None:
    store = open_memory_store()
    for options, during in (
        (CoordinatorOptions(), 0.005),  # the default: the interpreter's
        (CoordinatorOptions(switch_interval_s=0.01), 0.005),  # never lengthened
        (CoordinatorOptions(switch_interval_s=0.002), 0.002),
    ):
        stop = asyncio.Event()
        running = asyncio.create_task(Coordinator(store, options).run(stop))
        try:
            await until(lambda: _coordinating(store), "the coordinator's lease")
            assert sys.getswitchinterval() == pytest.approx(during)
        finally:
            stop.set()
            await running
        assert sys.getswitchinterval() == pytest.approx(0.005)


async def test_the_interval_comes_back_when_the_last_of_a_coordinator_and_worker_ends() -> None:
    store = open_memory_store()
    stop_coordinator, stop_worker = asyncio.Event(), asyncio.Event()
    options = CoordinatorOptions(switch_interval_s=0.001)
    coordinator = asyncio.create_task(Coordinator(store, options).run(stop_coordinator))
    worker = Worker(store, WorkerOptions(switch_interval_s=0.002, poll_interval_s=0.01))
    serving = asyncio.create_task(worker.run(stop_worker))
    try:
        await until(lambda: _coordinating(store), "the coordinator's lease")
        assert sys.getswitchinterval() == pytest.approx(0.001)
        stop_coordinator.set()
        await coordinator
        assert sys.getswitchinterval() == pytest.approx(0.001)  # the worker still runs
    finally:
        stop_coordinator.set()
        stop_worker.set()
        await asyncio.gather(coordinator, serving)
    assert sys.getswitchinterval() == pytest.approx(0.005)


@pytest.mark.parametrize("value", [0, -0.001, float("nan")])
def test_an_interval_that_is_not_a_positive_number_is_refused(value: float) -> None:
    with pytest.raises(ValueError, match="switch_interval_s must be a positive number"):
        CoordinatorOptions(switch_interval_s=value)
    with pytest.raises(ValueError, match="switch_interval_s must be a positive number"):
        WorkerOptions(switch_interval_s=value)
