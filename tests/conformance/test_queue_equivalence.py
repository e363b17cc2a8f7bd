"""Random sequences of queue calls give the same answers on every backend.

The memory backend stands in for the durable ones in fast tests, so it must not
drift from them: hypothesis drives every backend that runs on a fake clock through
the same calls on the same fake clock and compares everything observable. (azure
keeps real time and does not deduplicate by id, so it cannot answer identically; the
contract tests hold it to the rules instead.)
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dagq.stores.base import Message, OutgoingMessage, Store

Factories = dict[str, Callable[[Path, Any, int], Awaitable[Store]]]


class FakeClock(Protocol):
    def __call__(self) -> float: ...

    def advance(self, seconds: float) -> None: ...


ids = st.one_of(st.none(), st.sampled_from("abcd"))
operations = st.lists(
    st.one_of(
        st.tuples(st.just("send"), st.lists(st.tuples(ids, st.sampled_from([0, 5])), max_size=3)),
        st.tuples(st.just("receive"), st.integers(1, 3), st.sampled_from([0, 5, 10])),
        # Receives that hide nothing make redeliveries and dead letters common.
        st.tuples(st.just("receive"), st.integers(1, 3), st.just(0)),
        st.tuples(st.just("delete"), st.integers(0, 20)),
        st.tuples(st.just("extend"), st.integers(0, 20), st.sampled_from([0, 5, 10])),
        st.tuples(st.just("dead_letter"), st.integers(0, 20)),
        st.tuples(st.just("advance"), st.sampled_from([1, 5, 10])),
        st.tuples(st.just("depth")),
    ),
    min_size=3,
    max_size=40,
)


def seen(message: Message) -> tuple[str, bytes, int]:
    # Ids the store made up are random; only the ones we chose can be compared.
    return (message.id if len(message.id) == 1 else "*", message.body, message.dequeue_count)


class Driver:
    """Applies operations to one store and records what it observed."""

    def __init__(self, store: Store, clock: FakeClock) -> None:
        self.store = store
        self.clock = clock
        self.receipts: list[str] = []
        self.sent = 0

    async def apply(self, operation: tuple[Any, ...]) -> object:
        kind, *args = operation
        try:
            return await getattr(self, kind)(*args)
        except Exception as exc:
            return type(exc).__name__

    async def send(self, messages: list[tuple[str | None, float]]) -> None:
        outgoing = []
        for message_id, delay in messages:
            self.sent += 1
            outgoing.append(OutgoingMessage(str(self.sent).encode(), message_id, delay))
        await self.store.queues.send("q", outgoing)

    async def receive(self, most: int, visibility: float) -> list[tuple[str, bytes, int]]:
        messages = await self.store.queues.receive(
            "q", max_messages=most, visibility_timeout_s=visibility
        )
        self.receipts.extend(m.receipt for m in messages)
        return [seen(m) for m in messages]

    def receipt(self, index: int) -> str:
        return self.receipts[index % len(self.receipts)] if self.receipts else "none"

    async def delete(self, index: int) -> int:
        return await self.store.queues.delete("q", [self.receipt(index)])

    async def extend(self, index: int, visibility: float) -> None:
        self.receipts.append(await self.store.queues.extend("q", self.receipt(index), visibility))

    async def dead_letter(self, index: int) -> None:
        await self.store.queues.dead_letter("q", self.receipt(index), "test")

    async def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    async def depth(self) -> object:
        return await self.store.queues.depth("q")

    async def dead_letters(self) -> list[tuple[str, bytes, int, str]]:
        dead = await self.store.queues.dead_letters("q")
        return [(d.id if len(d.id) == 1 else "*", d.body, d.dequeue_count, d.reason) for d in dead]


async def observe(
    open_store: Callable[[Path, Any, int], Awaitable[Store]],
    clock: FakeClock,
    directory: Path,
    ops: list[tuple[Any, ...]],
) -> list[object]:
    store = await open_store(directory, clock, 2)
    driver = Driver(store, clock)
    try:
        return [await driver.apply(op) for op in ops] + [await driver.dead_letters()]
    finally:
        await store.close()


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(ops=operations)
def test_every_backend_answers_queue_calls_like_the_memory_backend(
    store_factories: Factories, clock_type: Callable[[], FakeClock], ops: list[tuple[Any, ...]]
) -> None:
    results = {}
    for backend, open_store in store_factories.items():
        with tempfile.TemporaryDirectory() as directory:
            results[backend] = asyncio.run(observe(open_store, clock_type(), Path(directory), ops))
    expected = results.pop("memory")
    for backend, observed in results.items():
        assert observed == expected, backend
