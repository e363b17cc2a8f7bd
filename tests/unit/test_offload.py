"""A heavy workflow's step runs off the event loop; readers wait for it; GC stays out."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from typing import Any

import pytest

from dagq import garbage
from dagq.coordinator import Coordinator, CoordinatorOptions
from dagq.offload import LARGE_TASKS, STEP_THREAD, Offload, heavy
from dagq.plan import compile_plan
from dagq.state import RunState, TaskStatus
from dagq.stores.base import SendOp, Store
from dagq.stores.intercepting import intercepted
from dagq.stores.memory import open_memory_store
from dagq.stores.sqlite import open_sqlite_store
from dagq.submission import submit
from tests.conformance.conftest import FakeClock
from tests.helpers import definition
from tests.unit.test_coordinator import finished, post, take_tasks


def fan_out(n: int) -> Any:
    tasks = [{"name": "root"}] + [{"name": f"t{i}", "depends_on": ["root"]} for i in range(n)]
    return definition(tasks)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(clock: FakeClock) -> Store:
    return open_memory_store(clock=clock)


class Threads:
    """Records which thread each step's CPU part (apply + stage) ran in."""

    def __init__(self, coordinator: Coordinator) -> None:
        self.main: list[bool] = []
        inner = coordinator._apply_staged

        def spy(*args: Any, **kwargs: Any) -> Any:
            self.main.append(threading.current_thread() is threading.main_thread())
            return inner(*args, **kwargs)

        coordinator._apply_staged = spy  # type: ignore[method-assign]


async def test_a_large_workflows_steps_run_in_a_thread(store: Store, clock: FakeClock) -> None:
    coordinator = Coordinator(store, CoordinatorOptions(), clock=clock)
    threads = Threads(coordinator)
    await submit(store, fan_out(LARGE_TASKS + 10), workflow_id="big", clock=clock)
    await coordinator.step()
    (root,) = await take_tasks(store)
    await post(store, finished(root, clock))
    await coordinator.step()
    assert threads.main == [False, False]
    assert coordinator.offload.count == 2
    assert len(await take_tasks(store, "default")) == 1000  # the fan-out went out (one page)


async def test_a_small_workflows_steps_stay_on_the_loop(store: Store, clock: FakeClock) -> None:
    coordinator = Coordinator(store, CoordinatorOptions(), clock=clock)
    threads = Threads(coordinator)
    await submit(store, fan_out(20), workflow_id="small", clock=clock)
    await coordinator.step()
    assert threads.main == [True]
    assert coordinator.offload.count == 0


def test_a_small_workflow_with_a_foreach_still_to_expand_is_heavy() -> None:
    plan = compile_plan(
        definition(
            [
                {"name": "list", "call": "m:f"},
                {
                    "name": "each",
                    "call": "m:g",
                    "depends_on": ["list"],
                    "foreach": "inputs.list",
                },
            ]
        ),
        {},
    )
    st = RunState("w", 2, 0.0)
    assert heavy(plan, st)
    st.task_status[1] = TaskStatus.COMPLETED
    assert not heavy(plan, st)


async def test_the_loop_keeps_turning_while_a_large_step_runs(
    store: Store, clock: FakeClock
) -> None:
    coordinator = Coordinator(store, CoordinatorOptions(), clock=clock)
    await submit(store, fan_out(20_000), workflow_id="big", clock=clock)
    await coordinator.step()
    (root,) = await take_tasks(store)
    await post(store, finished(root, clock))
    ticks_while_busy = 0
    stepping = asyncio.ensure_future(coordinator.step())
    while not stepping.done():  # a step on the loop would let this run only after it
        await asyncio.sleep(0)
        ticks_while_busy += coordinator.offload.busy("big")
    await stepping
    assert ticks_while_busy >= 1


async def test_readers_wait_until_the_thread_is_done() -> None:
    offload = Offload()
    release = threading.Event()
    running = asyncio.ensure_future(offload.run("w", True, release.wait, 30))
    while not offload.busy("w"):
        await asyncio.sleep(0)
    reader = asyncio.ensure_future(offload.idle("w"))
    await asyncio.sleep(0.01)
    assert not reader.done()
    release.set()
    await asyncio.wait_for(reader, 10)
    assert await running is True
    assert not offload.busy("w")


async def test_a_cancelled_step_keeps_its_workflow_busy_until_its_thread_ends() -> None:
    offload = Offload()
    release = threading.Event()
    running = asyncio.ensure_future(offload.run("w", True, release.wait, 30))
    while not offload.busy("w"):
        await asyncio.sleep(0)
    running.cancel()
    await asyncio.sleep(0.01)
    assert offload.busy("w")  # the thread still changes the working copy
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(running, 10)
    await asyncio.wait_for(offload.idle("w"), 10)


async def test_work_that_is_not_heavy_runs_inline() -> None:
    offload = Offload()
    assert await offload.run("w", False, threading.current_thread) is threading.main_thread()
    assert offload.count == 0


async def test_an_error_in_the_thread_reaches_the_caller() -> None:
    def boom() -> None:
        raise ValueError("bad state")

    with pytest.raises(ValueError, match="bad state"):
        await Offload().run("w", True, boom)


