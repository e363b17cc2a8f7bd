"""The coordinator on the memory store with a fake clock: batching, CAS, repairs, sweeps."""

from __future__ import annotations

import asyncio
import functools
from collections import Counter
from typing import Any

import msgspec
import pytest

from dagq import keys, state
from dagq.coordinator import Coordinator, CoordinatorOptions
from dagq.errors import LeaseHeld, LeaseLost, MessageTooLarge, StoreUnavailable
from dagq.messages import (
    RetryRequested,
    SubmitRequested,
    TaskFinished,
    TaskStarted,
    decode_task,
    encode_events,
)
from dagq.persistence import read_state
from dagq.stores.base import OutgoingMessage, Store, UpsertOp, commit_in_order
from dagq.stores.memory import open_memory_store
from dagq.submission import request_cancel, submit
from tests.conformance.conftest import FakeClock
from tests.helpers import definition


class Spy:
    """Wraps a store's documents: counts puts by key prefix, can fail them on demand."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.puts: Counter[str] = Counter()
        self.fail_prefix: str | None = None

    async def put(self, key: str, data: bytes, **kw: Any) -> str:
        if self.fail_prefix and key.startswith(self.fail_prefix):
            raise StoreUnavailable(f"injected failure writing {key}")
        self.puts[key.split("/", maxsplit=1)[0]] += 1
        return str(await self.inner.put(key, data, **kw))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(clock: FakeClock) -> Store:
    store = open_memory_store(clock=clock)
    store.documents = Spy(store.documents)
    return store


def coordinator(store: Store, clock: FakeClock, **options: Any) -> Coordinator:
    return Coordinator(store, CoordinatorOptions(**options), clock=clock)


def fan_out(n: int, **workflow: Any) -> Any:
    tasks = [{"name": "root"}] + [{"name": f"t{i}", "depends_on": ["root"]} for i in range(n)]
    return definition(tasks, **workflow)


async def take_tasks(store: Store, queue: str = "default") -> list[Any]:
    messages = await store.queues.receive(queue, max_messages=1000, visibility_timeout_s=60)
    return [decode_task(m.body) for m in messages]


async def post(store: Store, *events: Any) -> None:
    await store.queues.send(keys.COMPLETIONS_QUEUE, [OutgoingMessage(encode_events(list(events)))])


def finished(task: Any, clock: FakeClock, ok: bool = True, **extra: Any) -> TaskFinished:
    return TaskFinished(
        workflow_id=task.workflow_id,
        task=task.task,
        attempt=task.attempt,
        at=clock(),
        ok=ok,
        **extra,
    )


async def load_state(store: Store, workflow_id: str, plan: Any) -> state.RunState:
    found = await read_state(store, workflow_id, plan)
    assert found is not None
    return found[0]


async def test_a_batch_writes_each_touched_state_once(store: Store, clock: FakeClock) -> None:
    coord = coordinator(store, clock)
    a = await submit(store, fan_out(50), workflow_id="a", clock=clock)
    b = await submit(store, fan_out(50), workflow_id="b", clock=clock)
    await coord.step()
    roots = await take_tasks(store)
    await post(store, *[finished(t, clock) for t in roots])
    await coord.step()
    tasks = await take_tasks(store)
    assert len(tasks) == 100
    before = store.documents.puts["states"]
    await post(store, *[finished(t, clock) for t in tasks])
    await coord.step()
    assert store.documents.puts["states"] - before == 2
    for result in (a, b):
        assert (await load_state(store, result.workflow_id, result.plan)).status == "completed"


async def test_events_are_acknowledged_only_after_their_flush(
    store: Store, clock: FakeClock
) -> None:
    coord = coordinator(store, clock)
    result = await submit(store, fan_out(1), workflow_id="w", clock=clock)
    await coord.step()
    [root] = await take_tasks(store)
    store.documents.fail_prefix = "states/"
    await post(store, finished(root, clock))
    await coord.step()
    depth = await store.queues.depth(keys.COMPLETIONS_QUEUE)
    assert depth.visible + depth.invisible == 1  # not acknowledged
    store.documents.fail_prefix = None
    clock.advance(60)  # the event becomes visible again and is re-applied from the store
    await coord.step()
    st = await load_state(store, "w", result.plan)
    assert st.status_of(0).label == "completed"


async def test_a_lost_cas_race_rereads_and_reapplies(store: Store, clock: FakeClock) -> None:
    one, two = coordinator(store, clock), coordinator(store, clock)
    result = await submit(store, fan_out(2), workflow_id="w", clock=clock)
    await one.step()
    [root] = await take_tasks(store)
    await one.advance("w", [finished(root, clock)])
    t0, t1 = await take_tasks(store)
    await two.advance("w", [finished(t0, clock)])  # two loads fresh: fine
    await one.advance("w", [finished(t1, clock)])  # one's copy is stale: must re-read
    assert one.stats.conflicts == 1
    st = await load_state(store, "w", result.plan)
    assert st.status == "completed"


async def test_index_row_follows_each_flush(store: Store, clock: FakeClock) -> None:
    coord = coordinator(store, clock)
    await submit(store, fan_out(2), workflow_id="w", clock=clock)
    row = await store.index.get("w")
    assert row is not None and row.status == "pending"
    await coord.step()
    row = await store.index.get("w")
    assert row is not None and row.status == "running"
    assert row.data["counts"] == {"pending": 2, "ready": 1}


async def test_index_counts_are_rewritten_at_most_once_an_interval_but_status_at_once(
    store: Store, clock: FakeClock
) -> None:
    coord = coordinator(store, clock, index_interval_s=5.0)
    await submit(store, fan_out(3), workflow_id="w", clock=clock)
    await coord.step()
    [root] = await take_tasks(store)
    await post(store, finished(root, clock))
    await coord.step()
    tasks = await take_tasks(store)
    await post(store, finished(tasks[0], clock))
    await coord.step()
    row = await store.index.get("w")
    assert row is not None and row.data["counts"] == {"pending": 3, "ready": 1}  # not yet
    clock.advance(5)
    await coord.sweep()  # the counts owed since are written by the sweep
    row = await store.index.get("w")
    assert row is not None and row.data["counts"] == {"completed": 2, "ready": 2}
    await post(store, *[finished(t, clock) for t in tasks[1:]])
    await coord.step()  # a new status is written at once
    row = await store.index.get("w")
    assert row is not None and row.status == "completed"
    assert row.data["counts"] == {"completed": 4}


class IndexCommits:
    """Wraps a store's committer: records each batch's index rows; can fail batches
    that write the rows of several workflows."""

    def __init__(self, store: Store) -> None:
        self.inner = store.committer or functools.partial(commit_in_order, store)
        self.batches: list[list[str]] = []
        self.refuse_shared = False
        store.committer = self

    async def __call__(self, ops: Any) -> list[str]:
        rows = [op.row.id for op in ops if isinstance(op, UpsertOp)]
        self.batches.append(rows)
        if self.refuse_shared and len(set(rows)) > 1:
            raise StoreUnavailable("injected failure of a shared batch")
        return list(await self.inner(ops))


async def _owing_counts(store: Store, clock: FakeClock, coord: Coordinator, n: int) -> None:
    """Submit ``n`` workflows and finish a task of each: their index counts are owed."""
    for i in range(n):
        await submit(store, fan_out(2), workflow_id=f"w{i}", clock=clock)
    await coord.step()
    roots = await take_tasks(store)
    await post(store, *[finished(root, clock) for root in roots])
    await coord.step()
    tasks = await take_tasks(store)
    await post(store, *[finished(t, clock) for t in tasks if t.name == "t0"])
    await coord.step()


async def test_a_sweep_writes_what_many_workflows_owe_in_one_batch(
    store: Store, clock: FakeClock
) -> None:
    coord = coordinator(store, clock, index_interval_s=5.0)
    await _owing_counts(store, clock, coord, 3)
    commits = IndexCommits(store)
    clock.advance(5)
    await coord.sweep()
    assert commits.batches == [["w0", "w1", "w2"]]  # one commit for the three
    for i in range(3):
        row = await store.index.get(f"w{i}")
        assert row is not None and row.data["counts"] == {"completed": 2, "ready": 1}


async def test_a_sweep_whose_shared_batch_fails_writes_one_workflow_at_a_time(
    store: Store, clock: FakeClock
) -> None:
    coord = coordinator(store, clock, index_interval_s=5.0)
    await _owing_counts(store, clock, coord, 3)
    commits = IndexCommits(store)
    commits.refuse_shared = True
    clock.advance(5)
    await coord.sweep()
    assert commits.batches[0] == ["w0", "w1", "w2"]
    assert sorted(commits.batches[1:]) == [["w0"], ["w1"], ["w2"]]
    for i in range(3):
        row = await store.index.get(f"w{i}")
        assert row is not None and row.data["counts"] == {"completed": 2, "ready": 1}


async def test_a_crash_between_flush_and_send_is_repaired(store: Store, clock: FakeClock) -> None:
    crashed = coordinator(store, clock)
    await submit(store, fan_out(1), workflow_id="w", clock=clock)
    original = store.queues.send

    async def lose_task_messages(queue: str, messages: Any) -> None:
        if queue != keys.COMPLETIONS_QUEUE:
            raise StoreUnavailable("crash before send")
        await original(queue, messages)

    store.queues.send = lose_task_messages  # type: ignore[method-assign]
    await crashed.step()
    store.queues.send = original  # type: ignore[method-assign]
    assert await take_tasks(store) == []
    fresh = coordinator(store, clock, repair_grace_s=5)
    await fresh.rescan()
    clock.advance(10)
    await fresh.sweep()
    assert await take_tasks(store) == []  # not before a dead coordinator's events are back
    clock.advance(10)
    await fresh.sweep()
    [root] = await take_tasks(store)
    assert (root.name, root.attempt) == ("root", 1)


async def test_repair_does_not_duplicate_a_message_still_queued(
    store: Store, clock: FakeClock
) -> None:
    await submit(store, fan_out(1), workflow_id="w", clock=clock)
    await coordinator(store, clock).step()
    fresh = coordinator(store, clock, repair_grace_s=1)
    await fresh.rescan()
    clock.advance(10)
    await fresh.sweep()
    assert len(await take_tasks(store)) == 1


class NoDedupe:
    """Queues that, like Azure's, take a message with a queued message's id as a new one."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def send(self, queue: str, messages: Any) -> None:
        await self._inner.send(
            queue, [OutgoingMessage(m.body, delay_s=m.delay_s) for m in messages]
        )


