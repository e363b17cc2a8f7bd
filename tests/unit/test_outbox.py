"""The worker's outbox: events go out in batches with the deletes they allow, in order;
closing it never abandons a batch on its way."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from dagq import keys
from dagq.messages import TaskFinished, decode_events
from dagq.outbox import Outbox
from dagq.stores.base import OutgoingMessage
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
