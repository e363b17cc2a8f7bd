"""The hand-off: a worker hands its completions to the coordinator of its own process,
which applies them and deletes their task messages in the commit that writes the
states (docs/architecture.md, "Hand-off"); one it cannot commit is posted instead."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from dagq import coordinator as coordinator_module
from dagq import keys
from dagq.client import Client
from dagq.coordinator import Coordinator
from dagq.errors import StoreUnavailable
from dagq.local import LOCAL_COORDINATOR, LocalRunner
from dagq.stores.base import AckOp, BatchOp, FenceOp, PutOp, SendOp, Store
from dagq.stores.intercepting import intercepted
from dagq.stores.memory import open_memory_store
from dagq.stores.sqlite import open_sqlite_store
from dagq.submission import _POSTING, submit
from dagq.submitted import FIRST_STATE_HANDED
from dagq.views import load_run
from dagq.worker import Worker, WorkerOptions
from tests.busy_handover import Busy, submitted_while_busy
from tests.helpers import definition

pytestmark = pytest.mark.timeout(60)

CHAIN: list[dict[str, Any]] = [
    {"name": "a"},
    {"name": "b", "depends_on": ["a"]},
    {"name": "c", "depends_on": ["b"]},
    {"name": "d", "depends_on": ["c"]},
]


def _posted(ops: Sequence[BatchOp]) -> bool:
    """Is this a worker's commit, posting completion events to the queue?"""
    return any(isinstance(op, SendOp) and op.queue == keys.COMPLETIONS_QUEUE for op in ops) and (
        not any(isinstance(op, PutOp) for op in ops)
    )


def _handed(ops: Sequence[BatchOp]) -> bool:
    """Is this a coordinator's commit that deletes task messages (handed-over events')?"""
    return any(isinstance(op, PutOp) for op in ops) and any(
        isinstance(op, AckOp) and op.queue == "default" for op in ops
    )


async def _run(store: Store) -> str:
    runner = LocalRunner(store, workers=2)
    await runner.submit(definition([dict(t) for t in CHAIN]), params={}, workflow_id="w")
    return await asyncio.wait_for(runner.drive(), 40)


async def test_a_run_in_one_process_commits_each_step_once_without_the_completion_queue(
    tmp_path: Path,
) -> None:
    commits: list[Sequence[BatchOp]] = []

    async def note(op: str, args: tuple[Any, ...], call: Callable[[], Awaitable[Any]]) -> Any:
        if op == "batch.commit":
            commits.append(args[0])
        return await call()

    base = open_sqlite_store(tmp_path / "dagq.db")
    store = intercepted(base, note, whole=True)
    try:
        assert await _run(store) == "completed"
        assert not [ops for ops in commits if _posted(ops)]
        assert len([ops for ops in commits if _handed(ops)]) >= len(CHAIN)
        assert (await base.queues.depth("default")).visible == 0  # every task message went
        assert store.handoff is None  # the coordinator stopped: nothing is handed over
    finally:
        await base.close()


async def test_a_hand_over_whose_commit_fails_is_posted_and_the_run_completes(
    tmp_path: Path,
) -> None:
    failed: list[Sequence[BatchOp]] = []
    posted: list[Sequence[BatchOp]] = []

    async def fail_one(op: str, args: tuple[Any, ...], call: Callable[[], Awaitable[Any]]) -> Any:
        if op == "batch.commit":
            if _handed(args[0]) and not failed:
                failed.append(args[0])
                raise StoreUnavailable("injected: the hand-over's commit fails")
            if _posted(args[0]):
                posted.append(args[0])
        return await call()

    base = open_sqlite_store(tmp_path / "dagq.db")
    store = intercepted(base, fail_one, whole=True)
    try:
        assert await _run(store) == "completed"
        assert failed
        # The events of the commit that failed went through the queue instead, with
        # the deletes of their task messages: no task waits for its message to expire.
        assert len(posted) == 1
        assert any(isinstance(op, AckOp) and op.queue == "default" for op in posted[0])
        assert (await base.queues.depth("default")).visible == 0
    finally:
        await base.close()


class _Coordinator:
    """A hand-off that takes what it is given and settles it when told."""

    def __init__(self) -> None:
        self.taken: list[tuple[list[Any], asyncio.Future[list[AckOp] | None]]] = []
        self.preloaded: list[Any] = []

    def preload(self, created: Any) -> bool:
        self.preloaded.append(created)
        return True

    def deliver(
        self, events: list[Any], acks: dict[str, list[str]]
    ) -> asyncio.Future[list[AckOp] | None] | None:
        done: asyncio.Future[list[AckOp] | None] = asyncio.get_running_loop().create_future()
        self.taken.append((events, done))
        return done


async def _wake_ups(store: Store) -> int:
    return (await store.queues.depth(keys.COMPLETIONS_QUEUE)).visible


