"""Every message delivered twice: each task message and each completion message is
sent in two copies with different ids (as Azure Queue Storage would deliver a
re-sent message), and the engine still ends every workflow correctly, applying each
completion once."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

from dagq import keys
from dagq.coordinator import Coordinator, CoordinatorOptions
from dagq.errors import UsageError
from dagq.history import read_history
from dagq.local import LocalRunner
from dagq.maintenance import purge
from dagq.messages import TaskFinished, TaskMessage, decode_task, encode_events
from dagq.persistence import read_state
from dagq.state import RunState, TaskStatus
from dagq.stores.base import OutgoingMessage, Store
from dagq.stores.memory import open_memory_store
from dagq.submission import request_cancel, request_retry, request_signal, submit
from dagq.views import load_run, load_view
from tests.conformance.conftest import FakeClock
from tests.helpers import definition

pytestmark = pytest.mark.timeout(30)


class Doubling:
    """Queues that send every message twice, the copy under a fresh id."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.copies = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def send(self, queue: str, messages: Sequence[OutgoingMessage]) -> None:
        await self._inner.send(queue, messages)
        copies = [OutgoingMessage(m.body, delay_s=m.delay_s) for m in messages]
        await self._inner.send(queue, copies)
        self.copies += len(copies)


async def test_a_workflow_ends_right_when_every_message_arrives_twice() -> None:
    store = open_memory_store()
    doubling = Doubling(store.queues)
    store.queues = doubling  # type: ignore[assignment]
    tasks: list[dict[str, Any]] = [{"name": "root", "call": "tests.sample_tasks:echo"}]
    tasks += [
        {"name": f"f{i}", "call": "tests.sample_tasks:echo", "depends_on": ["root"]}
        for i in range(20)
    ]
    flaky = {"name": "flaky", "call": "tests.sample_tasks:busy_once", "num_retries": 2}
    tasks.append({**flaky, "depends_on": ["root"]})
    tasks.append(
        {"name": "join", "call": "tests.sample_tasks:echo", "depends_on": ["flaky", "f0", "f19"]}
    )
    runner = LocalRunner(store, workers=4)
    result = await runner.submit(definition(tasks), params={}, workflow_id="w")

    status = await asyncio.wait_for(runner.drive(), 20)

    assert status == "completed"
    assert doubling.copies > 20  # the duplicates really went out
    view = await load_view(store, result.workflow_id)
    attempts = {t.name: (t.status, t.attempts) for t in view.tasks}
    assert attempts.pop("flaky") == ("completed", 2)
    assert set(attempts.values()) == {("completed", 1)}
    history = await read_history(store, "w")
    completed = Counter(e.task for e in history if e.kind == "completed")
    assert set(completed.values()) == {1} and len(completed) == len(tasks)


async def test_requests_sent_twice_to_a_running_engine_act_once() -> None:
    store = open_memory_store()
    doubling = Doubling(store.queues)
    store.queues = doubling  # type: ignore[assignment]
    waits: list[dict[str, Any]] = [
        {"name": "first", "wait_for": {"signal": "go"}},
        {"name": "second", "wait_for": {"signal": "go"}, "depends_on": ["first"]},
    ]
    runner = LocalRunner(store, workers=2)
    await runner.submit(definition(waits), params={}, workflow_id="w")
    drive = asyncio.create_task(runner.drive())

    async def settled(wanted: list[str]) -> None:
        while True:
            st = await runner.current_state()
            depth = await store.queues.depth(keys.COMPLETIONS_QUEUE)
            if [TaskStatus(s).label for s in st.task_status] == wanted and not (
                depth.visible or depth.invisible
            ):
                return
            await asyncio.sleep(0.02)

    await asyncio.wait_for(settled(["waiting", "pending"]), 10)
    await request_signal(store, "w", "go", 1)  # and its copy
    await asyncio.wait_for(settled(["completed", "waiting"]), 10)
    await request_cancel(store, "w")  # and its copy
    status = await asyncio.wait_for(drive, 10)

    assert status == "cancelled"
    history = await read_history(store, "w")
    assert [e.kind for e in history].count("signal") == 1
    assert [e.kind for e in history].count("cancel_requested") == 1


# --- requests delivered twice: cancel, retry, signal (and purge, repeated) ----------------


