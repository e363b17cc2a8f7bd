"""Containment in the coordinator: one workflow's failure quarantines it alone.

On the memory store with a fake clock; the "worker" here takes task messages and
posts their completions, all in ONE completion message, so a bad workflow's events
always travel with innocent ones.
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec
import pytest

from dagq import keys, machine, quarantine, snapshots
from dagq.client import Client
from dagq.coordinator import Coordinator, CoordinatorOptions
from dagq.errors import StoreUnavailable
from dagq.messages import Event, TaskFinished, decode_task, encode_events
from dagq.persistence import read_state
from dagq.state import QUARANTINED
from dagq.stores.base import OutgoingMessage, Store
from dagq.stores.memory import open_memory_store
from dagq.submission import submit
from tests.conformance.conftest import FakeClock
from tests.helpers import definition

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(clock: FakeClock) -> Store:
    return open_memory_store(clock=clock)


def chain(name: str = "chain") -> Any:
    return definition([{"name": "a"}, {"name": "b", "depends_on": ["a"]}], name=name)


async def work(store: Store, clock: FakeClock) -> int:
    """Run every queued task at once: one completion message for all of them."""
    messages = await store.queues.receive("default", max_messages=1000, visibility_timeout_s=60)
    tasks = [decode_task(m.body) for m in messages]
    if tasks:
        events: list[Event] = [
            TaskFinished(
                workflow_id=t.workflow_id, task=t.task, attempt=t.attempt, at=clock(), ok=True
            )
            for t in tasks
        ]
        await post(store, *events)
        await store.queues.delete("default", [m.receipt for m in messages])
    return len(tasks)


async def post(store: Store, *events: Event) -> None:
    await store.queues.send(keys.COMPLETIONS_QUEUE, [OutgoingMessage(encode_events(list(events)))])


async def status(store: Store, workflow_id: str) -> str:
    return (await Client(store).status(workflow_id)).status


async def drive(coord: Coordinator, store: Store, clock: FakeClock, rounds: int = 10) -> None:
    for _ in range(rounds):
        await coord.step()
        await work(store, clock)
        clock.advance(0.1)


async def completions_left(store: Store) -> int:
    depth = await store.queues.depth(keys.COMPLETIONS_QUEUE)
    return depth.visible + depth.invisible


async def header_referring_to_a_missing_part(store: Store, workflow_id: str) -> bytes:
    doc = await store.documents.get(keys.state(workflow_id))
    assert doc is not None
    head = snapshots.decode_header(doc.data)
    head.inline = None
    head.base = keys.state_part(workflow_id, "base-gone")
    return snapshots.encode_header(head)


DAMAGES = {
    "bad msgpack": lambda _s, _w: b"r\xc1\xc1\xc1",
    "bad zlib": lambda _s, _w: b"zthis is not zlib",
    "empty": lambda _s, _w: b"",
    "missing part": header_referring_to_a_missing_part,
}


@pytest.mark.parametrize("damage", list(DAMAGES), ids=list(DAMAGES))
async def test_a_damaged_state_quarantines_its_workflow_and_every_other_goes_on(
    store: Store, clock: FakeClock, damage: str
) -> None:
    await submit(store, chain(), workflow_id="good", clock=clock)
    await submit(store, chain(), workflow_id="bad", clock=clock)
    first = Coordinator(store, clock=clock)
    await first.step()  # both started: their first tasks are queued
    make = DAMAGES[damage]
    found = make(store, "bad")
    data = found if isinstance(found, bytes) else await found
    await store.documents.put(keys.state("bad"), data)

    # A restart: a coordinator that has nothing cached, as after a crash.
    coord = Coordinator(store, clock=clock)
    await drive(coord, store, clock)

    assert await status(store, "good") == "completed"
    row = await store.index.get("bad")
    assert row is not None and row.status == QUARANTINED
    assert "load failed" in row.data["error"]
    held = await quarantine.read(store, "bad")
    assert held is not None and held[0].count == 1  # its completion is kept, not lost
    assert await completions_left(store) == 0  # the shared message was acknowledged
    assert await store.queues.dead_letters(None) == []
    assert coord.stats.quarantined == 1


async def test_a_damaged_definition_quarantines_its_workflow(
    store: Store, clock: FakeClock
) -> None:
    await submit(store, chain(), workflow_id="good", clock=clock)
    await submit(store, chain(), workflow_id="bad", clock=clock)
    await store.documents.put(keys.definition("bad"), b'{"not": "a definition"')
    coord = Coordinator(store, clock=clock)

    await drive(coord, store, clock)

    assert await status(store, "good") == "completed"
    quarantined = await Client(store).quarantined()
    assert [(q.id, q.step) for q in quarantined] == [("bad", "load")]
    assert await completions_left(store) == 0


async def test_events_for_a_quarantined_workflow_are_kept_and_acknowledged(
    store: Store, clock: FakeClock
) -> None:
    await submit(store, chain(), workflow_id="good", clock=clock)
    await submit(store, chain(), workflow_id="bad", clock=clock)
    coord = Coordinator(store, clock=clock)
    await coord.step()
    await store.documents.put(keys.state("bad"), b"zdamaged")
    coord = Coordinator(store, clock=clock)
    await drive(coord, store, clock)

    for n in range(3):  # e.g. late events, a cancel, a signal: all kept, in order
        await post(store, TaskFinished(workflow_id="bad", task=0, attempt=1, at=n, ok=True))
        await coord.step()

    held = await quarantine.read(store, "bad")
    assert held is not None
    assert held[0].count == 4
    assert [e.at for e in quarantine.kept_events(held[0])][1:] == [0, 1, 2]
    assert await completions_left(store) == 0


async def test_release_applies_the_kept_events_first_and_the_workflow_finishes(
    store: Store, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    await submit(store, chain(), workflow_id="good", clock=clock)
    await submit(store, chain(), workflow_id="bad", clock=clock)
    real_apply = machine.apply

    def broken(plan: Any, state: Any, event: Any, now: float, fx: Any) -> None:
        if state.workflow_id == "bad" and isinstance(event, TaskFinished):
            raise KeyError("a bug met while applying")
        real_apply(plan, state, event, now, fx)

    monkeypatch.setattr(machine, "apply", broken)
    coord = Coordinator(store, clock=clock)
    await drive(coord, store, clock)
    assert await status(store, "good") == "completed"
    assert await status(store, "bad") == QUARANTINED
    assert "apply failed: KeyError" in ((await Client(store).status("bad")).error or "")

    monkeypatch.setattr(machine, "apply", real_apply)  # the bug is fixed
    await Client(store).release("bad")
    await drive(coord, store, clock)

    assert await status(store, "bad") == "completed"
    assert await quarantine.read(store, "bad") is None
    row = await store.index.get("bad")
    assert row is not None and row.status == "completed"


async def test_release_of_a_workflow_still_broken_quarantines_it_again_keeping_its_events(
    store: Store, clock: FakeClock
) -> None:
    await submit(store, chain(), workflow_id="bad", clock=clock)
    coord = Coordinator(store, clock=clock)
    await coord.step()
    await store.documents.put(keys.state("bad"), b"zdamaged")
    coord = Coordinator(store, clock=clock)
    await drive(coord, store, clock)

    await Client(store).release("bad")
    await drive(coord, store, clock)

    held = await quarantine.read(store, "bad")
    assert held is not None and held[0].released_at is None
    assert held[0].count == 2  # the first completion, and the release's wake-up
    assert await status(store, "bad") == QUARANTINED


async def test_a_failure_while_settling_quarantines_after_the_write(
    store: Store, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dagq import coordinator as module

    real = module.settle_state

    async def broken(store_: Store, state: Any, staged: Any, etags: list[str]) -> Any:
        if state.workflow_id == "bad":
            raise RuntimeError("boom after the commit")
        return await real(store_, state, staged, etags)

    monkeypatch.setattr(module, "settle_state", broken)
    await submit(store, chain(), workflow_id="good", clock=clock)
    await submit(store, chain(), workflow_id="bad", clock=clock)
    coord = Coordinator(store, clock=clock)
    await drive(coord, store, clock)

    assert await status(store, "good") == "completed"
    assert await status(store, "bad") == QUARANTINED
    assert await completions_left(store) == 0


async def test_a_transient_error_is_retried_never_quarantined(
    store: Store, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    await submit(store, chain(), workflow_id="w", clock=clock)
    real_get = store.documents.get
    failures = 3

    async def flaky(key: str) -> Any:
        nonlocal failures
        if key == keys.state("w") and failures:
            failures -= 1
            raise StoreUnavailable("throttled")
        return await real_get(key)

    monkeypatch.setattr(store.documents, "get", flaky)
    coord = Coordinator(store, CoordinatorOptions(event_visibility_s=0.0), clock=clock)
    await drive(coord, store, clock, rounds=12)

    assert await status(store, "w") == "completed"
    assert await quarantine.read(store, "w") is None


async def test_status_of_a_quarantined_workflow_whose_state_cannot_be_read(
    store: Store, clock: FakeClock
) -> None:
    await submit(store, chain(name="pipeline"), workflow_id="bad", clock=clock)
    await store.documents.put(keys.state("bad"), b"zdamaged")
    coord = Coordinator(store, clock=clock)
    await drive(coord, store, clock)

    shown = await Client(store).status("bad")

    assert shown.status == QUARANTINED and shown.quarantined and not shown.terminal
    assert shown.name == "pipeline"
    assert shown.error is not None and shown.error.startswith("quarantined: load failed")
    encoded = msgspec.json.decode(msgspec.json.encode(shown))
    assert encoded["status"] == QUARANTINED
    listed = await Client(store).list(status=QUARANTINED)
    assert [row.id for row in listed] == ["bad"]


async def test_the_coordinator_logs_the_quarantine_once_with_the_fix(
    store: Store, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    await submit(store, chain(), workflow_id="bad", clock=clock)
    await store.documents.put(keys.state("bad"), b"zdamaged")
    coord = Coordinator(store, clock=clock)

    with caplog.at_level(logging.INFO, logger="dagq.coordinator"):
        await drive(coord, store, clock)
        await post(store, TaskFinished(workflow_id="bad", task=0, attempt=1, at=0, ok=True))
        await drive(coord, store, clock)

    said = [r.getMessage() for r in caplog.records if "quarantined" in r.getMessage()]
    assert len(said) == 1
    assert "dagq quarantine release bad" in said[0]


async def test_read_state_still_works_for_the_healthy_ones_after_a_quarantine(
    store: Store, clock: FakeClock
) -> None:
    # The quarantine never writes into anyone's state document.
    result = await submit(store, chain(), workflow_id="good", clock=clock)
    await submit(store, chain(), workflow_id="bad", clock=clock)
    await store.documents.put(keys.state("bad"), b"zdamaged")
    coord = Coordinator(store, clock=clock)
    await drive(coord, store, clock)
    found = await read_state(store, "good", result.plan)
    assert found is not None and found[0].status == "completed"
    doc = await store.documents.get(keys.state("bad"))
    assert doc is not None and doc.data == b"zdamaged"


async def test_a_damaged_quarantine_record_is_listed_as_such_and_release_deletes_it(
    store: Store, clock: FakeClock
) -> None:
    for wid in ("bad", "other"):
        await submit(store, chain(), workflow_id=wid, clock=clock)
    coord = Coordinator(store, clock=clock)
    await coord.step()
    for wid in ("bad", "other"):
        await store.documents.put(keys.state(wid), b"zdamaged")
    coord = Coordinator(store, clock=clock)
    await drive(coord, store, clock)
    assert sorted(q.id for q in await Client(store).quarantined()) == ["bad", "other"]
    await store.documents.put(keys.quarantine("bad"), b"\xff\x00\xff")

    listed = {q.id: q for q in await Client(store).quarantined()}
    assert (listed["bad"].damaged, listed["other"].damaged) == (True, False)
    assert "dagq quarantine release bad deletes it" in listed["bad"].reason
    shown = await Client(store).status("bad")
    assert shown.status == QUARANTINED
    assert "the quarantine record of bad is damaged" in (shown.error or "")

    released = await Client(store).release("bad")
    assert (released.damaged, released.released) == (True, True)
    assert await store.documents.get(keys.quarantine("bad")) is None
    await drive(coord, store, clock)  # loaded again: its state is still damaged

    held = await quarantine.read(store, "bad")
    assert held is not None and held[0].reason.startswith("load failed")
    assert await status(store, "bad") == QUARANTINED
