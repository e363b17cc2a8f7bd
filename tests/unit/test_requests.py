"""Requests (cancel, retry, signal) carry ids and act once; signals are never lost
silently: each wait takes the next one, in the order they came. Pure machine and
encoding tests; the store-level duplicates are in test_duplicates.py."""

from __future__ import annotations

import zlib
from typing import Any

import msgspec
import pytest

from dagq import snapshots
from dagq.client import Client
from dagq.coordinator import Coordinator, CoordinatorOptions
from dagq.errors import UsageError
from dagq.messages import (
    CancelRequested,
    Event,
    RetryRequested,
    SignalSent,
    SubmitRequested,
    TaskFinished,
    TaskStarted,
)
from dagq.state import MAX_REQUEST_IDS
from dagq.stores.memory import open_memory_store
from dagq.submission import submit
from tests.conformance.conftest import FakeClock
from tests.helpers import Sim, definition

pytestmark = pytest.mark.timeout(30)


def signal(sim: Sim, data: object, request_id: str = "") -> None:
    sim.apply(SignalSent(workflow_id="wf-1", name="go", data=data, request_id=request_id))


def two_waits() -> Sim:
    """'first' waits for 'go' once 'prep' is done; 'second' waits for 'go' after it."""
    return Sim(
        [
            {"name": "prep"},
            {"name": "first", "wait_for": {"signal": "go"}, "depends_on": ["prep"]},
            {"name": "second", "wait_for": {"signal": "go"}, "depends_on": ["first"]},
        ]
    )


# --- request ids -------------------------------------------------------------------------


def test_a_retry_delivered_again_after_the_rerun_failed_leaves_the_run_failed() -> None:
    sim = Sim([{"name": "t"}])
    sim.start()
    sim.finish("t", ok=False, error="boom", retryable=False)
    retry = RetryRequested(workflow_id="wf-1", request_id="r1")
    sim.apply(retry)
    sim.finish("t", ok=False, error="boom again", retryable=False)
    assert sim.state.status == "failed"
    before = snapshots.encode(sim.state)

    fx = sim.apply(retry)

    assert sim.state.status == "failed" and sim.state.attempt.tolist() == [2]
    assert fx.dispatch == [] and fx.history == []
    assert snapshots.encode(sim.state) == before


def test_a_request_without_an_id_from_an_older_client_is_still_applied() -> None:
    sim = Sim([{"name": "t"}])
    sim.start()
    sim.finish("t", ok=False, retryable=False)
    sim.apply(RetryRequested(workflow_id="wf-1"))
    assert sim.state.status == "running" and sim.state.requests == []


def test_a_state_remembers_only_the_most_recent_request_ids() -> None:
    sim = Sim([{"name": "t", "wait_for": {"signal": "go"}}])
    for n in range(MAX_REQUEST_IDS + 5):
        sim.apply(CancelRequested(workflow_id="wf-1", request_id=f"c{n}"))
    assert len(sim.state.requests) == MAX_REQUEST_IDS
    assert sim.state.requests[-1] == f"c{MAX_REQUEST_IDS + 4}"
    assert "c0" not in sim.state.requests


def test_request_ids_and_kept_signals_survive_a_reload() -> None:
    sim = two_waits()
    sim.start()
    signal(sim, "a", "s1")
    signal(sim, "b", "s2")
    reloaded = snapshots.decode(snapshots.encode(sim.state), sim.plan)
    assert reloaded.requests == ["s1", "s2"]
    assert reloaded.signals == {"go": ["a", "b"]}


def test_a_state_document_from_before_request_ids_is_read() -> None:
    sim = two_waits()
    sim.start()
    head = snapshots.header(sim.state, inline=snapshots.encode_tasks(sim.state))
    fields = list(msgspec.structs.astuple(head))[:-2]  # no requests, no signal_queue
    fields[head.__struct_fields__.index("signals")] = {"go": {"approved": True}}
    old = b"z" + zlib.compress(msgspec.msgpack.encode(fields))

    state = snapshots.decode(old, sim.plan)

    assert state.requests == []
    assert state.signals == {"go": [{"approved": True}]}  # the kept signal, still kept


# --- signals: every early one kept, in order -------------------------------------------


def test_two_early_signals_are_taken_by_two_waits_in_the_order_sent() -> None:
    sim = two_waits()
    sim.start()
    signal(sim, "first one", "s1")
    signal(sim, "second one", "s2")

    sim.finish("prep")

    assert sim.status("first") == "completed" and sim.status("second") == "completed"
    assert sim.state.outputs[sim.index("first")] == "first one"
    assert sim.state.outputs[sim.index("second")] == "second one"
    assert sim.state.signals == {}


