"""The Python client: every operation, typed results, and its blocking facade.

Most tests run a coordinator and a worker in this event loop on the memory store;
the sync facade is tested from plain (non-async) code against a SQLite file served
by a coordinator and a worker in another thread, as another process would.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import dagq.history
from dagq import Workflow, keys
from dagq.client import (
    Client,
    Submission,
    SyncClient,
    TaskInfo,
    WorkflowStatus,
    WorkflowSummary,
)
from dagq.coordinator import Coordinator, CoordinatorOptions
from dagq.errors import UsageError, WorkflowExists, WorkflowNotFound
from dagq.history import DAMAGED, HistoryEntry
from dagq.maintenance import purge
from dagq.messages import OUTPUT_INLINE_LIMIT
from dagq.stores import open_store
from dagq.stores.base import OutgoingMessage, Store
from dagq.stores.changes import ChangeFeed
from dagq.stores.intercepting import intercepted
from dagq.stores.memory import open_memory_store
from dagq.worker import Worker, WorkerOptions
from tests.helpers import definition

pytestmark = pytest.mark.timeout(30)

FAST_COORDINATOR = CoordinatorOptions(sweep_interval_s=0.1, poll_interval_s=0.05)
FAST_WORKER = WorkerOptions(
    queues=("default",),
    concurrency=4,
    poll_interval_s=0.05,
    cancel_check_s=0.1,
    shutdown_grace_s=1.0,
    isolation="thread",  # Python tasks read GATE, in this process
)

#: Whether ``gated`` lets its caller through (flipped by a test, read by the worker).
GATE = {"open": False}


def gated() -> str:
    """A Python task that fails until the gate is opened."""
    if not GATE["open"]:
        raise RuntimeError("the gate is closed")
    return "through"


def pipeline(name: str = "pipeline") -> Workflow:
    """A shell task, a Python task fed by it, a large output and a skipped branch."""
    wf = Workflow(name)
    wf.shell("hello", 'echo hello; echo \'{"n": 2}\' > "$DAGQ_OUTPUT"')
    wf.call(
        "double",
        "tests.sample_tasks:echo",
        args={"n": "{{ inputs.hello.n }}"},
        depends_on=["hello"],
    )
    wf.call("big", "tests.sample_tasks:big", args={"size": OUTPUT_INLINE_LIMIT + 1})
    wf.shell("never", "true", depends_on=["double"], condition="inputs.double.n > 5")
    return wf


@pytest.fixture
def store() -> Store:
    return open_memory_store()


@pytest.fixture
async def client(store: Store) -> AsyncIterator[Client]:
    async with Client(store) as client:
        yield client


@pytest.fixture
async def cluster(store: Store) -> AsyncIterator[None]:
    """A coordinator and a worker serving the memory store in this event loop."""
    stop = asyncio.Event()
    running = [
        asyncio.create_task(Coordinator(store, FAST_COORDINATOR).run(stop)),
        asyncio.create_task(Worker(store, FAST_WORKER).run(stop)),
    ]
    yield
    stop.set()
    await asyncio.wait_for(asyncio.gather(*running), 10)


@pytest.fixture
async def finished(client: Client, cluster: None) -> str:
    """The id of a completed run of :func:`pipeline`."""
    await client.submit(pipeline(), workflow_id="done")
    status = await client.wait("done", timeout_s=10)
    assert status.status == "completed", status
    return "done"


# --- submit ----------------------------------------------------------------------------


async def test_submit_of_a_builder_and_of_its_yaml_file_is_the_same_workflow(
    client: Client, tmp_path: Path
) -> None:
    path = tmp_path / "pipeline.yaml"
    path.write_text(pipeline().to_yaml())

    built = await client.submit(pipeline(), workflow_id="same")
    loaded = await client.submit(path, workflow_id="same")
    loaded_by_name = await client.submit(str(path), workflow_id="same")

    assert built == Submission(id="same", created=True)
    assert loaded == loaded_by_name == Submission(id="same", created=False)


async def test_builder_and_yaml_file_run_to_the_same_result(
    client: Client, cluster: None, tmp_path: Path
) -> None:
    path = tmp_path / "pipeline.yaml"
    path.write_text(pipeline().to_yaml())
    await client.submit(pipeline(), workflow_id="built")
    await client.submit(path, workflow_id="loaded")

    built = await client.wait("built", timeout_s=10)
    loaded = await client.wait("loaded", timeout_s=10)

    assert built.status == loaded.status == "completed"
    assert built.counts == loaded.counts == {"completed": 3, "skipped": 1}
    for task in ("hello", "double", "big"):
        assert await client.output("built", task) == await client.output("loaded", task)


async def test_submit_of_the_same_id_with_another_definition_is_refused(client: Client) -> None:
    await client.submit(pipeline(), workflow_id="taken")

    with pytest.raises(WorkflowExists, match="different definition"):
        await client.submit(pipeline("other"), workflow_id="taken")


@pytest.mark.parametrize("isolation", ["thread", "process"])
async def test_a_run_purged_and_submitted_again_feeds_its_tasks_the_new_outputs(
    client: Client, store: Store, isolation: str
) -> None:
    """Outputs, inputs and specs of the two runs have the same keys: a worker that
    read the first run's (its caches warm) must not give them to the second run."""
    wf = Workflow("again", params={"word": "first"})
    wf.call(
        "up",
        "tests.sample_tasks:padded",
        args={"word": "{{ params.word }}", "size": OUTPUT_INLINE_LIMIT},
    )
    wf.call(
        "down", "tests.sample_tasks:echo", args={"word": "{{ inputs.up.word }}"}, depends_on=["up"]
    )
    stop = asyncio.Event()
    running = [
        asyncio.create_task(Coordinator(store, FAST_COORDINATOR).run(stop)),
        asyncio.create_task(Worker(store, replace(FAST_WORKER, isolation=isolation)).run(stop)),
    ]
    try:
        await client.submit(wf, workflow_id="w")
        assert (await client.wait("w", timeout_s=20)).status == "completed"
        assert await client.output("w", "down") == {"word": "first"}
        await purge(store, "w", force=True)

        await client.submit(wf, params={"word": "second"}, workflow_id="w")

        assert (await client.wait("w", timeout_s=20)).status == "completed"
        assert (await client.output("w", "up"))["word"] == "second"
        assert await client.output("w", "down") == {"word": "second"}
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*running), 10)


