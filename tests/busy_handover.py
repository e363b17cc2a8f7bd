"""A loop of submits handed over to a coordinator of the same process while it is busy
(its commit held): shared by the hand-off tests of the memory and Azure stores (not a
test module)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from dagq import keys
from dagq.client import Client
from dagq.coordinator import Coordinator
from dagq.stores.base import Store
from dagq.stores.intercepting import intercepted
from dagq.submitted import FIRST_STATE_HANDED
from dagq.views import load_run
from tests.helpers import definition


class Busy:
    """A store view whose coordinator commit holds at its task sends until ``gate`` is
    set, and that notes each rescan of the index (a query: nothing else queries)."""

    def __init__(self, base: Store) -> None:
        self.base = base
        self.store = intercepted(base, self._hook)
        self.gate = asyncio.Event()
        self.holding = asyncio.Event()
        self.rescanned = asyncio.Event()
        self.rescans = 0

    async def _hook(
        self, op: str, args: tuple[Any, ...], call: Callable[[], Awaitable[Any]]
    ) -> Any:
        if op == "queues.send" and args[0] != keys.COMPLETIONS_QUEUE:  # a run's first task
            self.holding.set()
            await self.gate.wait()
        result = await call()
        if op == "index.query":
            self.rescans += 1
            self.rescanned.set()
        return result


class Outcome:
    """What became of the runs submitted while the coordinator was busy."""

    def __init__(
        self, unstarted: list[str], written_by_submit: list[str], handed: list[str], rescans: int
    ) -> None:
        #: Not running once the coordinator has committed nothing more for a while.
        self.unstarted = unstarted
        #: Their state written before the coordinator's commit was let go (by the submit).
        self.written_by_submit = written_by_submit
        #: Their index rows flagged ``first_state_handed`` then.
        self.handed = handed
        #: Rescans of the index in all (the first, at the start, before any submit).
        self.rescans = rescans


async def submitted_while_busy(busy: Busy, coordinator: Coordinator, ids: Sequence[str]) -> Outcome:
    """Run ``coordinator`` (on ``busy.store``, its rescan out of reach), submit the
    first of ``ids``, hold the coordinator's commit that starts it, submit the rest in
    a loop, then let the commit go."""
    stop = asyncio.Event()
    running = asyncio.create_task(coordinator.run(stop))
    try:
        await asyncio.wait_for(busy.rescanned.wait(), 30)  # its first sweep rescanned
        if busy.store.handoff is None:  # memory: no committer takes hand-overs, as Azure's
            busy.store.handoff = coordinator  # does; set by hand, as it sets itself there
        assert busy.store.handoff is coordinator
        client = Client(busy.store)
        one_task = definition([{"name": "a"}])
        await client.submit(one_task, workflow_id=ids[0])
        await asyncio.wait_for(busy.holding.wait(), 30)
        for workflow_id in ids[1:]:  # no worker: each run waits at its first task
            await client.submit(one_task, workflow_id=workflow_id)
        written = [i for i in ids[1:] if await busy.base.documents.get(keys.state(i)) is not None]
        handed = [i for i in ids[1:] if await _flagged(busy.base, i)]
        busy.gate.set()
        unstarted = await _unstarted(busy.base, coordinator, ids)
        return Outcome(unstarted, written, handed, busy.rescans)
    finally:
        busy.gate.set()
        stop.set()
        await asyncio.gather(running, return_exceptions=True)


async def _unstarted(store: Store, coordinator: Coordinator, ids: Sequence[str]) -> list[str]:
    """The runs not running (read from the store) once the coordinator has committed
    nothing for 5 s (each commit sets ``changed``)."""
    unstarted = list(ids)
    while unstarted:
        coordinator.changed.clear()
        unstarted = [i for i in unstarted if not await _running(store, i)]
        if not unstarted:
            break
        try:
            await asyncio.wait_for(coordinator.changed.wait(), 5)
        except TimeoutError:
            break
    return unstarted


async def _flagged(store: Store, workflow_id: str) -> bool:
    row = await store.index.get(workflow_id)
    return row is not None and bool(row.data.get(FIRST_STATE_HANDED))


async def _running(store: Store, workflow_id: str) -> bool:
    _, _, st = await load_run(store, workflow_id)  # no state yet: pending
    return st.status == "running"