def test_a_signal_no_task_can_take_is_recorded_as_ignored_not_dropped_silently() -> None:
    sim = Sim(
        [{"name": "prep"}, {"name": "w", "wait_for": {"signal": "go"}, "depends_on": ["prep"]}]
    )
    sim.start()
    signal(sim, "kept", "s1")
    signal(sim, "surplus", "s2")

    ignored = [e for e in sim.history if e.kind == "signal_ignored"]
    assert len(ignored) == 1 and "'go'" in (ignored[0].detail or "")
    sim.finish("prep")
    assert sim.state.outputs[sim.index("w")] == "kept"


def test_one_signal_completes_one_of_two_tasks_waiting_for_it() -> None:
    sim = Sim(
        [{"name": "a", "wait_for": {"signal": "go"}}, {"name": "b", "wait_for": {"signal": "go"}}]
    )
    sim.start()
    signal(sim, 1, "s1")
    assert (sim.status("a"), sim.status("b")) == ("completed", "waiting")
    signal(sim, 2, "s2")
    assert sim.status("b") == "completed" and sim.state.status == "completed"


async def test_the_client_refuses_a_signal_that_no_task_is_left_to_take() -> None:
    clock = FakeClock()
    store = open_memory_store(clock=clock)
    tasks = [
        {"name": "prep"},
        {"name": "review", "wait_for": {"signal": "go"}, "depends_on": ["prep"]},
    ]
    await submit(store, definition(tasks), workflow_id="w", clock=clock)
    client = Client(store)
    await client.signal("w", "go", {"approved": True})
    await Coordinator(store, CoordinatorOptions(), clock=clock).step()

    with pytest.raises(UsageError) as refused:
        await client.signal("w", "go", {"approved": False})

    message = str(refused.value)
    assert "already holds 1 unused 'go' signal" in message and "review" in message
    assert "\n" not in message


# --- every kind of event, delivered twice, acts once -------------------------------------


def twice(sim: Sim, event: Event) -> None:
    """Apply ``event``, then its copy: the copy must change nothing and do nothing."""
    sim.apply(event)
    before = snapshots.encode(sim.state)
    fx = sim.apply(event)
    assert (fx.dispatch, fx.history, fx.timers, fx.stop, fx.finished) == ([], [], [], False, False)
    assert snapshots.encode(sim.state) == before, f"{type(event).__name__} acted twice"


def test_every_kind_of_event_delivered_twice_acts_once() -> None:
    sim = Sim(
        [
            {"name": "prep", "compensate": {"cmd": "undo"}},
            {"name": "fan", "foreach": "params.items", "depends_on": ["prep"]},
            {"name": "gate", "wait_for": {"signal": "go"}, "depends_on": ["prep"]},
            {"name": "last", "depends_on": ["fan", "gate"]},
        ],
        params={"items": [1, 2]},
    )
    i = sim.index
    at = sim.now

    def started(task: str, **kw: Any) -> TaskStarted:
        return TaskStarted(workflow_id="wf-1", task=i(task), attempt=1, at=at, **kw)

    def done(task: str, ok: bool = True, **kw: Any) -> TaskFinished:
        return TaskFinished(workflow_id="wf-1", task=i(task), attempt=1, at=at, ok=ok, **kw)

    twice(sim, SubmitRequested(workflow_id="wf-1"))
    twice(sim, started("prep"))
    twice(sim, done("prep", output={"id": 7}))
    twice(sim, started("fan", item=0))
    twice(sim, done("fan", item=0))
    twice(sim, done("fan", item=1))
    twice(sim, SignalSent(workflow_id="wf-1", name="go", request_id="s1"))
    twice(sim, started("last"))
    twice(sim, done("last", ok=False, error="boom", retryable=False))
    assert sim.state.status == "compensating"
    twice(sim, started("prep", undo=True))
    twice(sim, done("prep", undo=True))
    assert sim.state.status == "failed"
    twice(sim, RetryRequested(workflow_id="wf-1", request_id="r1"))  # ignored: undone


def test_cancel_and_retry_delivered_twice_act_once() -> None:
    sim = Sim([{"name": "t", "retry": {"backoff_s": 0}}])
    twice(sim, SubmitRequested(workflow_id="wf-1"))
    twice(sim, CancelRequested(workflow_id="wf-1", request_id="c1"))
    assert sim.state.status == "cancelled"
    twice(sim, RetryRequested(workflow_id="wf-1", request_id="r1"))
    assert sim.state.status == "running" and sim.state.attempt.tolist() == [2]
    twice(sim, CancelRequested(workflow_id="wf-1", request_id="c2"))
    assert sim.state.status == "cancelled"