# --- typed results -----------------------------------------------------------------------


async def test_status_returns_a_typed_status_of_the_run(client: Client, finished: str) -> None:
    status = await client.status(finished)

    assert isinstance(status, WorkflowStatus)
    assert status.terminal
    assert (status.id, status.name, status.status) == (finished, "pipeline", "completed")
    assert (status.total, status.done) == (4, 4)
    assert status.failed == []


async def test_list_returns_summaries_filtered_by_status_and_name(
    client: Client, finished: str
) -> None:
    await client.submit(_one("other"), workflow_id="p")

    everything = await client.list()
    completed = await client.list(status="completed")
    named = await client.list(name="other")

    assert all(isinstance(row, WorkflowSummary) for row in everything)
    assert {row.id for row in everything} == {finished, "p"}
    assert [row.id for row in completed] == [finished]
    assert [row.id for row in named] == ["p"]


def _one(name: str, *, queue: str = "unserved", cmd: str = "true") -> Workflow:
    """One shell task, by default on a queue no worker serves (so it never ends)."""
    wf = Workflow(name)
    wf.shell("a", cmd, queue=queue)
    return wf


async def test_list_refuses_an_unknown_status(client: Client) -> None:
    with pytest.raises(UsageError, match="unknown workflow status 'bogus'"):
        await client.list(status="bogus")


async def test_tasks_returns_task_infos_filtered_by_state(client: Client, finished: str) -> None:
    tasks = await client.tasks(finished)
    skipped = await client.tasks(finished, state="skipped")

    assert all(isinstance(task, TaskInfo) for task in tasks)
    assert [(t.name, t.status, t.attempt) for t in tasks] == [
        ("hello", "completed", 1),
        ("double", "completed", 1),
        ("big", "completed", 1),
        ("never", "skipped", 0),
    ]
    assert [t.name for t in skipped] == ["never"]


async def test_output_returns_inline_and_referenced_values(client: Client, finished: str) -> None:
    assert await client.output(finished, "double") == {"n": 2}
    assert await client.output(finished, "big") == "x" * (OUTPUT_INLINE_LIMIT + 1)


async def test_output_of_a_skipped_task_is_refused(client: Client, finished: str) -> None:
    with pytest.raises(UsageError, match="skipped"):
        await client.output(finished, "never")


