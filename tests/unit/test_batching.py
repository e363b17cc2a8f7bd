"""Batching that does not depend on more slots: the coordinator lingers for company,
a worker takes quick tasks ahead of its free slots (docs/architecture.md, "Batching").

A lone completion (a chain) never waits; tasks are taken ahead only as many as the
slots start soon, so slow ones stay on the queue for other workers, and what is taken
ahead stays invisible (heartbeats) until it runs, so nothing runs twice.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import pytest

from dagq import keys
from dagq.coordinator import Coordinator, CoordinatorOptions
from dagq.dispatching import attempt_id
from dagq.messages import TaskMessage, TaskSpec, decode_task, encode_events, encode_task
from dagq.stores.base import AckOp, BatchOp, OutgoingMessage, Store, commit_in_order
from dagq.stores.memory import open_memory_store
from dagq.submission import submit
from dagq.worker import Worker, WorkerOptions
from tests import sample_tasks
from tests.helpers import definition, finished
from tests.unit.test_coordinator import Spy
from tests.unit.test_coordinator import finished as finished_event

pytestmark = pytest.mark.timeout(30)


def spied() -> Store:
    store = open_memory_store()
    store.documents = Spy(store.documents)
    return store


async def take(store: Store, n: int) -> list[TaskMessage]:
    got: list[TaskMessage] = []
    while len(got) < n:
        messages = await store.queues.receive("default", max_messages=n, visibility_timeout_s=60)
        got += [decode_task(m.body) for m in messages]
    return got


async def post(store: Store, events: list[Any]) -> None:
    await store.queues.send(keys.COMPLETIONS_QUEUE, [OutgoingMessage(encode_events(events))])


async def started_tasks(store: Store, coord: Coordinator, tasks: list[dict[str, Any]]) -> Any:
    """Submit, activate, and run the root: the tasks under it are then in flight."""
    await submit(store, definition(tasks), workflow_id="w")
    await coord.step()
    [root] = await take(store, 1)
    await post(store, [finished_event(root, time.time)])
    await coord.step()
    return root


# --- the coordinator ----------------------------------------------------------------


async def test_a_step_waits_for_the_rest_of_a_burst_and_commits_it_once() -> None:
    store = spied()
    coord = Coordinator(store, CoordinatorOptions(linger_s=10.0))
    tasks = [{"name": "root"}] + [{"name": f"t{i}", "depends_on": ["root"]} for i in range(10)]
    await started_tasks(store, coord, tasks)
    fan = await take(store, 10)
    writes = store.documents.puts["states"]
    await post(store, [finished_event(t, time.time) for t in fan[:2]])
    stepping = asyncio.create_task(coord.step())
    await asyncio.sleep(0.05)
    assert not stepping.done()  # eight more are in flight: it waits for them
    await post(store, [finished_event(t, time.time) for t in fan[2:5]])
    await asyncio.sleep(0.05)
    assert not stepping.done()
    began = time.monotonic()
    await post(store, [finished_event(t, time.time) for t in fan[5:]])
    await asyncio.wait_for(stepping, 5)
    assert time.monotonic() - began < 5  # nothing left in flight: no wait to the end
    assert store.documents.puts["states"] - writes == 1  # ten completions, one commit
    assert coord.stats.events >= 12


async def test_a_lone_completion_is_committed_at_once_beside_a_task_in_flight() -> None:
    store = spied()
    coord = Coordinator(store, CoordinatorOptions(linger_s=10.0))
    tasks = [
        {"name": "root"},
        {"name": "slow", "depends_on": ["root"]},
        {"name": "c1", "depends_on": ["root"]},
        {"name": "c2", "depends_on": ["c1"]},
    ]
    await started_tasks(store, coord, tasks)
    sent = {t.name: t for t in await take(store, 2)}
    await post(store, [finished_event(sent["c1"], time.time)])
    began = time.monotonic()
    await asyncio.wait_for(coord.step(), 5)  # 'slow' is in flight, but c1 came alone
    assert time.monotonic() - began < 2
    [c2] = await take(store, 1)
    assert c2.name == "c2"


async def test_a_coordinator_that_lingers_nowhere_commits_every_step_alone() -> None:
    store = spied()
    coord = Coordinator(store, CoordinatorOptions(linger_s=0))
    tasks = [{"name": "root"}] + [{"name": f"t{i}", "depends_on": ["root"]} for i in range(4)]
    await started_tasks(store, coord, tasks)
    fan = await take(store, 4)
    await post(store, [finished_event(t, time.time) for t in fan[:2]])
    await asyncio.wait_for(coord.step(), 5)
    await post(store, [finished_event(t, time.time) for t in fan[2:]])
    await asyncio.wait_for(coord.step(), 5)
    assert coord.stats.flushes == 4  # activate, root, and each half on its own


# --- the worker -------------------------------------------------------------------


class CountingQueues:
    """Counts receives, and the messages each took."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.receives: list[int] = []

    async def receive(self, queue: str, **kw: Any) -> Any:
        got = await self.inner.receive(queue, **kw)
        if queue == "default":
            self.receives.append(len(got))
        return got

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def nap(i: int, seconds: float) -> TaskMessage:
    spec = TaskSpec(kind="python", call="tests.sample_tasks:nap", args={"seconds": seconds})
    return TaskMessage(workflow_id="w", task=i, name=f"t{i}", attempt=1, spec=spec)