async def test_a_submit_hands_its_wake_up_over_and_posts_it_only_if_declined() -> None:
    store = open_memory_store()
    coordinator = _Coordinator()
    store.handoff = coordinator
    try:
        await submit(store, definition([{"name": "a"}]), workflow_id="kept")
        await submit(store, definition([{"name": "a"}]), workflow_id="declined")
        assert [events[0].workflow_id for events, _ in coordinator.taken] == ["kept", "declined"]
        assert [c.submitted.workflow_id for c in coordinator.preloaded] == ["kept", "declined"]
        assert await _wake_ups(store) == 0  # handed over: no message
        coordinator.taken[0][1].set_result([])  # committed
        coordinator.taken[1][1].set_result(None)  # declined: posted after all
        await asyncio.sleep(0)  # the futures' callbacks run
        await asyncio.gather(*_POSTING)
        received = await store.queues.receive(
            keys.COMPLETIONS_QUEUE, max_messages=10, visibility_timeout_s=30
        )
        assert len(received) == 1
        message = received[0]
        assert b"declined" in message.body and b"kept" not in message.body
        assert await _wake_ups(store) == 0
        # The state was the coordinator's to write: declined, the submit wrote it
        # before the message; taken, it is left to that coordinator's commit.
        assert await store.documents.get(keys.state("declined")) is not None
        assert await store.documents.get(keys.state("kept")) is None
    finally:
        await store.close()


async def test_a_submit_in_one_transaction_hands_over_its_wake_up_and_what_it_stored(
    tmp_path: Path,
) -> None:
    """Where a submit is one transaction (sqlite), the coordinator of the process is
    handed the wake-up after it (no message) and the workflow as stored: it starts it
    without reading back definition, quarantine record or state. Declined, the wake-up
    is posted."""
    store = open_sqlite_store(tmp_path / "dagq.db")
    coordinator = _Coordinator()
    store.handoff = coordinator
    try:
        await submit(store, definition([{"name": "a"}]), workflow_id="kept")
        await submit(store, definition([{"name": "a"}]), workflow_id="declined")
        assert [events[0].workflow_id for events, _ in coordinator.taken] == ["kept", "declined"]
        created = coordinator.preloaded[0]
        stored = await store.documents.get(keys.state("kept"))
        assert stored is not None and created.etag == stored.etag
        assert created.state.status == "pending"
        assert await _wake_ups(store) == 0
        coordinator.taken[0][1].set_result([])
        coordinator.taken[1][1].set_result(None)
        await asyncio.sleep(0)
        await asyncio.gather(*_POSTING)
        received = await store.queues.receive(
            keys.COMPLETIONS_QUEUE, max_messages=10, visibility_timeout_s=30
        )
        assert [b"declined" in m.body and b"kept" not in m.body for m in received] == [True]
    finally:
        await store.close()


async def test_a_run_submitted_in_its_coordinators_process_is_run_without_reading_it_back(
    tmp_path: Path,
) -> None:
    reads: list[str] = []

    async def note(op: str, args: tuple[Any, ...], call: Callable[[], Awaitable[Any]]) -> Any:
        if op == "documents.get":
            reads.append(args[0])
        return await call()

    base = open_sqlite_store(tmp_path / "dagq.db")
    store = intercepted(base, note, whole=True)
    coordinator = Coordinator(store, LOCAL_COORDINATOR)
    worker = Worker(store, WorkerOptions(queues=("default",), concurrency=2, poll_interval_s=0.05))
    stop = asyncio.Event()
    running = [asyncio.create_task(coordinator.run(stop)), asyncio.create_task(worker.run(stop))]
    client = Client(store)

    async def completed(workflow_id: str) -> None:
        while True:  # the working copy is completed before its commit lands: both
            settled = await coordinator.settled_state(workflow_id)
            row = await store.index.get(workflow_id)
            ran = settled is not None and settled.status == "completed"
            if ran and row is not None and row.status == "completed":
                return
            coordinator.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(coordinator.changed.wait(), 1)

    try:
        # A first run while the coordinator starts: its first sweep's rescan of the
        # index may start it before the hand-over does (read back then, as before).
        await client.submit(definition([{"name": "a"}]), workflow_id="first")
        await completed("first")
        await client.submit(definition([dict(t) for t in CHAIN]), workflow_id="w")
        await completed("w")
        assert not [key for key in reads if key.endswith("/w")]
    finally:
        stop.set()
        await asyncio.gather(*running, return_exceptions=True)
        await base.close()


