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
from typing import Any

import msgspec

from dagq import quarantine
from dagq.client import Client
from dagq.coordinator import Coordinator, CoordinatorOptions
from dagq.definition import WorkflowDef
from dagq.errors import DamagedData, LeaseHeld, LeaseLost, UsageError
from dagq.plan import Plan, runs_python
from dagq.state import QUARANTINED, WORKFLOW_TERMINAL, RunState
from dagq.stores.base import Store
from dagq.submission import SubmitResult, new_request_id, submit
from dagq.views import read_checked
from dagq.worker import Worker, WorkerOptions

log = logging.getLogger("dagq.run")

#: Shorter timeouts than a cluster's: a crashed ``dagq run`` resumes within seconds.
LOCAL_COORDINATOR = CoordinatorOptions(
    event_visibility_s=10.0, lease_ttl_s=15.0, sweep_interval_s=0.5, repair_grace_s=2.0
)
LOCAL_VISIBILITY_S = 15.0
#: How often a local run's worker polls its queues: quick, for delayed retries that
#: become visible without a send ...
LOCAL_POLL_S = 0.05
#: ... but on a store that announces them in this process when they become visible
#: (Azure, which bills every receive): its polls then find only other processes' sends.
ANNOUNCED_POLL_S = 0.5


def local_poll_interval(store: Store) -> float:
    """The worker's ``poll_interval_s`` of a local run on ``store``."""
    announced = getattr(store.queues, "announces_delayed", False)
    return ANNOUNCED_POLL_S if announced else LOCAL_POLL_S


#: While another coordinator holds the lease, try for it this often.
TAKEOVER_INTERVAL_S = 1.0
#: While another coordinator advances the workflow, look for its quarantine this often.
QUARANTINE_CHECK_S = 1.0

Observer = Callable[[Plan, RunState], Awaitable[None] | None]


#: The cancel reason of a run interrupted by Ctrl-C: ``dagq run --id`` takes it up again.
INTERRUPTED = "cancelled by Ctrl-C"


class Start(msgspec.Struct, frozen=True):
    """What :meth:`LocalRunner.start` found: a new run, one to resume, or nothing to do."""

    workflow_id: str
    created: bool
    #: Why the run is quarantined (it waits for a person), else None.
    quarantined: str | None = None
    #: The status of a run that had ended already (nothing runs), else None.
    finished: str | None = None
    #: An interrupted run (Ctrl-C) whose cancelled tasks run again.
    reopened: bool = False
    #: Why an interrupted run could not be taken up again (its undos ran, say).
    not_reopened: str | None = None


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
        #: The retry request drive() waits to see applied before a terminal state counts.
        self._awaiting: str | None = None
        #: Take a run interrupted by Ctrl-C up again once its cancellation has ended
        #: (set for a resumed run; the caller clears it when this run is interrupted).
        self.resume_interrupted = False

    async def start(
        self, definition: WorkflowDef, *, params: Mapping[str, Any], workflow_id: str | None
    ) -> Start:
        """Submit or find the run, and decide what :meth:`drive` does with it: run it,
        resume it, take an interrupted (Ctrl-C) one up again, or nothing (it ended, or
        is quarantined)."""
        submitted = await self.submit(definition, params=params, workflow_id=workflow_id)
        wid, created = submitted.workflow_id, submitted.created
        held = await quarantine.read(self.store, wid)
        if held is not None and held[0].released_at is None:
            return Start(wid, created, quarantined=held[0].reason)
        first = await self.current_state()
        # A Ctrl-C's cancel may still be on its way (the process quit at once): a run
        # resumed here that ends by it is taken up again.
        self.resume_interrupted = not created and first.status not in WORKFLOW_TERMINAL
        if first.cancel_reason == INTERRUPTED and first.status == "cancelling":
            return Start(wid, created, reopened=True)
        if first.cancel_reason == INTERRUPTED and first.status == "cancelled":
            try:
                await self.reopen()
            except UsageError as exc:
                return Start(wid, created, finished=first.status, not_reopened=str(exc))
            return Start(wid, created, reopened=True)
        if first.status in WORKFLOW_TERMINAL:
            return Start(wid, created, finished=first.status)
        return Start(wid, created)

    async def start_retry(
        self,
        definition: WorkflowDef,
        *,
        params: Mapping[str, Any],
        workflow_id: str,
        tasks: Sequence[str] | None = None,
    ) -> Start:
        """Find the finished run and retry it (``dagq retry --run``); UsageError if there
        is nothing to retry."""
        submitted = await self.submit(definition, params=params, workflow_id=workflow_id)
        await self.reopen(tasks)
        return Start(submitted.workflow_id, created=False, reopened=True)

    async def reopen(self, tasks: Sequence[str] | None = None) -> None:
        """Re-run the failed, upstream_failed and cancelled tasks (or ``tasks``) of the
        finished run; :meth:`drive` goes on until the retried run ends. UsageError if
        there is nothing to retry."""
        assert self.submitted is not None
        request_id = new_request_id()
        await Client(self.store).retry(
            self.submitted.workflow_id,
            list(tasks) if tasks else None,
            ack_timeout_s=0,
            request_id=request_id,
        )
        self._awaiting = request_id

    async def submit(
        self, definition: WorkflowDef, *, params: Mapping[str, Any], workflow_id: str | None
    ) -> SubmitResult:
        """Store the workflow, or find the existing one with this id and definition."""
        self.submitted = await submit(
            self.store,
            definition,
            params=params,
            workflow_id=workflow_id,
            compiled=self.coordinator.remember_plan,
        )
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
                poll_interval_s=local_poll_interval(self.store),
                workflows=frozenset({self.submitted.workflow_id}),
                processor=self.processor,
                warm_pool=runs_python(plan),
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
                if current.status in WORKFLOW_TERMINAL and await self._ended(current):
                    return current.status
                if self.stop.is_set():  # stopped from outside (SIGTERM): resumable later
                    return current.status
                for task in tasks:
                    if task.done() and task.exception() is not None:
                        raise task.exception()  # type: ignore[misc]
                # With no one to show every change to, only the run's end matters (and
                # what the poll every interval_s finds): a wake-up at every flush cost a
                # chain some 5 % of its CPU a step.
                watched = (
                    observer is not None or self._awaiting is not None or self.resume_interrupted
                )
                signal = self.coordinator.changed if watched else self.coordinator.ended
                signal.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(signal.wait(), interval_s)
        finally:
            self.stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _ended(self, current: RunState) -> bool:
        """Whether a terminal state is the end: not while a retry asked for is not yet
        applied, nor for an interrupted run to take up again once its cancel is done."""
        if self._awaiting is not None:
            if self._awaiting not in current.requests:
                return False
            self._awaiting = None  # applied: the retried run ended (or it was refused)
            return True
        if self.resume_interrupted and current.cancel_reason == INTERRUPTED:
            assert self.submitted is not None
            stored = await read_checked(self.store, self.submitted.workflow_id, self.submitted.plan)
            if stored is None or stored[0].status not in WORKFLOW_TERMINAL:
                return False  # the end is not on disk yet; a retry reads it from there
            self.resume_interrupted = False
            try:
                await self.reopen()
            except UsageError:  # its undos ran: it stays cancelled
                return True
            return False
        return True

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
