"""Runs handed over with their first state unwritten (memory store, as on Azure) whose
loading step fails once, the rescan out of reach: the submits write the initial state
and post the wake-up, and every run starts at once from it."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from dagq import keys
from dagq.client import Client
from dagq.coordinator import Coordinator
from dagq.errors import StoreUnavailable
from dagq.local import LOCAL_COORDINATOR
from dagq.stores.memory import open_memory_store
from dagq.views import load_run
from tests.busy_handover import Busy, submitted_while_busy
from tests.helpers import definition

pytestmark = pytest.mark.timeout(90)


class FailingBusy(Busy):
    """Busy; once the gate is set, the first ``fail_op`` call fails (once), and every
    task message sent is noted."""

    def __init__(self, base: Any, fail_op: str) -> None:
        super().__init__(base)
        self.fail_op = fail_op
        self.failed = 0
        self.task_bodies: list[bytes] = []

    async def _hook(
        self, op: str, args: tuple[Any, ...], call: Callable[[], Awaitable[Any]]
    ) -> Any:
        task_send = op == "queues.send" and args[0] != keys.COMPLETIONS_QUEUE
        if (
            self.gate.is_set()
            and not self.failed
            and op == self.fail_op
            and (op != "queues.send" or task_send)
        ):
            self.failed += 1
            raise StoreUnavailable(f"injected: {op}")
        result = await super()._hook(op, args, call)
        if task_send:
            self.task_bodies += [bytes(m.body) for m in args[1]]
        return result


async def test_runs_whose_first_commit_failed_start_at_once_from_the_submits_post() -> None:
    """The step that loads the runs handed over unwritten fails at its first write (a
    put: nothing of it written). The submits then post the state and the wake-up; every
    run's first task must be sent soon after, not after the repair deferral
    (event_visibility_s + 1 s): the state the submit posts is the initial one, not the
    coordinator's working copy of the failed step (once the same object, already
    "running" with its first task dispatched, so that the posted wake-up did nothing)."""
    busy = FailingBusy(open_memory_store(), "documents.put")
    options = dataclasses.replace(LOCAL_COORDINATOR, rescan_interval_s=3600.0)
    ids = [f"run-{i:02d}-z" for i in range(5)]
    try:
        await submitted_while_busy(busy, Coordinator(busy.store, options), ids)
        assert busy.failed == 1
        sent = [i for i in ids if any(i.encode() in body for body in busy.task_bodies)]
        states = {}
        for i in ids:
            _, _, st = await load_run(busy.base, i)
            states[i] = (st.status, sorted(st.unconfirmed))
        assert sent == ids, f"first tasks sent only for {sent}; states {states}"
    finally:
        await busy.base.close()


async def test_a_failed_first_commit_leaves_no_state_naming_unwritten_documents() -> None:
    """A root foreach over a long params list: the first commit writes its items
    document before the state. That commit fails at its first put (nothing written);
    the submit's post then writes the state, which must not name the items document
    that was never written."""
    busy = FailingBusy(open_memory_store(), "documents.put")
    options = dataclasses.replace(LOCAL_COORDINATOR, rescan_interval_s=3600.0)
    coordinator = Coordinator(busy.store, options)
    stop = asyncio.Event()
    running = asyncio.create_task(coordinator.run(stop))
    try:
        await asyncio.wait_for(busy.rescanned.wait(), 30)
        busy.store.handoff = coordinator
        client = Client(busy.store)
        await client.submit(definition([{"name": "a"}]), workflow_id="first")
        await asyncio.wait_for(busy.holding.wait(), 30)
        fan = definition(
            [{"name": "fan", "foreach": "params.items", "cmd": "true"}], params={"items": []}
        )
        items = [f"item-{i:05d}-" + "x" * 40 for i in range(1000)]  # > 16 KiB as JSON
        await client.submit(fan, params={"items": items}, workflow_id="fan")
        assert await busy.base.documents.get(keys.state("fan")) is None  # handed over
        busy.gate.set()
        deadline = asyncio.get_running_loop().time() + 10
        while await busy.base.documents.get(keys.state("fan")) is None:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.05)  # written by the submit's post, in the background
        assert busy.failed == 1
        _, _, st = await load_run(busy.base, "fan")
        refs = [g.items_ref for g in st.groups.values() if getattr(g, "items_ref", None)]
        missing = [r for r in refs if await busy.base.documents.get(r) is None]
        assert not missing, f"state {st.status} names items never written: {missing}"
    finally:
        busy.gate.set()
        stop.set()
        await asyncio.gather(running, return_exceptions=True)
        await busy.base.close()
