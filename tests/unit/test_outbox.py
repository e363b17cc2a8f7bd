"""The worker's outbox: events go out in batches with the deletes they allow, in order;
closing it never abandons a batch on its way."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from dagq import keys
from dagq.errors import DamagedData, MessageTooLarge, StoreUnavailable
from dagq.messages import TaskFinished, TaskStarted, decode_events
from dagq.outbox import LINGER_S, Outbox
from dagq.stores.base import OutgoingMessage, Store
from dagq.stores.intercepting import intercepted
from dagq.stores.memory import open_memory_store
from tests.helpers import GatedQueues

pytestmark = pytest.mark.timeout(30)


def event(task: int) -> TaskFinished:
    return TaskFinished(workflow_id="w", task=task, attempt=1, at=1.0, ok=True)


async def test_close_waits_for_a_batch_already_on_its_way() -> None:
    store = open_memory_store()
    gate = GatedQueues(store.queues, keys.COMPLETIONS_QUEUE)
    store.queues = gate  # type: ignore[assignment]
    outbox = Outbox(store, keys.COMPLETIONS_QUEUE)
    outbox.start()
    poster = asyncio.create_task(outbox.post(event(1)))
    await gate.sending.wait()
    poster.cancel()  # as a worker's shutdown cancels the task that posted it
    with contextlib.suppress(asyncio.CancelledError):
        await poster
    closing = asyncio.create_task(outbox.close())
    await asyncio.sleep(0.1)
    assert not closing.done()  # the send under way is not abandoned
    gate.open.set()
    await closing
    [message] = await store.queues.receive(
        keys.COMPLETIONS_QUEUE, max_messages=10, visibility_timeout_s=60
    )
    assert [e.task for e in decode_events(message.body)] == [1]


async def test_an_acknowledgement_goes_out_after_the_events_posted_before_it() -> None:
    store = open_memory_store()
    outbox = Outbox(store, keys.COMPLETIONS_QUEUE)
    outbox.start()
    await store.queues.send("default", [OutgoingMessage(b"task", id="t")])
    [held] = await store.queues.receive("default", max_messages=1, visibility_timeout_s=60)

    class Ack:
        queue = "default"
        receipt = held.receipt
        lock = asyncio.Lock()
        deleted = False

    posting = asyncio.create_task(outbox.post(event(2)))
    outbox.acknowledge(Ack())
    await posting
    await outbox.close()
    assert (await store.queues.depth("default")).invisible == 0  # deleted
    got = await store.queues.receive(
        keys.COMPLETIONS_QUEUE, max_messages=10, visibility_timeout_s=60
    )
    assert [e.task for m in got for e in decode_events(m.body)] == [2]


class Held:
    """A received message as the worker holds it (its receipt may be renewed)."""

    def __init__(self, queue: str, receipt: str) -> None:
        self.queue = queue
        self.receipt = receipt
        self.lock = asyncio.Lock()
        self.deleted = False


async def held_message(store: Store, queue: str = "default") -> Held:
    await store.queues.send(queue, [OutgoingMessage(b"task")])
    [message] = await store.queues.receive(queue, max_messages=1, visibility_timeout_s=60)
    return Held(queue, message.receipt)


async def left_in(store: Store, queue: str = "default") -> int:
    depth = await store.queues.depth(queue)
    return depth.visible + depth.invisible


async def test_a_delete_whose_receipt_a_heartbeat_renewed_on_the_way_is_retried() -> None:
    base = open_memory_store()
    held = await held_message(base)
    renewals = 0

    async def renew_first(operation: str, args: Any, call: Callable[[], Awaitable[Any]]) -> Any:
        # The heartbeat's renewal reaches the store just before the first delete does.
        nonlocal renewals
        if operation == "queues.delete" and not renewals:
            renewals += 1
            async with held.lock:
                held.receipt = await base.queues.extend("default", held.receipt, 60)
        return await call()

    store = intercepted(base, renew_first)
    outbox = Outbox(store, keys.COMPLETIONS_QUEUE)
    outbox.start()
    await outbox.post(event(1), ack=held)
    await outbox.close()

    assert await left_in(base) == 0  # deleted with the current receipt
    assert held.deleted and outbox.lost_acks == 0


async def test_a_delete_that_finds_its_message_gone_is_counted_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = open_memory_store()
    held = await held_message(store)
    await store.queues.extend("default", held.receipt, 0)  # lapsed: another worker ...
    await store.queues.receive("default", max_messages=1, visibility_timeout_s=60)  # ... has it
    outbox = Outbox(store, keys.COMPLETIONS_QUEUE)
    outbox.start()

    await outbox.post(event(1), ack=held)
    await outbox.close()

    assert outbox.lost_acks == 1
    assert "no longer held when deleted" in caplog.text


def failed(task: int, error: str) -> TaskFinished:
    return TaskFinished(workflow_id="w", task=task, attempt=1, at=1.0, ok=False, error=error)


async def posted(store: Store) -> list[int]:
    got = await store.queues.receive(
        keys.COMPLETIONS_QUEUE, max_messages=32, visibility_timeout_s=60
    )
    return sorted(e.task for m in got for e in decode_events(m.body))  # type: ignore[union-attr]


async def test_an_event_too_large_for_a_message_fails_its_poster_and_the_rest_go_out() -> None:
    store = open_memory_store()
    acks = [await held_message(store) for _ in range(3)]
    outbox = Outbox(store, keys.COMPLETIONS_QUEUE)
    outbox.start()

    results = await asyncio.gather(
        outbox.post(event(1), ack=acks[0]),
        outbox.post(failed(2, "x" * 60_000), ack=acks[1]),
        outbox.post(event(3), ack=acks[2]),
        return_exceptions=True,
    )
    await asyncio.wait_for(outbox.close(), 5)

    assert results[0] is None and results[2] is None
    assert isinstance(results[1], MessageTooLarge)
    assert await posted(store) == [1, 3]
    assert await left_in(store) == 1  # only the refused report's task message stays


async def test_a_batch_refused_for_good_is_split_until_only_the_culprit_fails() -> None:
    base = open_memory_store()

    async def refuse_task_5(operation: str, args: Any, call: Callable[[], Awaitable[Any]]) -> Any:
        if operation == "queues.send" and args[0] == keys.COMPLETIONS_QUEUE:
            events = [e for m in args[1] for e in decode_events(m.body)]
            if any(getattr(e, "task", None) == 5 for e in events):
                raise DamagedData("the store refuses task 5's event")
        return await call()

    store = intercepted(base, refuse_task_5)
    outbox = Outbox(store, keys.COMPLETIONS_QUEUE)
    outbox.start()

    results = await asyncio.gather(
        *(outbox.post(event(t)) for t in range(8)), return_exceptions=True
    )
    await asyncio.wait_for(outbox.close(), 5)

    assert [type(r).__name__ for r in results].count("DamagedData") == 1
    assert isinstance(results[5], DamagedData)
    assert await posted(base) == [0, 1, 2, 3, 4, 6, 7]


async def test_a_transient_failure_is_retried_until_the_store_answers() -> None:
    base = open_memory_store()
    failures = 3

    async def flaky(operation: str, args: Any, call: Callable[[], Awaitable[Any]]) -> Any:
        nonlocal failures
        if operation == "queues.send" and failures:
            failures -= 1
            raise StoreUnavailable("the store is down")
        return await call()

    outbox = Outbox(intercepted(base, flaky), keys.COMPLETIONS_QUEUE)
    outbox.start()
    await asyncio.wait_for(outbox.post(event(1)), 10)
    await outbox.close()

    assert failures == 0
    assert await posted(base) == [1]


async def test_close_gives_up_by_its_deadline_while_the_store_refuses_every_write() -> None:
    base = open_memory_store()

    async def down(operation: str, args: Any, call: Callable[[], Awaitable[Any]]) -> Any:
        if operation == "queues.send":
            raise StoreUnavailable("the store is down")
        return await call()

    held = await held_message(base)
    outbox = Outbox(intercepted(base, down), keys.COMPLETIONS_QUEUE)
    outbox.start()
    poster = asyncio.create_task(outbox.post(event(1), ack=held))
    await asyncio.sleep(0.2)  # a few tries have failed

    await asyncio.wait_for(outbox.close(0.5), 5)

    with pytest.raises(StoreUnavailable):
        await poster
    assert await left_in(base) == 1  # not acknowledged: it comes back


def started(task: int) -> TaskStarted:
    return TaskStarted(workflow_id="w", task=task, attempt=1, at=1.0)


async def _posted_events(store: Store) -> list[tuple[str, int]]:
    messages = await store.queues.receive(
        keys.COMPLETIONS_QUEUE, max_messages=100, visibility_timeout_s=60
    )
    return [(type(e).__name__, e.task) for m in messages for e in decode_events(m.body)]


async def test_a_start_waits_out_its_linger_even_when_another_completion_goes_out() -> None:
    """A 'started' is not taken along by another task's completion while its own task
    may still end within LINGER_S: a task that ends within it never sends one."""
    store = open_memory_store()
    outbox = Outbox(store, keys.COMPLETIONS_QUEUE)
    outbox.start()
    try:
        outbox.post_nowait(started(2))
        await outbox.post(event(1))  # another task's completion: out at once
        assert await _posted_events(store) == [("TaskFinished", 1)]
        await outbox.post(event(2))  # task 2 ended within the linger: no 'started' at all
        assert await _posted_events(store) == [("TaskFinished", 2)]
    finally:
        await outbox.close()


async def test_a_start_still_running_after_its_linger_goes_out_alone() -> None:
    store = open_memory_store()
    outbox = Outbox(store, keys.COMPLETIONS_QUEUE)
    outbox.start()
    try:
        began = asyncio.get_running_loop().time()
        outbox.post_nowait(started(3))
        found: list[tuple[str, int]] = []
        while not found:
            await store.queues.wait(keys.COMPLETIONS_QUEUE, 5)
            found = await _posted_events(store)
        assert found == [("TaskStarted", 3)]
        assert asyncio.get_running_loop().time() - began >= LINGER_S
    finally:
        await outbox.close()
