"""What a chain costs in store requests: no control read for an attempt dispatched a
moment ago, no receive per finished task once the queue ran dry (on a store that
bills each request, these were most of a chain's requests)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from dagq import keys
from dagq.client import Client, WorkflowStatus
from dagq.coordinator import Coordinator, CoordinatorOptions
from dagq.maintenance import STOP_EVERYTHING, stop_everything
from dagq.messages import TaskFinished, TaskMessage, TaskSpec, decode_events, encode_task
from dagq.state import WORKFLOW_TERMINAL
from dagq.stores.base import (
    BatchOp,
    OutgoingMessage,
    PutOp,
    Store,
    commit_in_order,
    takes_handoff,
)
from dagq.stores.intercepting import intercepted
from dagq.stores.memory import open_memory_store
from dagq.submission import submit
from dagq.worker import Worker, WorkerOptions
from tests.helpers import definition

CHAIN = 20


class _AcksLast:
    """Commits in order, hence a batch's acks after its states: a coordinator may take
    hand-overs (as on Azure, whose commits are phased)."""

    acks_after_states = True

    def __init__(self, store: Store, seen: Counter[str]) -> None:
        self._store = store
        self._seen = seen

    def bound_to(self, store: Store) -> _AcksLast:
        return _AcksLast(store, self._seen)

    async def __call__(self, ops: Sequence[BatchOp]) -> list[str]:
        for op in ops:
            if isinstance(op, PutOp):
                self._seen[f"commit put {op.key}"] += 1
        return await commit_in_order(self._store, ops)


def recording(*, handoff: bool = False) -> tuple[Store, Counter[str]]:
    """A memory store that counts receives by queue and document reads and writes by
    key (and,
    ``handoff``, whose coordinator takes hand-overs)."""
    seen: Counter[str] = Counter()

    async def hook(
        operation: str, args: tuple[Any, ...], call: Callable[[], Awaitable[Any]]
    ) -> Any:
        if operation == "queues.receive":
            seen[f"receive {args[0]}"] += 1
        elif operation == "documents.get":
            seen[f"get {args[0]}"] += 1
            await asyncio.sleep(0)  # a read takes a round trip: others run meanwhile
        elif operation == "documents.put":
            seen[f"put {args[0]}"] += 1
        return await call()

    store = open_memory_store()
    if handoff:
        store.committer = _AcksLast(store, seen)
    return intercepted(store, hook, rebind=False), seen


async def run_chain(store: Store, *, wait: bool = False) -> WorkflowStatus | None:
    """A chain of CHAIN quick tasks, driven by a coordinator and a one-slot worker
    that polls rarely (so the receives counted are the ones the work asked for)."""
    steps: list[dict[str, Any]] = [{"name": "s0", "call": "tests.sample_tasks:echo"}]
    steps += [
        {"name": f"s{i}", "call": "tests.sample_tasks:echo", "depends_on": [f"s{i - 1}"]}
        for i in range(1, CHAIN)
    ]
    coordinator = Coordinator(store, CoordinatorOptions(poll_interval_s=10.0))
    worker = Worker(store, WorkerOptions(concurrency=1, poll_interval_s=10.0, isolation="thread"))
    stop = asyncio.Event()
    running = [asyncio.create_task(coordinator.run(stop)), asyncio.create_task(worker.run(stop))]
    try:
        deadline = time.monotonic() + 10
        while takes_handoff(store.committer) and store.handoff is not coordinator:
            assert time.monotonic() < deadline, "the coordinator did not start"
            await asyncio.sleep(0.005)  # submitted once the coordinator takes hand-overs
        await submit(store, definition(steps), workflow_id="w")
        if wait:  # as a user waits for it, through the Client
            ended = await Client(store).wait("w", timeout_s=30)
            assert ended.status == "completed"
            return ended
        deadline = time.monotonic() + 30
        while True:
            st = await coordinator.settled_state("w")
            if st is not None and st.status in WORKFLOW_TERMINAL:
                break
            assert time.monotonic() < deadline, "the chain did not finish"
            coordinator.changed.clear()
            await asyncio.wait_for(coordinator.changed.wait(), 5)
        assert st.status == "completed"
        return None
    finally:
        stop.set()
        await asyncio.gather(*running)


async def test_a_chain_reads_no_control_document_and_receives_about_once_a_step() -> None:
    store, seen = recording()
    await run_chain(store)
    assert seen[f"get {keys.control('w')}"] == 0
    # One receive finds each step; a finished step's freed slot adds none (that was
    # two a step), and the polls, rare here, add a few.
    assert seen["receive default"] <= CHAIN + 8, seen


async def report_of_stale_task(marker: bytes, *, run: float) -> object:
    """The report of an attempt of run ``run`` of workflow w, dispatched a minute ago
    (so the worker reads the control document first), with ``marker`` as that document."""
    store = open_memory_store()
    await store.documents.put(keys.control("w"), marker)
    stale = TaskMessage(
        workflow_id="w",
        task=0,
        name="t",
        attempt=1,
        spec=TaskSpec(kind="python", call="tests.sample_tasks:echo"),
        dispatched_at=time.time() - 60,
        run=run,
    )
    await store.queues.send("default", [OutgoingMessage(encode_task(stale))])
    worker = Worker(store, WorkerOptions(concurrency=1, isolation="thread"))
    stop = asyncio.Event()
    serving = asyncio.create_task(worker.run(stop))
    try:
        deadline = time.monotonic() + 10
        while not (
            found := await store.queues.receive(
                keys.COMPLETIONS_QUEUE, max_messages=10, visibility_timeout_s=30
            )
        ):
            assert time.monotonic() < deadline, "no report came"
            await store.queues.wait(keys.COMPLETIONS_QUEUE, 0.5)
    finally:
        stop.set()
        await serving
    [report] = [e for m in found for e in decode_events(m.body) if isinstance(e, TaskFinished)]
    return report


async def test_an_attempt_dispatched_long_ago_reads_the_control_document_first() -> None:
    # A forced purge's marker: it stops the tasks of the run it names.
    report = await report_of_stale_task(stop_everything(1000.0), run=1000.0)
    assert getattr(report, "error", "") == "not run: the workflow was cancelled or has ended"


async def test_a_forced_purges_marker_does_not_stop_a_namesake_submitted_after_it() -> None:
    # The namesake's coordinator does not delete the marker (a request every run).
    report = await report_of_stale_task(stop_everything(1000.0), run=2000.0)
    assert getattr(report, "ok", False), report


async def test_a_marker_of_the_old_forced_purge_stops_only_messages_naming_no_run() -> None:
    assert getattr(await report_of_stale_task(STOP_EVERYTHING, run=2000.0), "ok", False)
    report = await report_of_stale_task(STOP_EVERYTHING, run=0.0)
    assert getattr(report, "error", "") == "not run: the workflow was cancelled or has ended"


async def test_tasks_of_one_workflow_starting_together_read_its_control_document_once() -> None:
    store, seen = recording()
    stale = [
        TaskMessage(
            workflow_id="w",
            task=i,
            name=f"t{i}",
            attempt=1,
            spec=TaskSpec(kind="python", call="tests.sample_tasks:echo"),
            dispatched_at=time.time() - 60,
        )
        for i in range(8)
    ]
    await store.queues.send("default", [OutgoingMessage(encode_task(t)) for t in stale])
    worker = Worker(store, WorkerOptions(concurrency=8, isolation="thread"))
    stop = asyncio.Event()
    serving = asyncio.create_task(worker.run(stop))
    try:
        deadline = time.monotonic() + 10
        while worker.completed < len(stale):
            assert time.monotonic() < deadline, "the tasks did not run"
            await asyncio.sleep(0.01)
    finally:
        stop.set()
        await serving
    assert seen[f"get {keys.control('w')}"] == 1


async def test_a_workflow_submitted_in_the_coordinators_process_is_started_without_reads() -> None:
    store, seen = recording(handoff=True)
    await run_chain(store)
    # The submit handed the new workflow over as it stored it: definition, quarantine
    # record and state are not read back.
    for key in (keys.definition("w"), keys.quarantine("w"), keys.state("w")):
        assert seen[f"get {key}"] == 0, seen


async def test_a_workflow_submitted_in_the_coordinators_process_is_first_written_by_it() -> None:
    store, seen = recording(handoff=True)
    await run_chain(store)
    # The submit leaves the state to the coordinator, whose first commit writes it
    # with the first dispatch: a write for that dispatch, then one a step (the last
    # ends the run), and none by the submit.
    assert seen[f"put {keys.state('w')}"] == 0, seen  # the submit's writes
    assert seen[f"commit put {keys.state('w')}"] >= CHAIN + 1, seen


async def test_a_client_waits_on_the_coordinator_of_its_process_without_polling_the_store() -> None:
    store, seen = recording(handoff=True)
    ended = await run_chain(store, wait=True)
    # Read at the start at most (before the coordinator holds it); not polled along
    # the chain, nor read at its end: that coordinator committed the end it answers,
    # the status a read of the store finds.
    for key in (keys.state("w"), keys.quarantine("w"), keys.definition("w")):
        assert seen[f"get {key}"] <= 1, seen
    assert ended == await Client(store).status("w")