async def queued(store: Store, tasks: list[TaskMessage]) -> None:
    await store.queues.send(
        "default", [OutgoingMessage(encode_task(t), id=attempt_id(t)) for t in tasks]
    )


async def serve(store: Store, options: WorkerOptions, events: int) -> Counter[int]:
    """Run a worker until ``events`` tasks reported; how often each task reported."""
    stop = asyncio.Event()
    worker = Worker(store, options)
    serving = asyncio.create_task(worker.run(stop))
    try:
        reports = await asyncio.wait_for(finished(store, events), 20)
    finally:
        stop.set()
        await serving
    return Counter(e.task for e in reports)


async def test_a_worker_with_one_slot_takes_quick_tasks_ahead() -> None:
    store = open_memory_store()
    store.queues = counting = CountingQueues(store.queues)  # type: ignore[assignment]
    await queued(store, [nap(i, 0.0) for i in range(60)])
    options = WorkerOptions(concurrency=1, isolation="thread", poll_interval_s=0.05)
    ran = await serve(store, options, 60)
    assert ran == Counter(range(60))  # each once
    assert counting.receives[0] == 1  # nothing is known of its tasks yet: one at a time
    assert max(counting.receives) >= 4  # then quick ones several to a receive
    assert len([n for n in counting.receives if n]) < 40


async def test_slow_tasks_stay_on_the_queue_for_other_workers() -> None:
    store = open_memory_store()
    await queued(store, [nap(i, 0.3) for i in range(6)])
    options = WorkerOptions(
        concurrency=1, isolation="thread", backlog_wait_s=0.2, poll_interval_s=0.05
    )
    stop = asyncio.Event()
    serving = asyncio.create_task(Worker(store, options).run(stop))
    try:
        for _ in range(30):  # 3 s of 0.3 s tasks: each took one at a time
            depth = await store.queues.depth("default")
            assert depth.invisible <= 2  # the one running, and one whose delete is on its way
            await asyncio.sleep(0.1)
    finally:
        stop.set()
        await serving


async def test_tasks_taken_ahead_stay_hidden_until_they_run_and_run_once() -> None:
    store = open_memory_store()
    # Quick tasks first (the worker learns they are quick and takes the rest ahead),
    # then one that holds the only slot for three visibility timeouts.
    tasks = [nap(i, 0.0) for i in range(10)] + [nap(10, 1.5)]
    tasks += [nap(i, 0.0) for i in range(11, 40)]
    await queued(store, tasks)
    options = WorkerOptions(
        concurrency=1,
        isolation="thread",
        visibility_timeout_s=0.5,
        backlog_wait_s=30.0,
        poll_interval_s=0.05,
    )
    ran = await serve(store, options, 40)
    assert ran == Counter(range(40))  # nothing went back and ran a second time
    assert await store.queues.dead_letters("default") == []
    depth = await store.queues.depth("default")
    assert (depth.visible, depth.invisible) == (0, 0)


async def ticked(n: int) -> None:
    while len(sample_tasks.TICKS) < n:
        await asyncio.sleep(0.01)


async def test_a_worker_of_one_slot_runs_quick_tasks_on_while_a_commit_is_slow() -> None:
    """Finished tasks whose reports wait for a commit are bounded by the prefetch cap,
    not by the slots alone: a worker of few slots does as much between two commits as
    one of many (at four per slot, one slot stopped after the tasks it had ahead)."""
    store = open_memory_store()
    gate = asyncio.Event()

    async def slow_commit(ops: list[BatchOp]) -> list[str]:
        await gate.wait()
        return await commit_in_order(store, ops)

    store.committer = slow_commit  # the worker's reports go out in batches: none yet
    sample_tasks.TICKS.clear()
    spec = lambda i: TaskSpec(kind="python", call="tests.sample_tasks:tick", args={"i": i})  # noqa: E731
    tasks = [
        TaskMessage(workflow_id="w", task=i, name=f"t{i}", attempt=1, spec=spec(i))
        for i in range(150)
    ]
    await queued(store, tasks)
    options = WorkerOptions(concurrency=1, isolation="thread", poll_interval_s=0.05)
    worker = Worker(store, options)
    stop = asyncio.Event()
    serving = asyncio.create_task(worker.run(stop))
    try:
        # Before: ~35 ran (4 reports, then the 32 it had ahead), and it took no more.
        await asyncio.wait_for(ticked(100), 10)
        gate.set()
        reports = await asyncio.wait_for(finished(store, 150), 20)
    finally:
        gate.set()
        stop.set()
        await serving
    assert Counter(e.task for e in reports) == Counter(range(150))
    assert sorted(sample_tasks.TICKS) == list(range(150))  # each ran once


def test_an_acks_outcome_is_not_part_of_its_value() -> None:
    done = AckOp("default", ["r1"], deleted=[1])

    assert done == AckOp("default", ["r1"])
    assert (done != AckOp("default", ["r1"])) is False
    assert done != AckOp("default", ["r2"]) and done != AckOp("other", ["r1"])
    assert hash(AckOp("default", ("r1",), deleted=[0])) == hash(AckOp("default", ("r1",)))