@pytest.mark.parametrize(("confirmed", "queued"), [(True, 20), (False, 40)])
async def test_a_restarted_coordinator_re_sends_only_what_may_not_have_gone_out(
    store: Store, clock: FakeClock, confirmed: bool, queued: int
) -> None:
    store.queues = NoDedupe(store.queues)  # type: ignore[assignment]
    first = coordinator(store, clock)
    await submit(store, fan_out(20), workflow_id="w", clock=clock)
    await first.step()
    [root] = await take_tasks(store)
    await post(store, finished(root, clock))
    await first.step()  # the 20 go out after the state that dispatched them
    etag = (await store.documents.get(keys.state("w"))).etag  # type: ignore[union-attr]
    if confirmed:
        await first.sweep()  # too soon: no write only to say they went out
        assert (await store.documents.get(keys.state("w"))).etag == etag  # type: ignore[union-attr]
        clock.advance(first.options.confirm_after_s)
        await first.sweep()  # and now the state says so
    fresh = coordinator(store, clock)  # the first one died
    await fresh.rescan()
    clock.advance(30)  # past the repair delay; the root's message is still hidden
    await fresh.sweep()
    depth = await store.queues.depth("default")
    assert depth.visible == queued  # unconfirmed sends are repeated; confirmed ones not