async def test_logs_return_what_the_attempt_printed(client: Client, finished: str) -> None:
    assert "hello" in await client.logs(finished, "hello")
    assert "hello" in await client.logs(finished, "hello", attempt=1)


async def test_events_return_history_entries_oldest_first(client: Client, finished: str) -> None:
    events = await client.events(finished)

    assert all(isinstance(e, HistoryEntry) for e in events)
    assert events[0].kind == "submitted"
    assert events[-1].kind == "workflow_completed"
    assert ("completed", "double", 1) in [(e.kind, e.task, e.attempt) for e in events]


async def test_wait_gives_up_with_timeout_error(client: Client) -> None:
    await client.submit(_one("stuck"), workflow_id="stuck")  # no coordinator runs

    with pytest.raises(TimeoutError, match="stuck"):
        await client.wait("stuck", timeout_s=0.1)


def _noting_reads(store: Store, reads: list[str]) -> Store:
    async def note(operation: str, args: tuple[Any, ...], call: Callable[[], Any]) -> Any:
        if operation == "documents.get":
            reads.append(args[0].split("/")[0])
        return await call()

    return intercepted(store, note)


async def test_wait_polls_the_state_header_and_reads_the_run_whole_once_it_ended(
    store: Store, cluster: None
) -> None:
    reads: list[str] = []
    noted = _noting_reads(store, reads)
    noted.changes = ChangeFeed()  # as on azure: other processes' changes are not heard
    watched = Client(noted)
    await watched.submit(_one("stuck"), workflow_id="stuck")  # its queue is not served
    with pytest.raises(TimeoutError, match=r"stuck is still (pending|running)"):
        await watched.wait("stuck", timeout_s=0.4)
    assert reads.count("states") >= 4  # polled: 20, 40, 80, 160 ms ...
    assert reads.count("definitions") <= 2  # the submit's look, the first status: no more

    await watched.submit(_one("quick", queue="default"), workflow_id="quick")
    status = await watched.wait("quick", timeout_s=10)
    assert status.status == "completed" and status.done == 1


async def test_wait_on_a_complete_change_feed_looks_when_the_listing_changes(
    store: Store, cluster: None
) -> None:
    reads: list[str] = []
    watched = Client(_noting_reads(store, reads))
    assert watched.store.changes.complete
    await watched.submit(_one("stuck"), workflow_id="stuck")  # its queue is not served
    with pytest.raises(TimeoutError, match=r"stuck is still (pending|running)"):
        await watched.wait("stuck", timeout_s=0.4)
    # The submit's look, the first status, a look when the coordinator took the run up
    # (its row changed); no poll before FEED_POLL_S (polling: 20, 40, 80, 160 ms ...).
    assert reads.count("states") <= 3

    await watched.submit(_one("quick", queue="default"), workflow_id="quick")
    status = await watched.wait("quick", timeout_s=10)  # woken by its row's change
    assert status.status == "completed" and status.done == 1
    assert reads.count("states") <= 8


# --- cancel and retry ----------------------------------------------------------------------


async def test_cancel_ends_a_running_workflow_cancelled(client: Client, cluster: None) -> None:
    await client.submit(_one("long", queue="default", cmd="sleep 30"), workflow_id="long")
    await _until(lambda: _status_of(client, "long", "a"), "running")

    await client.cancel("long")
    status = await client.wait("long", timeout_s=10)

    assert status.status == "cancelled"
    assert status.counts == {"cancelled": 1}


async def test_retry_reruns_the_failed_task_and_wait_sees_the_new_run(
    client: Client, cluster: None
) -> None:
    GATE["open"] = False
    wf = Workflow("gated")
    wf.shell("first", "true")
    wf.call("gate", "tests.unit.test_client:gated", depends_on=["first"])
    await client.submit(wf, workflow_id="gated")
    assert (await client.wait("gated", timeout_s=10)).status == "failed"
    GATE["open"] = True

    taken_up = await client.retry("gated")
    status = await client.wait("gated", timeout_s=10)

    assert taken_up
    assert status.status == "completed"
    assert [(t.name, t.attempt) for t in await client.tasks("gated")] == [("first", 1), ("gate", 2)]


async def test_retry_of_a_completed_workflow_is_refused(client: Client, finished: str) -> None:
    with pytest.raises(UsageError, match="nothing to retry"):
        await client.retry(finished)


