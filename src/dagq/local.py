"""Running a workflow in one process: coordinator and a pool of workers side by side.

This is what ``dagq run`` does. The same components run as separate processes in a
cluster; here they share one store object, so they wake each other without polling.
If another live coordinator already holds the store's lease, only workers run here
and the other coordinator advances the workflow; this process keeps trying for the
lease and takes over as soon as that coordinator stops or dies (a killed process on
this host, even one not yet reaped, counts as dead), so two ``dagq run`` on one store
both finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dagq import quarantine
from dagq.coordinator import Coordinator, CoordinatorOptions
from dagq.definition import WorkflowDef
from dagq.errors import DamagedData, LeaseHeld, LeaseLost
from dagq.plan import Plan
from dagq.state import QUARANTINED, WORKFLOW_TERMINAL, RunState
from dagq.stores.base import Store
from dagq.submission import SubmitResult, submit
from dagq.views import read_checked
from dagq.worker import Worker, WorkerOptions

log = logging.getLogger("dagq.run")

#: Shorter timeouts than a cluster's: a crashed ``dagq run`` resumes within seconds.
LOCAL_COORDINATOR = CoordinatorOptions(
    event_visibility_s=10.0, lease_ttl_s=15.0, sweep_interval_s=0.5, repair_grace_s=2.0
)
LOCAL_VISIBILITY_S = 15.0
#: While another coordinator holds the lease, try for it this often.
TAKEOVER_INTERVAL_S = 1.0
#: While another coordinator advances the workflow, look for its quarantine this often.
QUARANTINE_CHECK_S = 1.0

Observer = Callable[[Plan, RunState], Awaitable[None] | None]


@dataclass(frozen=True, slots=True)
class LocalRun:
    """How an in-process run ended."""

    workflow_id: str
    status: str
    resumed: bool
    already_finished: bool


class LocalRunner:
    """Submits (or resumes) one workflow and drives it to a terminal state."""

    def __init__(
        self,
        store: Store,
        *,
        workers: int = 4,
        import_paths: Sequence[str] = (),
        coordinator_options: CoordinatorOptions = LOCAL_COORDINATOR,
        processor: str | None = None,
    ) -> None:
        self.store = store
        self.workers = workers
        self.import_paths = tuple(import_paths)
        #: ``module:function`` running the tasks that say what to run only through kwargs.
        self.processor = processor
        self.coordinator = Coordinator(store, coordinator_options)
        self.stop = asyncio.Event()
        self.submitted: SubmitResult | None = None
        self.coordinating = False
        #: Why the workflow was quarantined, once drive() returned ``quarantined``.
        self.quarantine_reason: str | None = None
        self._quarantine_checked = 0.0

    async def submit(
        self, definition: WorkflowDef, *, params: Mapping[str, Any], workflow_id: str | None
    ) -> SubmitResult:
        """Store the workflow, or find the existing one with this id and definition."""
        self.submitted = await submit(
            self.store, definition, params=params, workflow_id=workflow_id
        )
        self.coordinator.remember_plan(self.submitted.fingerprint, self.submitted.plan)
        return self.submitted

    async def current_state(self) -> RunState:
        """The freshest state: the coordinator's copy here (once no thread changes it:
        read it before the next await), else the store's."""
        assert self.submitted is not None
        cached = await self.coordinator.settled_state(self.submitted.workflow_id)
        if cached is not None:
            return cached
        found = await read_checked(self.store, self.submitted.workflow_id, self.submitted.plan)
        assert found is not None, "the state document exists once submit returned"
        return found[0]

    async def drive(self, observer: Observer | None = None, *, interval_s: float = 0.1) -> str:
        """Run coordinator and workers until the workflow is terminal; return its status."""
        assert self.submitted is not None
        plan = self.submitted.plan
        worker = Worker(
            self.store,
            WorkerOptions(
                queues=tuple(sorted(plan.queues)),
                concurrency=self.workers,
                visibility_timeout_s=LOCAL_VISIBILITY_S,
                import_paths=self.import_paths,
                shutdown_grace_s=5.0,
                poll_interval_s=0.05,  # delayed retries become visible without a send
                workflows=frozenset({self.submitted.workflow_id}),
                processor=self.processor,
            ),
        )
        tasks = [asyncio.create_task(worker.run(self.stop), name="dagq-worker")]
        coordinator = asyncio.create_task(self._coordinate(), name="dagq-coordinator")
        tasks.append(coordinator)
        try:
            while True:
                reason = await self._quarantined()
                if reason is not None:
                    self.quarantine_reason = reason
                    return QUARANTINED
                try:
                    current = await self.current_state()
                except DamagedData:
                    if self.stop.is_set():
                        raise
                    # Whichever coordinator touches it next quarantines it; wait for that.
                    self._quarantine_checked = 0.0
                    await asyncio.sleep(interval_s)
                    continue
                if observer is not None:
                    result = observer(plan, current)
                    if result is not None:
                        await result
                if current.status in WORKFLOW_TERMINAL:
                    return current.status
                if self.stop.is_set():  # stopped from outside (SIGTERM): resumable later
                    return current.status
                for task in tasks:
                    if task.done() and task.exception() is not None:
                        raise task.exception()  # type: ignore[misc]
                self.coordinator.changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.coordinator.changed.wait(), interval_s)
        finally:
            self.stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _quarantined(self) -> str | None:
        """Why the workflow is quarantined, if it is (asked of the store at most once a
        second while another coordinator advances it)."""
        assert self.submitted is not None
        workflow_id = self.submitted.workflow_id
        reason = self.coordinator.quarantine_reason(workflow_id)
        if reason is not None or self.coordinating:
            return reason
        now = time.monotonic()
        if now - self._quarantine_checked < QUARANTINE_CHECK_S:
            return None
        self._quarantine_checked = now
        found = await quarantine.read(self.store, workflow_id)
        if found is None or found[0].released_at is not None:
            return None
        return found[0].reason

    async def _coordinate(self) -> None:
        """Coordinate while holding the lease; while another holds it, run workers only
        and try again every second (a lost lease goes back to trying)."""
        told = False
        while not self.stop.is_set():
            try:
                self.coordinating = True
                await self.coordinator.run(self.stop)
                return
            except LeaseHeld as held:
                if not told:
                    log.warning(
                        "another coordinator serves this store (%s); running workers only "
                        "and taking over when it stops",
                        held.holder,
                    )
                    told = True
            except LeaseLost as lost:
                log.warning("%s; running workers only until the lease is free", lost)
            finally:
                self.coordinating = False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), TAKEOVER_INTERVAL_S)
