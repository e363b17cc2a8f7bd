"""The audit trail: who asked for a submit, cancel, retry or signal is in the run's
history (memory store, fake clock, a real coordinator); chunks written before the
``actor`` field existed still read."""

from __future__ import annotations

import getpass

import msgspec
import pytest

from dagq.client import Client
from dagq.coordinator import Coordinator, CoordinatorOptions
from dagq.history import HistoryEntry, read_history
from dagq.stores.base import Store
from dagq.stores.memory import open_memory_store
from dagq.submitted import load_submitted
from tests.conformance.conftest import FakeClock
from tests.helpers import definition
from tests.unit.test_containment import work

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(clock: FakeClock) -> Store:
    return open_memory_store(clock=clock)


async def actors(store: Store, workflow_id: str) -> list[tuple[str, str | None]]:
    return [(e.kind, e.actor) for e in await read_history(store, workflow_id)]


async def test_a_run_started_by_a_rescan_still_names_who_submitted_it(
    store: Store, clock: FakeClock
) -> None:
    client = Client(store)
    # its submit event lost: the coordinator's rescan of the index starts it
    await client.submit(definition([{"name": "a"}]), workflow_id="w", actor="token:ci:abc")
    await store.queues.receive("_completions", max_messages=10, visibility_timeout_s=3600)
    coord = Coordinator(store, CoordinatorOptions(), clock=clock)
    await coord.sweep()
    await work(store, clock)
    await coord.step()
    history = await actors(store, "w")
    assert history[0] == ("submitted", "token:ci:abc")
    assert all(actor is None for kind, actor in history[1:]), history


async def test_cancel_retry_and_signal_record_who_asked(store: Store, clock: FakeClock) -> None:
    client = Client(store)
    gated = definition([{"name": "gate", "wait_for": {"signal": "go"}}, {"name": "b"}])
    await client.submit(gated, workflow_id="w", actor="cli:ann")
    coord = Coordinator(store, CoordinatorOptions(), clock=clock)
    await coord.step()
    await client.signal("w", "go", {"ok": True}, actor="token:bob:123")
    await client.cancel("w", "enough", actor="python:cy")
    for _ in range(3):
        await coord.step()
        await work(store, clock)
    assert (await client.status("w")).status == "cancelled"
    await client.retry("w", ack_timeout_s=0, actor="token:dee:456")
    await coord.step()

    asked = [(k, a) for k, a in await actors(store, "w") if a is not None]
    assert asked == [
        ("submitted", "cli:ann"),
        ("signal", "token:bob:123"),
        ("cancel_requested", "python:cy"),
        ("retry_requested", "token:dee:456"),
    ]


async def test_the_client_names_the_os_user_when_not_told(store: Store) -> None:
    await Client(store).submit(definition([{"name": "a"}]), workflow_id="w")
    found = await load_submitted(store, "w")
    assert found is not None and found.submitted_by == f"python:{getpass.getuser()}"


def test_a_chunk_written_before_actors_existed_still_reads() -> None:
    class OldEntry(msgspec.Struct, array_like=True):
        at: float
        kind: str
        task: str | None = None
        attempt: int = 0
        detail: str | None = None

    old = msgspec.msgpack.encode([OldEntry(1.0, "cancel_requested", None, 0, "why")])
    [entry] = msgspec.msgpack.decode(old, type=list[HistoryEntry])
    assert entry == HistoryEntry(1.0, "cancel_requested", None, 0, "why", None)