async def test_rescan_activates_a_workflow_whose_submit_event_was_lost(
    store: Store, clock: FakeClock
) -> None:
    await submit(store, fan_out(1), workflow_id="w", clock=clock)
    await store.queues.receive(keys.COMPLETIONS_QUEUE, max_messages=10, visibility_timeout_s=1e6)
    await coordinator(store, clock).rescan()
    assert [t.name for t in await take_tasks(store)] == ["root"]


async def test_an_attempt_that_outlives_its_timeout_is_failed_and_retried(
    store: Store, clock: FakeClock
) -> None:
    coord = coordinator(store, clock, timeout_grace_s=5)
    d = definition([{"name": "slow", "timeout_s": 10, "num_retries": 1, "retry": {"backoff_s": 0}}])
    result = await submit(store, d, workflow_id="w", clock=clock)
    await coord.step()
    assert len(await take_tasks(store)) == 1
    await post(store, TaskStarted(workflow_id="w", task=0, attempt=1, at=clock()))
    await coord.step()
    clock.advance(14)
    await coord.sweep()
    assert (await load_state(store, "w", result.plan)).attempt[0] == 1
    clock.advance(2)
    await coord.sweep()
    st = await load_state(store, "w", result.plan)
    assert st.attempt[0] == 2 and "timeout" in st.errors[0]


