"""What one fault in a worker may stop: only itself.

A background task (heartbeats, the outbox) that dies is logged and restarted, and one
that keeps dying stops the worker with an error; a fault of the worker's own while it
handles one task fails that attempt and nothing else; a report the store refuses for
good is replaced by a small failure event, so the run ends instead of hanging.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from dagq import keys
from dagq.dispatching import attempt_id
from dagq.local import LocalRunner
from dagq.messages import TaskFinished, TaskMessage, TaskSpec, decode_events, encode_task
from dagq.stores.base import OutgoingMessage, Store
from dagq.stores.intercepting import intercepted
from dagq.stores.memory import open_memory_store
from dagq.supervision import BackgroundFailed
from dagq.views import load_view
from dagq.worker import Worker, WorkerOptions
from tests.helpers import definition

pytestmark = pytest.mark.timeout(30)


def nap(seconds: float) -> TaskMessage:
    spec = TaskSpec(kind="python", call="tests.sample_tasks:nap", args={"seconds": seconds})
    return TaskMessage(
        workflow_id="w", task=0, name="t0", attempt=1, spec=spec, idempotency_key="k"
    )


async def queued(store: Store, task: TaskMessage) -> None:
    await store.queues.send("default", [OutgoingMessage(encode_task(task), id=attempt_id(task))])


async def reports(store: Store) -> list[TaskFinished]:
    got = await store.queues.receive(
        keys.COMPLETIONS_QUEUE, max_messages=32, visibility_timeout_s=60
    )
    return [e for m in got for e in decode_events(m.body) if isinstance(e, TaskFinished)]


def crashing_extends(base: Store, times: int | None) -> tuple[Store, list[str]]:
    """A view of ``base`` whose first ``times`` extends (None: all) raise a bug."""
    calls: list[str] = []

    async def hook(operation: str, args: Any, call: Callable[[], Awaitable[Any]]) -> Any:
        if operation == "queues.extend":
            calls.append("crash" if times is None or len(calls) < times else "ok")
            if calls[-1] == "crash":
                raise RuntimeError("a bug in the heartbeat")
        return await call()

    return intercepted(base, hook), calls


async def test_a_heartbeat_that_dies_is_logged_and_restarted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    base = open_memory_store()
    store, extends = crashing_extends(base, times=1)
    await queued(base, nap(2.5))
    stop = asyncio.Event()
    options = WorkerOptions(concurrency=1, visibility_timeout_s=3, cancel_check_s=0.1)
    serving = asyncio.create_task(Worker(store, options).run(stop))

    while not (done := await reports(base)):
        await asyncio.sleep(0.05)
    stop.set()
    await serving

    assert [e.ok for e in done] == [True]
    assert "background task 'heartbeat' failed (restart 1" in caplog.text
    assert extends[:2] == ["crash", "ok"]  # it renewed the message again after the restart
    assert (await base.queues.depth("default")).visible == 0


async def test_a_heartbeat_that_keeps_dying_stops_the_worker_with_an_error() -> None:
    base = open_memory_store()
    store, _ = crashing_extends(base, times=None)
    await queued(base, nap(60))
    options = WorkerOptions(
        concurrency=1, visibility_timeout_s=0.3, cancel_check_s=0.1, shutdown_grace_s=0.1
    )

    with pytest.raises(BackgroundFailed, match="'heartbeat' failed 4 times in a row"):
        await asyncio.wait_for(Worker(store, options).run(asyncio.Event()), 20)


async def test_a_fault_of_the_worker_while_it_handles_a_task_fails_only_that_attempt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = Worker._inputs

    async def broken_for_bad(self: Worker, task: TaskMessage) -> dict[str, Any]:
        if task.name == "bad":
            raise RuntimeError("a bug while loading inputs")
        return await real(self, task)

    monkeypatch.setattr(Worker, "_inputs", broken_for_bad)
    store = open_memory_store()
    runner = LocalRunner(store, workers=2)
    tasks = [
        {"name": "bad", "call": "tests.sample_tasks:echo"},
        {"name": "good", "call": "tests.sample_tasks:echo", "args": {"v": 1}},
    ]
    await runner.submit(definition(tasks), params={}, workflow_id="w")

    status = await asyncio.wait_for(runner.drive(), 20)

    rows = {t.name: t for t in (await load_view(store, "w")).tasks}
    assert status == "failed"
    assert rows["good"].status == "completed"
    assert rows["bad"].status == "failed"
    assert "the worker failed running it: RuntimeError: a bug while loading inputs" in (
        rows["bad"].error or ""
    )


async def test_a_report_too_large_to_send_becomes_a_small_failure_and_the_run_ends() -> None:
    store = open_memory_store()
    runner = LocalRunner(store, workers=2)
    tasks = [
        {"name": "loud", "call": "tests.sample_tasks:raise_long", "args": {"size": 60_000}},
        {"name": "quiet", "call": "tests.sample_tasks:echo", "args": {"v": 1}},
    ]
    await runner.submit(definition(tasks), params={}, workflow_id="w")

    status = await asyncio.wait_for(runner.drive(), 20)

    rows = {t.name: t for t in (await load_view(store, "w")).tasks}
    assert status == "failed"
    assert rows["quiet"].status == "completed"
    assert rows["loud"].status == "failed"
    assert "ValueError" in (rows["loud"].error or "")
    assert len(rows["loud"].error or "") < 5000


async def test_a_task_ending_while_its_renewal_is_on_its_way_back_is_deleted_once() -> None:
    base = open_memory_store()
    deleted = asyncio.Event()
    renewals: list[str] = []

    async def slow_answers(operation: str, args: Any, call: Callable[[], Awaitable[Any]]) -> Any:
        result = await call()
        if operation == "queues.extend" and not renewals:
            # The store has renewed (a new receipt); its answer comes back only after
            # the finished task's delete has gone out.
            renewals.append(result)
            await deleted.wait()
        if operation == "queues.delete" and args[0] == "default":
            deleted.set()
        return result

    shell = TaskSpec(kind="shell", cmd="sleep 0.6")
    task = TaskMessage(
        workflow_id="w", task=0, name="t0", attempt=1, spec=shell, idempotency_key="k"
    )
    await queued(base, task)
    stop = asyncio.Event()
    options = WorkerOptions(concurrency=1, visibility_timeout_s=0.6, cancel_check_s=0.05)
    serving = asyncio.create_task(Worker(intercepted(base, slow_answers), options).run(stop))

    finished: list[TaskFinished] = []
    while not finished or await left(base):
        finished += await reports(base)
        await asyncio.sleep(0.05)
    await asyncio.sleep(1.0)  # a message left behind would be back and run by now
    finished += await reports(base)
    stop.set()
    await serving

    assert renewals, "the heartbeat renewed the message while the task ran"
    assert [e.ok for e in finished] == [True]  # it ran once
    assert await left(base) == 0


async def left(store: Store) -> int:
    depth = await store.queues.depth("default")
    return depth.visible + depth.invisible