def saga(name: str) -> Any:
    """'charge' completes (its undo succeeds), then 'ship' fails: the run is compensated."""
    return definition(
        [
            {"name": "charge", "cmd": "true", "compensate": {"cmd": "true"}},
            {"name": "ship", "cmd": "exit 1", "depends_on": ["charge"]},
        ],
        name=name,
    )


async def test_retry_of_a_compensated_run_is_refused_up_front(
    client: Client, cluster: None
) -> None:
    await client.submit(saga("undone"), workflow_id="undone")
    assert (await client.wait("undone", timeout_s=10)).status == "failed"

    with pytest.raises(UsageError, match=r"compensated.*run it again under a new id"):
        await client.retry("undone")


async def test_a_retry_the_coordinator_ignores_is_an_error_not_a_false_success(
    client: Client, cluster: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    await client.submit(saga("raced"), workflow_id="raced")
    assert (await client.wait("raced", timeout_s=10)).status == "failed"
    # As if the run had changed between the client's check and the coordinator's turn.
    monkeypatch.setattr("dagq.client._check_retryable", lambda *args: None)

    with pytest.raises(UsageError, match="did not retry raced: its completed tasks were"):
        await client.retry("raced", ack_timeout_s=5)


async def test_cancel_and_signal_return_their_request_id_and_a_resend_acts_once(
    client: Client, cluster: None
) -> None:
    wf = Workflow("gate")
    wf.wait_for("first", "go")
    wf.wait_for("second", "go", depends_on=["first"])
    await client.submit(wf, workflow_id="gate")
    await _until(lambda: _status_of(client, "gate", "first"), "waiting")

    sent = await client.signal("gate", "go", 1)
    again = await client.signal("gate", "go", 1, request_id=sent)
    await _until(lambda: _status_of(client, "gate", "second"), "waiting")
    await client.cancel("gate", request_id="stop-1")
    status = await client.wait("gate", timeout_s=10)

    assert again == sent and len(sent) == 16
    assert status.status == "cancelled"
    assert [e.kind for e in await client.events("gate")].count("signal") == 1


# --- unknown ids ---------------------------------------------------------------------------

UNKNOWN_ID_CALLS: dict[str, Callable[[Client], Awaitable[Any]]] = {
    "status": lambda c: c.status("ghost"),
    "tasks": lambda c: c.tasks("ghost"),
    "output": lambda c: c.output("ghost", "a"),
    "logs": lambda c: c.logs("ghost", "a"),
    "error": lambda c: c.error("ghost", "a"),
    "events": lambda c: c.events("ghost"),
    "cancel": lambda c: c.cancel("ghost"),
    "retry": lambda c: c.retry("ghost"),
    "wait": lambda c: c.wait("ghost", timeout_s=1),
}


@pytest.mark.parametrize("call", UNKNOWN_ID_CALLS.values(), ids=UNKNOWN_ID_CALLS.keys())
async def test_unknown_id_raises_workflow_not_found(
    client: Client, call: Callable[[Client], Awaitable[Any]]
) -> None:
    with pytest.raises(WorkflowNotFound, match="ghost"):
        await call(client)


# --- the blocking facade -------------------------------------------------------------------


async def _status_of(client: Client, workflow_id: str, task: str) -> str:
    return next(t.status for t in await client.tasks(workflow_id) if t.name == task)


async def _until(read: Callable[[], Awaitable[str]], wanted: str, timeout_s: float = 10) -> None:
    async with asyncio.timeout(timeout_s):
        while await read() != wanted:
            await asyncio.sleep(0.01)


@contextmanager
def served(url: str) -> Iterator[None]:
    """A coordinator and a worker on the store at ``url``, in a thread of their own."""
    ready = threading.Event()
    control: dict[str, Any] = {}

    async def serve() -> None:
        store = open_store(url)
        stop = asyncio.Event()
        control.update(loop=asyncio.get_running_loop(), stop=stop)
        ready.set()
        try:
            await asyncio.gather(
                Coordinator(store, FAST_COORDINATOR).run(stop), Worker(store, FAST_WORKER).run(stop)
            )
        finally:
            await store.close()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), name="dagq-served")
    thread.start()
    assert ready.wait(10)
    try:
        yield
    finally:
        control["loop"].call_soon_threadsafe(control["stop"].set)
        thread.join(10)
        assert not thread.is_alive()