async def test_a_step_takes_at_most_a_batch_of_handed_over_events(tmp_path: Path) -> None:
    """Submits handed over while the coordinator is busy pile up; each step takes up to
    ``batch_size`` events of them, the next step the rest."""
    gate = asyncio.Event()
    states_per_commit: list[int] = []

    async def hold(op: str, args: tuple[Any, ...], call: Callable[[], Awaitable[Any]]) -> Any:
        if op == "batch.commit" and any(isinstance(o, FenceOp) for o in args[0]):
            await gate.wait()  # the coordinator's commits wait while the submits go on
            states = [o for o in args[0] if isinstance(o, PutOp) and o.key.startswith("states/")]
            states_per_commit.append(len(states))
        return await call()

    base = open_sqlite_store(tmp_path / "dagq.db")
    store = intercepted(base, hold, whole=True)
    options = dataclasses.replace(LOCAL_COORDINATOR, batch_size=4)
    coordinator = Coordinator(store, options)
    stop = asyncio.Event()
    running = asyncio.create_task(coordinator.run(stop))
    try:
        while store.handoff is not coordinator:
            await asyncio.sleep(0.01)
        client = Client(store)
        ids = [f"w{i}" for i in range(10)]
        for workflow_id in ids:  # no worker: each run waits at its first task
            await client.submit(definition([{"name": "a"}]), workflow_id=workflow_id)
        gate.set()
        while sum(states_per_commit) < len(ids):  # every run started (its state written)
            coordinator.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(coordinator.changed.wait(), 1)
        assert max(states_per_commit) <= 4
        for workflow_id in ids:
            assert (await coordinator.settled_state(workflow_id)).status == "running"  # type: ignore[union-attr]
    finally:
        gate.set()
        stop.set()
        await asyncio.gather(running, return_exceptions=True)
        await base.close()


async def test_a_submit_that_hands_over_its_first_state_is_started_by_a_rescan_if_lost() -> None:
    store = open_memory_store()
    lost = _Coordinator()  # takes the workflow, then its process "dies"
    store.handoff = lost
    await submit(store, definition([{"name": "a"}]), workflow_id="w")
    store.handoff = None
    row = await store.index.get("w")
    assert row is not None and row.data.get(FIRST_STATE_HANDED)
    assert await store.documents.get(keys.state("w")) is None
    # A reader meanwhile sees it pending, as it is.
    _, _, pending = await load_run(store, "w")
    assert pending.status == "pending"

    coordinator = Coordinator(store)
    await coordinator.lease.acquire()
    await coordinator.rescan()
    assert await coordinator.settled_state("w") is not None
    _, _, started = await load_run(store, "w")
    assert started.status == "running"
    await store.close()


@pytest.mark.parametrize(
    ("bound", "preloads", "cache_size", "runs"),
    [
        ("preloaded copies", 8, 2000, 21),  # 20 piled up: 8 kept, 12 written by the submit
        ("state cache", 4096, 8, 41),  # 40 piled up, loaded by one step: 5 times the cache
    ],
)
async def test_more_new_runs_handed_over_while_busy_than_kept_all_start_without_a_rescan(
    bound: str, preloads: int, cache_size: int, runs: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loop of submits while the coordinator is busy hands over more new runs, their
    states unwritten (memory, Azure), than it keeps copies of, or than its state cache
    holds when a step loads them. Such a copy is the only one of that state: dropped,
    the run's wake-up found no state and was dropped too, the run left for the
    periodic rescan. None is: a preload beyond the bound is declined (the submit
    writes the state itself), and no eviction takes a state not written yet. The
    rescan is out of reach here (it would hide a lost run)."""
    monkeypatch.setattr(coordinator_module, "_PRELOADED", preloads)
    busy = Busy(open_memory_store())
    options = dataclasses.replace(
        LOCAL_COORDINATOR, cache_size=cache_size, rescan_interval_s=3600.0
    )
    ids = [f"w{i}" for i in range(runs)]
    try:
        outcome = await submitted_while_busy(busy, Coordinator(busy.store, options), ids)
        assert outcome.unstarted == [], f"{bound}: {len(outcome.unstarted)} never started"
        assert outcome.rescans == 1  # the first, before any submit
        # Past the bound, each submit wrote its state itself; the first were kept.
        assert outcome.written_by_submit == ids[1 + min(preloads, runs - 1) :]
        assert outcome.handed == ids[1:]
    finally:
        await busy.base.close()


async def test_a_submit_declined_before_its_step_loaded_it_is_started_by_a_rescan() -> None:
    """An outage: the step that took a submit's wake-up fails before it loads the run,
    and the submit's post of the state and wake-up fails too. The copy the coordinator
    kept goes with the declined wake-up, so a rescan (which passes by a run whose copy
    is kept, for its step to start) starts it."""
    down = False

    async def outage(op: str, args: tuple[Any, ...], call: Callable[[], Awaitable[Any]]) -> Any:
        if down and not op.startswith("leases."):
            raise StoreUnavailable(f"injected: {op}")
        return await call()

    base = open_memory_store()
    store = intercepted(base, outage)
    coordinator = Coordinator(store)
    try:
        await coordinator.lease.acquire()
        store.handoff = coordinator  # memory: set by hand (Azure's coordinator sets it)
        await submit(store, definition([{"name": "a"}]), workflow_id="w")
        assert await base.documents.get(keys.state("w")) is None  # left to the coordinator
        down = True
        with pytest.raises(StoreUnavailable):
            await coordinator.step()  # its receive fails: the wake-up is declined
        await asyncio.sleep(0)  # the declined future's callback starts the post
        await asyncio.gather(*_POSTING)  # which fails (logged: "a rescan starts it")
        assert await base.documents.get(keys.state("w")) is None
        down = False
        await coordinator.rescan()
        started = await coordinator.settled_state("w")
        assert started is not None and started.status == "running"
    finally:
        store.handoff = None
        await base.close()