async def test_a_deadline_fails_the_workflow(store: Store, clock: FakeClock) -> None:
    coord = coordinator(store, clock)
    result = await submit(store, fan_out(1, deadline_s=30), workflow_id="w", clock=clock)
    await coord.step()
    clock.advance(31)
    await coord.sweep()
    st = await load_state(store, "w", result.plan)
    assert st.status == "failed" and "deadline" in (st.error or "")


async def control(store: Store) -> object:
    """Workflow w's control document, without the run it names (checked here)."""
    doc = await store.documents.get(keys.control("w"))
    if doc is None:
        return None
    decoded = msgspec.json.decode(doc.data)
    row = await store.index.get("w")
    assert row is not None and decoded.pop("run") == row.created_at
    return decoded


async def test_cancel_tells_workers_to_stop_what_was_sent_and_a_retry_lifts_it(
    store: Store, clock: FakeClock
) -> None:
    coord = coordinator(store, clock)
    await submit(store, fan_out(1), workflow_id="w", clock=clock)
    await coord.step()
    [root] = await take_tasks(store)
    assert root.epoch == 0
    await post(store, TaskStarted(workflow_id="w", task=0, attempt=1, at=clock()))
    await request_cancel(store, "w")
    await coord.step()
    assert await control(store) == {"stop_through": 0, "tasks": {}}
    await post(store, finished(root, clock, ok=False, error="stopped"))
    await coord.step()
    row = await store.index.get("w")
    assert row is not None and row.status == "cancelled"
    assert await control(store) == {"stop_through": 0, "tasks": {}}  # stale messages stay dead
    await post(store, RetryRequested(workflow_id="w"))
    await coord.step()
    assert [t.epoch for t in await take_tasks(store)] == [1]  # not covered by the old stop


async def test_unreadable_event_goes_to_the_dead_letter_queue(
    store: Store, clock: FakeClock
) -> None:
    coord = coordinator(store, clock)
    await store.queues.send(keys.COMPLETIONS_QUEUE, [OutgoingMessage(b"\xc1garbage")])
    await coord.step()
    [dead] = await store.queues.dead_letters(keys.COMPLETIONS_QUEUE)
    assert "cannot be parsed" in dead.reason


async def test_a_second_coordinator_is_refused_while_the_lease_is_held(
    store: Store, clock: FakeClock
) -> None:
    first = coordinator(store, clock)
    stop = asyncio.Event()
    running = asyncio.create_task(first.run(stop))
    while first.lease.lease is None:
        await asyncio.sleep(0.01)
    with pytest.raises(LeaseHeld):
        await coordinator(store, clock).run(asyncio.Event())
    stop.set()
    await asyncio.wait_for(running, 5)
    assert await store.leases.get(keys.COORDINATOR_LEASE) is None


async def test_a_coordinator_that_lost_its_lease_stops_writing(
    store: Store, clock: FakeClock
) -> None:
    coord = coordinator(store, clock)
    await submit(store, fan_out(1), workflow_id="w", clock=clock)
    coord.lease.lost = True
    before = store.documents.puts["states"]
    with pytest.raises(LeaseLost):
        await coord.advance("w", [SubmitRequested(workflow_id="w")])
    with pytest.raises(LeaseLost):
        await coord.step()
    assert store.documents.puts["states"] == before
    depth = await store.queues.depth(keys.COMPLETIONS_QUEUE)
    assert depth.visible + depth.invisible == 1  # the submit event is not acknowledged