def test_sync_facade_runs_every_operation_from_plain_code(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'dagq.db'}"
    with served(url), Client(url).sync() as client:
        submitted = client.submit(pipeline(), workflow_id="sync")
        status = client.wait("sync", timeout_s=10)
        tasks = client.tasks("sync")
        listed = client.list()
        output = client.output("sync", "double")
        logs = client.logs("sync", "hello")
        events = client.events("sync")

    assert submitted == Submission(id="sync", created=True)
    assert isinstance(status, WorkflowStatus)
    assert status.status == "completed"
    assert [t.status for t in tasks] == ["completed", "completed", "completed", "skipped"]
    assert [row.id for row in listed] == ["sync"]
    assert output == {"n": 2}
    assert "hello" in logs
    assert events[-1].kind == "workflow_completed"


def test_sync_client_of_a_url_raises_workflow_not_found_for_an_unknown_id(
    tmp_path: Path,
) -> None:
    with SyncClient(f"sqlite:///{tmp_path / 'dagq.db'}") as client:
        assert client.submit(_one("x"), workflow_id="x").created
        assert client.status("x").status == "pending"
        with pytest.raises(WorkflowNotFound, match="ghost"):
            client.status("ghost")


# --- dead letters ------------------------------------------------------------------------


async def test_dead_letters_are_described_replayed_and_purged(client: Client, store: Store) -> None:
    for body in (b"first", b"second"):
        await store.queues.send("q", [OutgoingMessage(body, id=body.decode())])
        [message] = await store.queues.receive("q", max_messages=1, visibility_timeout_s=30)
        await store.queues.dead_letter("q", message.receipt, f"{body.decode()} is bad")
    first, second = await client.dead_letters()
    assert (first.queue, first.message_id, first.kind) == ("q", "first", "unreadable")
    assert second.reason == "second is bad"
    assert await client.dead_letters("elsewhere") == []

    assert await client.replay_dead_letters([first.key]) == 1
    assert [
        m.body for m in await store.queues.receive("q", max_messages=5, visibility_timeout_s=30)
    ] == [b"first"]
    with pytest.raises(UsageError, match="no dead letter with key"):
        await client.purge_dead_letters([first.key])
    assert await client.purge_dead_letters([second.key]) == 1
    assert await client.dead_letters() == []


@pytest.fixture
def spilling(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every history chunk in a document of its own (none kept in the state)."""
    monkeypatch.setattr(dagq.history, "TAIL_CHUNKS", 0)


async def test_events_show_a_damaged_history_chunk_as_one_entry_and_go_on(
    spilling: None, client: Client, finished: str, store: Store
) -> None:
    chunks = await store.documents.list(keys.history_prefix(finished))
    assert len(chunks) >= 3
    whole = await client.events(finished)
    await store.documents.put(chunks[0], b"\x00")
    await store.documents.put(chunks[1], b"\xc1 not msgpack")

    events = await client.events(finished)

    damaged = [e for e in events if e.kind == DAMAGED]
    assert [e.detail.split(" is damaged")[0] for e in damaged if e.detail] == [
        f"history chunk {chunks[0]}",
        f"history chunk {chunks[1]}",
    ]
    assert events[-1] == whole[-1]  # the chunks after them are all there
    assert all(e.at > 0 for e in events)  # dated like their readable neighbours
    assert (await client.status(finished)).status == "completed"


async def test_the_whole_error_of_a_failed_undo_and_of_a_failed_item_is_kept(
    client: Client, cluster: None
) -> None:
    await client.submit(
        definition(
            [
                {"name": "a", "compensate": {"cmd": "echo bad undo >&2; exit 3", "num_retries": 0}},
                {"name": "b", "cmd": "exit 1", "depends_on": ["a"], "num_retries": 0},
                {"name": "f", "foreach": "[1, 2]", "cmd": "test $DAGQ_ITEM = 1", "num_retries": 0},
            ]
        ),
        workflow_id="saga",
    )
    status = await client.wait("saga", timeout_s=10)
    assert status.status == "compensation_failed", status

    undo = await client.error("saga", "a", undo=True)
    assert undo == "its compensation failed: exit code 3; stderr: bad undo"
    assert await client.error("saga", "f", item=1) == "exit code 1"
    assert await client.error("saga", "f", item=0) is None
    assert await client.error("saga", "b") == "exit code 1"


async def test_a_name_with_a_newline_is_echoed_escaped(client: Client, finished: str) -> None:
    with pytest.raises(UsageError) as caught:
        await client.logs(finished, "no\nsuch")
    assert "\n" not in str(caught.value) and "no\\nsuch" in str(caught.value)
