"""Bundles: several task messages in one queue message, for stores billed per request.

The coordinator packs what it sends together (``dispatching.bundle``); a worker keeps
as many tasks as it has free slots plus a short backlog and gives the rest back (and
the backlog, if it waits too long); completions that come together share a message;
a bundle delivered twice is split into one message per task; nothing is lost or run
twice on the way.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dagq import keys
from dagq.coordinator import Coordinator, CoordinatorOptions
from dagq.dispatching import BUNDLE_BYTES, attempt_id, bundle, bundle_sends
from dagq.holding import split
from dagq.local import LocalRunner
from dagq.messages import (
    TaskFinished,
    TaskMessage,
    TaskSpec,
    decode_events,
    decode_tasks,
    encode_task,
)
from dagq.stores.base import BatchOp, OutgoingMessage, PutOp, SendOp, Store
from dagq.stores.memory import open_memory_store
from dagq.submission import submit
from dagq.views import load_view
from dagq.worker import Worker, WorkerOptions
from tests.helpers import GatedQueues, definition, finished

pytestmark = pytest.mark.timeout(30)


def task(i: int, *, seconds: float = 0.0, pad: int = 0) -> TaskMessage:
    spec = TaskSpec(kind="python", call="tests.sample_tasks:nap", args={"seconds": seconds})
    return TaskMessage(
        workflow_id="w", task=i, name=f"t{i}", attempt=1, spec=spec, idempotency_key="x" * pad
    )


def message(t: TaskMessage, delay_s: float = 0.0) -> OutgoingMessage:
    return OutgoingMessage(encode_task(t), id=attempt_id(t), delay_s=delay_s)


def unpacked(messages: list[OutgoingMessage]) -> list[int]:
    return [t.task for m in messages for t in decode_tasks(m.body)]


# --- packing ------------------------------------------------------------------------


def test_messages_sent_together_go_out_in_bundles_named_after_their_first_task() -> None:
    out = bundle([message(task(i)) for i in range(10)], 4)
    assert [len(decode_tasks(m.body)) for m in out] == [4, 4, 2]
    assert [m.id for m in out] == ["w/t0/1+3", "w/t4/1+3", "w/t8/1+1"]
    assert unpacked(out) == list(range(10))


def test_a_delayed_message_keeps_its_delay_and_a_lone_one_stays_plain() -> None:
    out = bundle([message(task(0)), message(task(1), delay_s=5), message(task(2))], 8)
    assert [(m.id, m.delay_s) for m in out] == [("w/t1/1", 5), ("w/t0/1+1", 0.0)]
    assert bundle([message(task(0))], 8)[0].body == encode_task(task(0))
    assert len(bundle([message(task(i)) for i in range(5)], 1)) == 5


def test_a_batch_of_many_workflows_sends_their_tasks_in_one_bundle_after_every_state() -> None:
    ops: list[BatchOp] = []
    for i in range(3):  # three workflows, each dispatching one task
        ops += [PutOp(f"states/w{i}", b"s"), SendOp("default", [message(task(i))])]
    ops.append(SendOp("gpu", [message(task(7))]))
    bundle_sends(ops, 32)
    assert [type(op).__name__ for op in ops] == ["PutOp"] * 3 + ["SendOp"] * 2
    merged = {op.queue: op.messages for op in ops if isinstance(op, SendOp)}
    assert unpacked(list(merged["default"])) == [0, 1, 2]
    assert [m.id for m in merged["default"]] == ["w/t0/1+2"]
    assert unpacked(list(merged["gpu"])) == [7]


def test_one_send_of_many_tasks_goes_out_in_bundles_too() -> None:
    ops: list[BatchOp] = [
        PutOp("states/w", b"s"),
        SendOp("default", [message(task(i)) for i in range(10)]),
    ]
    bundle_sends(ops, 4)
    [send] = [op for op in ops if isinstance(op, SendOp)]
    assert [len(decode_tasks(m.body)) for m in send.messages] == [4, 4, 2]
    assert unpacked(list(send.messages)) == list(range(10))


async def test_a_workflow_fanning_out_alone_sends_its_tasks_in_bundles() -> None:
    store = open_memory_store()
    store.queues.bundle_size = 8  # type: ignore[misc]
    await submit(store, definition([{"name": f"t{i}"} for i in range(10)]), workflow_id="w")
    assert await Coordinator(store, CoordinatorOptions()).step() == 1
    assert await visible(store) == 2  # 8 + 2 tasks, not 10 messages


def test_a_store_that_does_not_bundle_keeps_a_batch_as_it_is() -> None:
    ops: list[BatchOp] = [SendOp("default", [message(task(i))]) for i in range(3)]
    before = list(ops)
    bundle_sends(ops, 1)
    assert ops == before


@given(
    st.lists(st.tuples(st.integers(0, 12_000), st.sampled_from([0.0, 0.0, 3.0])), max_size=40),
    st.integers(1, 40),
)
def test_bundles_keep_every_task_once_within_the_size_and_byte_limits(
    shapes: list[tuple[int, float]], size: int
) -> None:
    messages = [message(task(i, pad=pad), delay) for i, (pad, delay) in enumerate(shapes)]
    out = bundle(messages, size)
    assert sorted(unpacked(out)) == list(range(len(messages)))
    for m in out:
        n = len(decode_tasks(m.body))
        assert n <= size
        assert n == 1 or (len(m.body) <= BUNDLE_BYTES + 8 and m.delay_s == 0)


# --- workers --------------------------------------------------------------------------


async def visible(store: Store, queue: str = "default") -> int:
    return (await store.queues.depth(queue)).visible


async def bundled(tasks: list[TaskMessage]) -> Store:
    """A memory store that bundles by 8, with ``tasks`` queued in one bundle."""
    store = open_memory_store()
    store.queues.bundle_size = 8  # type: ignore[misc]
    await store.queues.send("default", bundle([message(t) for t in tasks], 8))
    return store


async def until(check: Any) -> None:
    while not await check():
        await asyncio.sleep(0.01)


async def test_a_worker_keeps_what_it_can_run_and_gives_the_rest_back() -> None:
    store = await bundled([task(i, seconds=0.2) for i in range(6)])
    stop = asyncio.Event()
    worker = Worker(store, WorkerOptions(concurrency=2, backlog=0, poll_interval_s=0.05))
    serving = asyncio.create_task(worker.run(stop))
    # Two run at once; the other four are back on the queue, for any worker.
    await until(lambda: visible_is(store, 1))
    events = await finished(store, 6)
    assert sorted(e.task for e in events) == list(range(6))
    assert all(e.ok for e in events)
    # Every message is gone once its tasks have reported: nothing comes back.
    await until(lambda: empty(store))
    stop.set()
    await serving
    assert await store.queues.dead_letters("default") == []


async def test_a_worker_keeps_a_backlog_and_runs_it_as_its_slots_free_up() -> None:
    store = await bundled([task(i, seconds=0.1) for i in range(6)])
    stop = asyncio.Event()
    worker = Worker(store, WorkerOptions(concurrency=2, backlog=2, backlog_wait_s=30))
    serving = asyncio.create_task(worker.run(stop))
    await until(lambda: depth_is(store, 1, 1))  # 2 running + 2 waiting; 2 went back
    [back] = await store.queues.receive("default", max_messages=10, visibility_timeout_s=60)
    assert [t.task for t in decode_tasks(back.body)] == [4, 5]
    events = await finished(store, 4)
    assert sorted(e.task for e in events) == [0, 1, 2, 3]
    stop.set()
    await serving


async def test_a_backlog_that_waits_too_long_goes_back_for_other_workers() -> None:
    store = await bundled([task(0, seconds=30)] + [task(i) for i in range(1, 4)])
    stop = asyncio.Event()
    options = WorkerOptions(
        concurrency=1, backlog=3, backlog_wait_s=0.1, cancel_check_s=0.05, shutdown_grace_s=0.1
    )
    serving = asyncio.create_task(Worker(store, options).run(stop))
    await until(lambda: depth_is(store, 1, 1))
    [back] = await store.queues.receive("default", max_messages=10, visibility_timeout_s=60)
    assert [t.task for t in decode_tasks(back.body)] == [1, 2, 3]
    # On shutdown the long task goes back alone; the bundle it came in is deleted.
    stop.set()
    await serving
    await until(lambda: visible_is(store, 1))
    [last] = await store.queues.receive("default", max_messages=10, visibility_timeout_s=60)
    assert [t.task for t in decode_tasks(last.body)] == [0]
    depth = await store.queues.depth("default")
    assert (depth.visible, depth.invisible) == (0, 2)  # the two just received


async def test_completions_of_tasks_that_finish_together_share_a_message() -> None:
    store = open_memory_store()
    await store.queues.send("default", bundle([message(task(i)) for i in range(16)], 16))
    stop = asyncio.Event()
    # A long linger: the reports wait for each other however slow the machine (a
    # batch goes out as soon as no task is left running).
    worker = Worker(store, WorkerOptions(concurrency=16, report_linger_s=10.0))
    serving = asyncio.create_task(worker.run(stop))
    messages = 0
    events: list[TaskFinished] = []
    while len(events) < 16:
        got = await store.queues.receive(
            keys.COMPLETIONS_QUEUE, max_messages=32, visibility_timeout_s=60
        )
        for m in got:
            done = [e for e in decode_events(m.body) if isinstance(e, TaskFinished)]
            messages += bool(done)
            events += done
        if not got:
            await store.queues.wait(keys.COMPLETIONS_QUEUE, 0.05)
    stop.set()
    await serving
    assert sorted(e.task for e in events) == list(range(16))
    assert messages == 1


async def depth_is(store: Store, visible: int, invisible: int) -> bool:
    depth = await store.queues.depth("default")
    return (depth.visible, depth.invisible) == (visible, invisible)


async def visible_is(store: Store, n: int) -> bool:
    return await visible(store) == n


async def empty(store: Store) -> bool:
    depth = await store.queues.depth("default")
    return depth.visible == depth.invisible == 0


async def test_a_redelivered_bundle_is_split_into_one_message_per_task() -> None:
    store = open_memory_store()
    tasks = [task(i) for i in range(3)]
    await store.queues.send("default", bundle([message(t) for t in tasks], 8))
    [first] = await store.queues.receive("default", max_messages=1, visibility_timeout_s=0)
    [again] = await store.queues.receive("default", max_messages=1, visibility_timeout_s=60)
    assert again.dequeue_count == 2
    await split(store, again, decode_tasks(again.body))
    singles = await store.queues.receive("default", max_messages=10, visibility_timeout_s=60)
    assert sorted(m.id for m in singles) == ["w/t0/1", "w/t1/1", "w/t2/1"]
    assert all(m.dequeue_count == 1 and len(decode_tasks(m.body)) == 1 for m in singles)
    assert await store.queues.delete("default", [again.receipt]) == 0  # already gone
    assert first.id == again.id == "w/t0/1+2"


async def test_a_worker_splits_a_redelivered_bundle_and_runs_each_task_once() -> None:
    store = open_memory_store()
    await store.queues.send("default", bundle([message(task(i)) for i in range(3)], 8))
    await store.queues.receive("default", max_messages=1, visibility_timeout_s=0)  # a death
    stop = asyncio.Event()
    serving = asyncio.create_task(Worker(store, WorkerOptions(concurrency=4)).run(stop))
    events = await finished(store, 3)
    await until(lambda: empty(store))
    stop.set()
    await serving
    assert sorted(e.task for e in events) == [0, 1, 2]


async def test_shutdown_gives_back_the_unfinished_part_of_a_bundle() -> None:
    store = open_memory_store()
    await store.queues.send("default", bundle([message(task(0)), message(task(1, seconds=30))], 8))
    stop = asyncio.Event()
    worker = Worker(store, WorkerOptions(concurrency=2, shutdown_grace_s=0.1))
    serving = asyncio.create_task(worker.run(stop))
    [quick] = await finished(store, 1)
    stop.set()
    await serving
    assert quick.task == 0
    # The bundle is gone (its quick task reported); the slow task is back on its own.
    await until(lambda: visible_is(store, 1))
    [back] = await store.queues.receive("default", max_messages=10, visibility_timeout_s=60)
    assert [t.task for t in decode_tasks(back.body)] == [1]
    depth = await store.queues.depth("default")
    assert (depth.visible, depth.invisible) == (0, 1)  # only the one just received


# --- the whole engine -----------------------------------------------------------------


async def test_a_fan_out_completes_with_every_task_run_once_when_bundled() -> None:
    store = open_memory_store()
    store.queues.bundle_size = 4  # type: ignore[misc]
    tasks: list[dict[str, Any]] = [{"name": "root", "call": "tests.sample_tasks:echo"}]
    tasks += [
        {"name": f"f{i}", "call": "tests.sample_tasks:echo", "depends_on": ["root"]}
        for i in range(30)
    ]
    tasks.append({"name": "join", "call": "tests.sample_tasks:echo", "depends_on": ["f0"]})
    runner = LocalRunner(store, workers=3)
    result = await runner.submit(definition(tasks), params={}, workflow_id="w")
    status = await asyncio.wait_for(runner.drive(), 20)
    view = await load_view(store, result.workflow_id)
    assert status == "completed"
    assert {(t.status, t.attempts) for t in view.tasks} == {("completed", 1)}


async def test_a_shutdown_during_a_backlog_give_back_loses_no_task() -> None:
    store = await bundled([task(0, seconds=30), task(1)])
    slow = GatedQueues(store.queues, "default")
    store.queues = slow  # type: ignore[assignment]
    stop = asyncio.Event()
    options = WorkerOptions(
        concurrency=1, backlog=1, backlog_wait_s=0.05, cancel_check_s=0.05, shutdown_grace_s=0.1
    )
    serving = asyncio.create_task(Worker(store, options).run(stop))
    await slow.sending.wait()  # task 1 is on its way back to the queue
    stop.set()  # the shutdown must wait for that give-back, then give back task 0
    await asyncio.sleep(0.2)
    slow.open.set()
    await serving
    back = await store.queues.receive("default", max_messages=10, visibility_timeout_s=60)
    assert sorted(t.task for m in back for t in decode_tasks(m.body)) == [0, 1]
    depth = await store.queues.depth("default")
    assert (depth.visible, depth.invisible) == (0, len(back))  # the bundle itself is gone


async def test_a_worker_serving_some_workflows_gives_the_others_tasks_back_unrun() -> None:
    """``dagq run`` runs only its own workflow's tasks: another run's Python task may
    need another import path, or a module of the same name may mean another function."""
    ours = [task(i) for i in range(3)]
    theirs = [msgspec.structs.replace(task(i), workflow_id="other") for i in range(3, 5)]
    store = await bundled(ours + theirs)
    stop = asyncio.Event()
    worker = Worker(
        store, WorkerOptions(concurrency=4, poll_interval_s=0.05, workflows=frozenset({"w"}))
    )
    serving = asyncio.create_task(worker.run(stop))
    events = await finished(store, 3)
    assert sorted(e.task for e in events) == [0, 1, 2]
    assert {e.workflow_id for e in events} == {"w"}
    # The other workflow's tasks are back on the queue, not run, whoever takes them.
    stop.set()
    await serving
    depth = await store.queues.depth("default")
    assert depth.visible + depth.invisible >= 1
    await until(lambda: visible_is(store, depth.visible + depth.invisible))
    left = await store.queues.receive("default", max_messages=10, visibility_timeout_s=60)
    assert sorted(t.task for m in left for t in decode_tasks(m.body)) == [3, 4]
    assert {t.workflow_id for m in left for t in decode_tasks(m.body)} == {"other"}