async def test_a_workflow_reopened_by_a_retry_is_swept_again(
    store: Store, clock: FakeClock
) -> None:
    coord = coordinator(store, clock, timeout_grace_s=1)
    result = await submit(
        store, definition([{"name": "t", "timeout_s": 5}]), workflow_id="w", clock=clock
    )
    await coord.step()
    [first] = await take_tasks(store)
    await post(store, finished(first, clock, ok=False, error="boom", retryable=False))
    await coord.step()
    assert (await load_state(store, "w", result.plan)).status == "failed"
    await post(store, RetryRequested(workflow_id="w"))
    await coord.step()
    [second] = await take_tasks(store)
    started = TaskStarted(workflow_id="w", task=second.task, attempt=second.attempt, at=clock())
    await post(store, started)
    await coord.step()
    clock.advance(10)  # the attempt outlives its timeout: only a sweep can tell
    await coord.sweep()
    st = await load_state(store, "w", result.plan)
    assert st.status == "failed" and "within the 5s timeout" in (st.errors.get(0) or "")


class Commits:
    """A committer that records each batch and commits it in order (as without one)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.batches: list[list[Any]] = []

    async def __call__(self, ops: Any) -> list[str]:
        self.batches.append(list(ops))
        return await commit_in_order(self.store, ops)


async def _running(store: Store, clock: FakeClock, coord: Coordinator, ids: list[str]) -> list[Any]:
    """Submit fan-outs of 3 and finish their roots: each has 3 tasks dispatched."""
    for workflow_id in ids:
        await submit(store, fan_out(3), workflow_id=workflow_id, clock=clock)
    await coord.step()
    roots = await take_tasks(store)
    await post(store, *[finished(t, clock) for t in roots])
    await coord.step()
    tasks = await take_tasks(store)
    assert len(tasks) == 3 * len(ids)
    return tasks


async def test_a_sweep_commits_many_workflows_writes_together(
    store: Store, clock: FakeClock
) -> None:
    coord = coordinator(store, clock, index_interval_s=5.0, confirm_after_s=5.0)
    ids = [f"w{i}" for i in range(5)]
    await _running(store, clock, coord, ids)
    commits = Commits(store)
    store.committer = commits
    clock.advance(5)
    before = store.documents.puts["states"]
    await coord.sweep()  # every state owes its confirmation, every row its counts
    assert len(commits.batches) == 1
    [ops] = commits.batches
    assert sum(isinstance(op, UpsertOp) for op in ops) == len(ids)  # the counts moved
    assert store.documents.puts["states"] - before == len(ids)
    for workflow_id in ids:
        found = await read_state(store, workflow_id, coord._cache.peek(workflow_id).plan)  # type: ignore[union-attr]
        assert found is not None and not found[0].unconfirmed
        row = await store.index.get(workflow_id)
        assert row is not None and row.data["counts"] == {"completed": 1, "ready": 3}
    await coord.sweep()  # nothing owed: nothing written
    assert len(commits.batches) == 1


async def test_a_sweep_writes_owed_index_rows_in_one_commit(store: Store, clock: FakeClock) -> None:
    coord = coordinator(store, clock, index_interval_s=5.0, confirm_after_s=1000.0)
    ids = [f"w{i}" for i in range(4)]
    tasks = await _running(store, clock, coord, ids)
    clock.advance(5)
    await coord.sweep()  # the rows say the tasks went out
    first = {t.workflow_id: t for t in tasks}  # one task of each workflow
    started = [
        TaskStarted(workflow_id=t.workflow_id, task=t.task, attempt=t.attempt, at=clock())
        for t in first.values()
    ]
    await post(store, *started)
    await coord.step()  # counts move, but the rows are not due yet
    commits = Commits(store)
    store.committer = commits
    clock.advance(5)
    await coord.sweep()
    assert len(commits.batches) == 1
    [ops] = commits.batches
    assert sum(isinstance(op, UpsertOp) for op in ops) == len(ids)
    for workflow_id in ids:
        row = await store.index.get(workflow_id)
        assert row is not None and row.data["counts"]["running"] == 1


async def test_a_conflict_in_a_sweeps_commit_holds_no_other_workflow_back(
    store: Store, clock: FakeClock
) -> None:
    coord = coordinator(store, clock, confirm_after_s=5.0)
    ids = [f"w{i}" for i in range(4)]
    await _running(store, clock, coord, ids)
    plan = coord._cache.peek("w0").plan  # type: ignore[union-attr]
    # Another writer moved w2's state on: this coordinator's copy is stale.
    doc = await store.documents.get(keys.state("w2"))
    assert doc is not None
    await store.documents.put(keys.state("w2"), doc.data, if_match=doc.etag)
    clock.advance(5)
    await coord.sweep()
    assert coord.stats.conflicts >= 1
    for workflow_id in ("w0", "w1", "w3"):  # their confirmations are written all the same
        found = await read_state(store, workflow_id, plan)
        assert found is not None and not found[0].unconfirmed, workflow_id
    found = await read_state(store, "w2", plan)
    assert found is not None and found[0].unconfirmed  # untouched: what the other wrote


class RefusesOne:
    """A committer that fails, with ``error``, every batch writing one workflow's state."""

    def __init__(self, store: Store, workflow_id: str, error: Exception) -> None:
        self.store = store
        self.key = keys.state(workflow_id)
        self.error = error

    async def __call__(self, ops: Any) -> list[str]:
        if any(getattr(op, "key", None) == self.key for op in ops):
            raise self.error
        return await commit_in_order(self.store, ops)