def test_full_collections_are_held_off_until_the_last_hold_ends() -> None:
    before = gc.get_threshold()
    with garbage.young_only():
        with garbage.young_only():
            held = gc.get_threshold()
        assert gc.get_threshold() == held
    assert gc.get_threshold() == before
    assert held[:2] == before[:2] and held[2] >= 2**30
    assert gc.isenabled()  # young collections go on
    with garbage.young_only(active=False):
        assert gc.get_threshold() == before


def test_indexes_finds_the_tasks_with_a_status() -> None:
    st = RunState("w", 10, 0.0)
    for i in (0, 3, 9):
        st.set_status(i, TaskStatus.RUNNING)
    assert st.indexes(TaskStatus.RUNNING) == [0, 3, 9]
    assert st.indexes(TaskStatus.PENDING) == [1, 2, 4, 5, 6, 7, 8]
    assert st.indexes(TaskStatus.FAILED) == []


async def test_steps_run_on_one_thread_started_ahead() -> None:
    def step_threads() -> set[int]:
        return {t.ident or 0 for t in threading.enumerate() if t.name.startswith(STEP_THREAD)}

    before = step_threads()
    offload = Offload()
    offload.start()
    try:
        (started,) = step_threads() - before
        ran_on = {await offload.run(f"w{i}", True, threading.get_ident) for i in range(3)}
    finally:
        offload.close()
    assert ran_on == {started}


def test_settling_freezes_the_survivors_of_a_collection_once_per_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    garbage.settle()
    assert gc.get_freeze_count() > 0
    again: list[str] = []  # (the count itself may fall: a frozen object can still be freed)
    monkeypatch.setattr(gc, "collect", lambda *args: again.append("collect") or 0)
    monkeypatch.setattr(gc, "freeze", lambda: again.append("freeze"))
    garbage.settle()
    assert again == []


class Freed:
    """Records, when freed, which thread freed it and how long its list still was."""

    def __init__(self, log: list[tuple[str, int]], owner: list[Any]) -> None:
        self.log = log
        self.owner = owner

    def __del__(self) -> None:
        self.log.append((threading.current_thread().name, len(self.owner)))


def freed_list(n: int, log: list[tuple[str, int]]) -> list[Any]:
    items: list[Any] = []
    items.extend(Freed(log, items) for _ in range(n))
    return items


def test_release_empties_a_list_a_chunk_at_a_time() -> None:
    log: list[tuple[str, int]] = []
    items = freed_list(2 * garbage.RELEASE_CHUNK + 500, log)
    garbage.release(items)
    assert items == [] and len(log) == 2 * garbage.RELEASE_CHUNK + 500
    # Each chunk went in its own bytecode (the GIL may change hands between them),
    # not all at once as ``items.clear()`` or dropping the list would.
    assert sorted({left for _, left in log}) == [0, 500, garbage.RELEASE_CHUNK + 500]


async def test_released_lists_are_freed_in_the_step_thread_not_on_the_loop() -> None:
    offload = Offload()
    offload.start()
    log: list[tuple[str, int]] = []
    items = freed_list(3 * garbage.RELEASE_CHUNK, log)
    try:
        offload.release(items)
        deadline = asyncio.get_running_loop().time() + 10
        while items:  # emptied by the thread while the loop goes on
            assert asyncio.get_running_loop().time() < deadline, "never released"
            await asyncio.sleep(0.001)
    finally:
        offload.close()
    assert len(log) == 3 * garbage.RELEASE_CHUNK
    assert {name.startswith(STEP_THREAD) for name, _ in log} == {True}


async def test_a_committed_fan_outs_messages_are_freed_in_the_step_thread(
    tmp_path: Any, clock: FakeClock
) -> None:
    sends: list[SendOp] = []
    sizes: list[int] = []

    async def capture(operation: str, args: tuple[Any, ...], call: Any) -> Any:
        if operation == "batch.commit":
            sends.extend(op for op in args[0] if isinstance(op, SendOp))
            sizes.extend(len(op.messages) for op in args[0] if isinstance(op, SendOp))
        return await call()

    store = intercepted(open_sqlite_store(tmp_path / "dagq.db", clock=clock), capture)
    coordinator = Coordinator(store, CoordinatorOptions(), clock=clock)
    try:
        await submit(store, fan_out(LARGE_TASKS + 10), workflow_id="big", clock=clock)
        await coordinator.step()
        (root,) = await take_tasks(store)
        await post(store, finished(root, clock))
        await coordinator.step()
        assert max(sizes) == LARGE_TASKS + 10  # the fan-out went in one commit
        (fan,) = [op for op, n in zip(sends, sizes, strict=True) if n == LARGE_TASKS + 10]
        deadline = time.monotonic() + 10
        while fan.messages:  # the step thread empties it
            assert time.monotonic() < deadline, "the committed messages were kept"
            await asyncio.sleep(0.001)
        assert len(await take_tasks(store, "default")) == 1000  # every one was written
    finally:
        coordinator.offload.close()
        await store.close()