class Recorder:
    """Queues that keep every body sent to the completions queue, to deliver it again."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.bodies: list[bytes] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def send(self, queue: str, messages: Sequence[OutgoingMessage]) -> None:
        if queue == keys.COMPLETIONS_QUEUE:
            self.bodies += [bytes(m.body) for m in messages]
        await self._inner.send(queue, messages)

    async def again(self, body: bytes) -> None:
        """The queue delivers a copy of an earlier message, under a new message id."""
        await self._inner.send(keys.COMPLETIONS_QUEUE, [OutgoingMessage(body)])


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def recorded(clock: FakeClock) -> tuple[Store, Recorder]:
    store = open_memory_store(clock=clock)
    recorder = Recorder(store.queues)
    store.queues = recorder  # type: ignore[assignment]
    return store, recorder


async def step(store: Store, clock: FakeClock) -> None:
    """A coordinator drains the events; a fresh one each time, so every step reloads the
    state from the store (a restart between two deliveries forgets nothing)."""
    await Coordinator(store, CoordinatorOptions(), clock=clock).step()


async def take_tasks(store: Store) -> list[TaskMessage]:
    messages = await store.queues.receive("default", max_messages=100, visibility_timeout_s=60)
    return [decode_task(m.body) for m in messages]


async def report(store: Store, clock: FakeClock, task: TaskMessage, *, ok: bool) -> None:
    event = TaskFinished(
        workflow_id=task.workflow_id,
        task=task.task,
        attempt=task.attempt,
        at=clock(),
        ok=ok,
        error=None if ok else "boom",
        retryable=False,
    )
    await store.queues.send(keys.COMPLETIONS_QUEUE, [OutgoingMessage(encode_events([event]))])


async def stored(store: Store, workflow_id: str = "w") -> RunState:
    found = await read_state(store, workflow_id, (await load_run(store, workflow_id))[1])
    assert found is not None
    return found[0]


async def failed_once(store: Store, clock: FakeClock) -> None:
    await submit(store, definition([{"name": "t"}]), workflow_id="w", clock=clock)
    await step(store, clock)
    [task] = await take_tasks(store)
    await report(store, clock, task, ok=False)
    await step(store, clock)
    assert (await stored(store)).status == "failed"


async def test_a_retry_request_delivered_again_after_the_rerun_failed_changes_nothing(
    recorded: tuple[Store, Recorder], clock: FakeClock
) -> None:
    store, queues = recorded
    await failed_once(store, clock)
    await request_retry(store, "w")
    retry = queues.bodies[-1]
    await step(store, clock)
    [task] = await take_tasks(store)
    assert task.attempt == 2
    await report(store, clock, task, ok=False)
    await step(store, clock)
    before = await stored(store)
    assert before.status == "failed"

    await queues.again(retry)
    await step(store, clock)

    after = await stored(store)
    assert (after.status, after.attempt.tolist()) == ("failed", [2])
    assert await take_tasks(store) == []
    assert [e.kind for e in await read_history(store, "w")].count("retry_requested") == 1


async def test_a_cancel_request_delivered_again_after_a_retry_does_not_cancel_the_rerun(
    recorded: tuple[Store, Recorder], clock: FakeClock
) -> None:
    store, queues = recorded
    await submit(store, definition([{"name": "t"}]), workflow_id="w", clock=clock)
    await step(store, clock)
    [task] = await take_tasks(store)
    await request_cancel(store, "w")
    cancel = queues.bodies[-1]
    await step(store, clock)
    await report(store, clock, task, ok=False)
    await step(store, clock)
    assert (await stored(store)).status == "cancelled"
    await request_retry(store, "w")
    await step(store, clock)
    assert (await stored(store)).status == "running"

    await queues.again(cancel)
    await step(store, clock)

    assert (await stored(store)).status == "running"
    [rerun] = await take_tasks(store)
    await report(store, clock, rerun, ok=True)
    await step(store, clock)
    assert (await stored(store)).status == "completed"


async def test_a_signal_delivered_twice_completes_one_wait(
    recorded: tuple[Store, Recorder], clock: FakeClock
) -> None:
    store, queues = recorded
    waits = [
        {"name": "first", "wait_for": {"signal": "go"}},
        {"name": "second", "wait_for": {"signal": "go"}, "depends_on": ["first"]},
    ]
    await submit(store, definition(waits), workflow_id="w", clock=clock)
    await step(store, clock)
    await request_signal(store, "w", "go", {"n": 1})
    signal = queues.bodies[-1]
    await step(store, clock)
    assert [TaskStatus(s).label for s in (await stored(store)).task_status] == [
        "completed",
        "waiting",
    ]

    await queues.again(signal)
    await step(store, clock)

    st = await stored(store)
    assert [TaskStatus(s).label for s in st.task_status] == ["completed", "waiting"]
    assert st.signals == {}
    await request_signal(store, "w", "go", {"n": 2})
    await step(store, clock)
    st = await stored(store)
    assert st.status == "completed" and st.outputs == {0: {"n": 1}, 1: {"n": 2}}


async def test_an_early_signal_delivered_twice_is_kept_once(
    recorded: tuple[Store, Recorder], clock: FakeClock
) -> None:
    store, queues = recorded
    tasks = [
        {"name": "prep"},
        {"name": "first", "wait_for": {"signal": "go"}, "depends_on": ["prep"]},
        {"name": "second", "wait_for": {"signal": "go"}, "depends_on": ["first"]},
    ]
    await submit(store, definition(tasks), workflow_id="w", clock=clock)
    await step(store, clock)
    await request_signal(store, "w", "go", "early")
    await queues.again(queues.bodies[-1])
    await step(store, clock)

    assert (await stored(store)).signals == {"go": ["early"]}
    [prep] = await take_tasks(store)
    await report(store, clock, prep, ok=True)
    await step(store, clock)
    st = await stored(store)
    assert [TaskStatus(s).label for s in st.task_status] == ["completed", "completed", "waiting"]


async def test_a_purge_repeated_is_harmless_and_finishes_an_interrupted_one(
    recorded: tuple[Store, Recorder], clock: FakeClock
) -> None:
    store, queues = recorded
    await failed_once(store, clock)
    await request_retry(store, "w")  # still queued when the workflow goes
    await store.index.delete("w")  # a purge interrupted after its first write

    deleted = await purge(store, "w")

    assert deleted > 0
    with pytest.raises(UsageError, match="no workflow 'w'"):
        await purge(store, "w")
    await queues.again(queues.bodies[-1])
    await step(store, clock)  # the requests for the purged workflow bring nothing back
    assert await store.documents.list("") == []
    assert await store.index.get("w") is None