@pytest.mark.parametrize(
    "error",
    [RuntimeError("a surprise in the commit"), MessageTooLarge("a message too large")],
    ids=["unexpected", "permanent"],
)
async def test_a_sweep_commit_that_fails_for_good_quarantines_that_workflow_alone(
    store: Store, clock: FakeClock, error: Exception
) -> None:
    coord = coordinator(store, clock, confirm_after_s=5.0)
    ids = [f"w{i}" for i in range(4)]
    await _running(store, clock, coord, ids)
    plan = coord._cache.peek("w0").plan  # type: ignore[union-attr]
    store.committer = RefusesOne(store, "w2", error)
    clock.advance(5)
    await coord.sweep()  # every state owes its confirmation; w2's write cannot be made
    for workflow_id in ("w0", "w1", "w3"):  # their confirmations are written all the same
        found = await read_state(store, workflow_id, plan)
        assert found is not None and not found[0].unconfirmed, workflow_id
    assert coord.quarantine_reason("w2") is not None  # set aside, not retried as it is
    row = await store.index.get("w2")
    assert row is not None and row.status == state.QUARANTINED


async def test_a_sweep_passes_over_workflows_with_nothing_due(
    store: Store, clock: FakeClock
) -> None:
    """Thousands of cached runs waiting on their tasks cost a sweep nothing each; the
    one whose attempt outlived its timeout is still swept (and retried)."""
    coord = coordinator(store, clock, timeout_grace_s=5, index_interval_s=1.0, confirm_after_s=60)
    idle = [f"idle{i}" for i in range(20)]
    for workflow_id in idle:
        await submit(store, definition([{"name": "t"}]), workflow_id=workflow_id, clock=clock)
    slow = definition([{"name": "slow", "timeout_s": 10, "num_retries": 1}])
    result = await submit(store, slow, workflow_id="w", clock=clock)
    await coord.step()
    assert len(await take_tasks(store)) == len(idle) + 1
    await post(store, TaskStarted(workflow_id="w", task=0, attempt=1, at=clock()))
    await coord.step()
    swept: list[str] = []
    stage = coord._swept

    def counted(batch: Any, entry: Any, now: float) -> Any:
        swept.append(entry.state.workflow_id)
        return stage(batch, entry, now)

    coord._swept = counted  # type: ignore[method-assign]
    clock.advance(2)
    await coord.sweep()  # what is owed (w's row says it runs) is written...
    swept.clear()
    clock.advance(2)
    await coord.sweep()  # ...and then nothing is due: no run is swept
    assert swept == []
    clock.advance(12)
    await coord.sweep()
    assert swept == ["w"]
    st = await load_state(store, "w", result.plan)
    assert st.attempt[0] == 2 and "timeout" in st.errors[0]
