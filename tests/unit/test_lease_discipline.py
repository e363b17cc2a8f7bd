"""Lease discipline: a coordinator writes and acknowledges only while surely holding
its lease; a stale working copy never drops a completion; a dead or stuck lease keeper
stops the coordinator; ``dagq run`` takes over a lease that becomes free."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from dagq import keys, leasing
from dagq.coordinator import Coordinator, CoordinatorOptions
from dagq.errors import LeaseLost
from dagq.leasing import holder_is_dead_here
from dagq.local import LocalRunner
from dagq.messages import TaskFinished, decode_task, encode_events
from dagq.persistence import read_state
from dagq.state import TaskStatus
from dagq.stores.base import OutgoingMessage, Store
from dagq.stores.memory import open_memory_store
from dagq.stores.sqlite import open_sqlite_store
from dagq.submission import submit
from dagq.supervision import BackgroundFailed
from tests.helpers import definition

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    if request.param == "memory":
        opened = open_memory_store()
    else:
        opened = open_sqlite_store(f"sqlite:///{tmp_path / 'dagq.db'}")
    yield opened
    await opened.close()


def chain() -> Any:
    return definition([{"name": "a"}, {"name": "b", "depends_on": ["a"]}])


async def finish_queued(store: Store) -> None:
    """Run every queued task: post its completion."""
    messages = await store.queues.receive("default", max_messages=100, visibility_timeout_s=60)
    events = [
        TaskFinished(workflow_id=t.workflow_id, task=t.task, attempt=t.attempt, at=0.0, ok=True)
        for t in (decode_task(m.body) for m in messages)
    ]
    assert events, "a task was queued"
    body = encode_events(list(events))
    await store.queues.send(keys.COMPLETIONS_QUEUE, [OutgoingMessage(body)])


async def task_status(store: Store, plan: Any, name: str) -> TaskStatus:
    found = await read_state(store, "w", plan)
    assert found is not None
    return found[0].status_of(plan.by_name[name])


async def test_a_coordinator_whose_lease_was_broken_writes_and_acknowledges_nothing(
    store: Store,
) -> None:
    result = await submit(store, chain(), workflow_id="w")
    old = Coordinator(store)
    await old.lease.acquire()
    await old.step()  # 'a' is sent
    await store.leases.acquire(keys.COORDINATOR_LEASE, "newcomer", 30.0, force=True)
    await finish_queued(store)

    with pytest.raises(LeaseLost):
        await old.step()

    assert await task_status(store, result.plan, "a") != TaskStatus.COMPLETED
    depth = await store.queues.depth(keys.COMPLETIONS_QUEUE)
    assert depth.visible + depth.invisible == 1  # not acknowledged: the holder applies it


async def test_a_coordinator_stops_once_its_lease_may_have_expired_by_its_own_clock(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = await submit(store, chain(), workflow_id="w")
    coord = Coordinator(store, CoordinatorOptions(lease_ttl_s=3.0))
    await coord.lease.acquire()
    await coord.step()
    await finish_queued(store)
    later = time.monotonic() + 3.0  # no renewal for a whole TTL (a hung store call)
    monkeypatch.setattr(leasing.time, "monotonic", lambda: later)

    with pytest.raises(LeaseLost, match="may have expired"):
        await coord.step()

    assert await task_status(store, result.plan, "a") != TaskStatus.COMPLETED


async def test_a_completion_a_stale_working_copy_cannot_place_is_read_again(
    store: Store,
) -> None:
    # A coordinator whose lease was taken over while it ran (--break-lease) still
    # holds an old copy: the newcomer sent 'b', whose completion reaches the old one.
    result = await submit(store, chain(), workflow_id="w")
    old, new = Coordinator(store), Coordinator(store)
    await old.step()  # old sends 'a' and caches the workflow
    await finish_queued(store)
    await new.step()  # new applies 'a' and sends 'b'
    await finish_queued(store)

    await old.step()  # 'b' finished: an attempt old never sent

    assert await task_status(store, result.plan, "b") == TaskStatus.COMPLETED
    found = await read_state(store, "w", result.plan)
    assert found is not None and found[0].status == "completed"
    assert old.stats.rereads == 1


async def test_a_dead_lease_keeper_stops_the_coordinator_with_a_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = open_memory_store()

    async def broken(lease: Any, ttl_s: float) -> Any:
        raise RuntimeError("a bug in the renewal")

    monkeypatch.setattr(store.leases, "renew", broken)
    coord = Coordinator(store, CoordinatorOptions(lease_ttl_s=0.3, poll_interval_s=0.05))

    with pytest.raises(BackgroundFailed, match=r"lease-keeper.*a bug in the renewal"):
        await asyncio.wait_for(coord.run(asyncio.Event()), 10)
    assert coord.lease.lost


async def test_a_hung_renewal_stops_the_coordinator_before_the_lease_expires(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = open_memory_store()

    async def hung(lease: Any, ttl_s: float) -> Any:
        await asyncio.Event().wait()

    monkeypatch.setattr(store.leases, "renew", hung)
    coord = Coordinator(store, CoordinatorOptions(lease_ttl_s=2.0, poll_interval_s=0.05))
    began = time.monotonic()

    with pytest.raises(LeaseLost, match="may have expired"):
        await asyncio.wait_for(coord.run(asyncio.Event()), 10)
    assert time.monotonic() - began < 2.0  # before the lease could lapse


def test_a_killed_process_not_yet_reaped_is_a_dead_holder() -> None:
    process = subprocess.Popen(["sleep", "30"])
    try:
        os.kill(process.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        stat = Path(f"/proc/{process.pid}/stat")
        while stat.read_text().rpartition(")")[2].split()[0] != "Z":
            assert time.monotonic() < deadline, "the process never became a zombie"
            time.sleep(0.01)

        assert holder_is_dead_here(f"{socket.gethostname()}:{process.pid}:feed")
    finally:
        process.wait()


async def test_dagq_run_takes_over_when_the_lease_holder_stops() -> None:
    store = open_memory_store()
    holder = await store.leases.acquire(keys.COORDINATOR_LEASE, "elsewhere:1:feed", 60.0)
    runner = LocalRunner(store, workers=2)
    await runner.submit(chain(), params={}, workflow_id="w")
    driving = asyncio.create_task(runner.drive())
    await asyncio.sleep(0.3)
    assert not driving.done()  # another coordinator holds the lease: workers only

    await store.leases.release(holder)  # that coordinator stops

    assert await asyncio.wait_for(driving, 20) == "completed"
