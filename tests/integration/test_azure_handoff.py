"""The hand-off on the azure store (a real Azurite): its batches are phases, not one
transaction, but the acks go only after the states, so a coordinator in the workers'
process takes their completions and a submit's wake-up without the completion queue;
a commit that fails part way has them posted instead, and the run still completes."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest

from dagq import coordinator as coordinator_module
from dagq import keys
from dagq.coordinator import Coordinator, CoordinatorOptions
from dagq.errors import StoreUnavailable
from dagq.local import LocalRunner
from dagq.stores.azure import open_azure_store
from dagq.stores.base import OutgoingMessage, Store, takes_handoff
from dagq.stores.intercepting import intercepted
from dagq.submission import submit
from dagq.worker import Worker, WorkerOptions
from tests.busy_handover import Busy, submitted_while_busy
from tests.conftest import azure_prefix
from tests.helpers import definition

pytestmark = pytest.mark.timeout(120)

CHAIN: list[dict[str, Any]] = [
    {"name": "a"},
    {"name": "b", "depends_on": ["a"]},
    {"name": "c", "depends_on": ["b"]},
]

Hook = Callable[[str, tuple[Any, ...], Callable[[], Awaitable[Any]]], Awaitable[Any]]


def _open(hook: Hook) -> tuple[Store, Store]:
    base = open_azure_store(f"azure://devstoreaccount1/{azure_prefix()}", environ={})
    return base, intercepted(base, hook)


async def _run(store: Store, workflow_id: str = "w") -> str:
    runner = LocalRunner(store, workers=2)
    await runner.submit(definition([dict(t) for t in CHAIN]), params={}, workflow_id=workflow_id)
    return await asyncio.wait_for(runner.drive(), 90)


def _completions(args: tuple[Any, ...]) -> int:
    queue, messages = args[0], args[1]
    return len(messages) if queue == keys.COMPLETIONS_QUEUE else 0


async def test_a_run_in_one_process_posts_nothing_to_the_completion_queue(
    azurite: object,
) -> None:
    posted: list[Sequence[OutgoingMessage]] = []

    async def note(op: str, args: tuple[Any, ...], call: Callable[[], Awaitable[Any]]) -> Any:
        if op == "queues.send" and _completions(args):
            posted.append(args[1])
        return await call()

    base, store = _open(note)
    stop = asyncio.Event()
    coordinator = Coordinator(store, CoordinatorOptions(poll_interval_s=0.05))
    worker = Worker(store, WorkerOptions(queues=("default",), poll_interval_s=0.05))
    running = [asyncio.create_task(coordinator.run(stop)), asyncio.create_task(worker.run(stop))]
    try:
        assert takes_handoff(store.committer)
        while store.handoff is None:  # the coordinator holds the lease
            await asyncio.sleep(0.01)
        ids = [f"w{i}" for i in range(2)]
        for workflow_id in ids:  # handed over: their wake-ups are no messages
            await submit(store, definition([dict(t) for t in CHAIN]), workflow_id=workflow_id)
        for workflow_id in ids:
            while (row := await base.index.get(workflow_id)) is None or row.status != "completed":
                await asyncio.sleep(0.05)
        assert posted == []  # neither a submit's wake-up nor any completion
        assert (await base.queues.depth("default")).visible == 0  # each task message went
        assert (await base.queues.depth(keys.COMPLETIONS_QUEUE)).visible == 0
    finally:
        stop.set()
        await asyncio.gather(*running)
        await base.close()
    assert store.handoff is None


async def test_acks_that_fail_after_the_states_are_posted_and_the_run_completes(
    azurite: object,
) -> None:
    failed: list[tuple[Any, ...]] = []
    posted: list[int] = []

    async def fail_one(op: str, args: tuple[Any, ...], call: Callable[[], Awaitable[Any]]) -> Any:
        # The coordinator's commit deletes the handed-over events' task messages in
        # its last phase, after the states: fail the first such delete.
        if op == "queues.delete" and args[0] == "default" and not failed:
            failed.append(args)
            raise StoreUnavailable("injected: the acks of a hand-over fail")
        if op == "queues.send":
            posted.append(_completions(args))
        return await call()

    base, store = _open(fail_one)
    try:
        assert await _run(store) == "completed"
        assert failed
        # The events of that commit were posted to the completion queue instead (and
        # applied again there: a no-op), their task messages deleted by the worker.
        assert sum(posted) >= 1
        assert (await base.queues.depth("default")).visible == 0
        assert (await base.queues.depth(keys.COMPLETIONS_QUEUE)).visible == 0
    finally:
        await base.close()


async def test_more_new_runs_handed_over_while_busy_than_kept_all_start_without_a_rescan(
    azurite: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loop of submits while the coordinator is busy: their first states left to it
    (the index rows flagged ``first_state_handed``), more of them than it keeps copies
    of, and more than its state cache holds when a step loads them. None is dropped
    (it is the only copy of that state, and the run would wait for the periodic
    rescan): past the bound a submit writes its state itself, and no eviction takes a
    state not written yet (tests/unit/test_handoff.py, at scale on the memory store)."""
    monkeypatch.setattr(coordinator_module, "_PRELOADED", 8)
    base = open_azure_store(f"azure://devstoreaccount1/{azure_prefix()}", environ={})
    busy = Busy(base)
    options = CoordinatorOptions(poll_interval_s=0.05, cache_size=4, rescan_interval_s=3600.0)
    ids = [f"w{i}" for i in range(21)]
    try:
        outcome = await submitted_while_busy(busy, Coordinator(busy.store, options), ids)
        assert outcome.unstarted == []
        assert outcome.rescans == 1  # the first, before any submit
        assert outcome.written_by_submit == ids[9:]  # the first 8 left to the coordinator
        assert outcome.handed == ids[1:]  # each submit meant to leave it (its row says)
    finally:
        await base.close()
