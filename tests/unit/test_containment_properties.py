"""Property: an exception at any step of the coordinator's work on one workflow
quarantines that workflow and affects no other.

Hypothesis picks the step (load, decode, compile, resolve, apply, track, stage,
settle, sweep), the exception, the victim and the call from which the step fails for
it (a bug or a damage is deterministic: once it fails, it keeps failing). Every other
workflow must complete, no message may be dead-lettered or left unacknowledged, and
once the fault is removed and the victim released, it completes too from its kept
events.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dagq import compiled as compiled_module
from dagq import coordinator as coordinator_module
from dagq import keys, machine, quarantine, snapshots
from dagq.client import Client
from dagq.compiled import PLANS
from dagq.coordinator import Coordinator
from dagq.errors import DamagedData, PayloadTooLarge
from dagq.observability.runs import RunTelemetry
from dagq.state import QUARANTINED
from dagq.stores.base import Batch, PutOp, Store
from dagq.stores.memory import open_memory_store
from dagq.submission import submit
from tests.conformance.conftest import FakeClock
from tests.helpers import definition
from tests.unit.test_containment import work

pytestmark = pytest.mark.timeout(300)

WORKFLOWS = ("w0", "w1", "w2")

EXCEPTIONS: dict[str, Callable[[], BaseException]] = {
    "ValueError": lambda: ValueError("bad value"),
    "KeyError": lambda: KeyError("missing"),
    "TypeError": lambda: TypeError("wrong type"),
    "RuntimeError": lambda: RuntimeError("surprise"),
    "RecursionError": lambda: RecursionError("maximum recursion depth exceeded"),
    "ZeroDivisionError": lambda: ZeroDivisionError("division by zero"),
    "AssertionError": AssertionError,
    "msgspec.DecodeError": lambda: msgspec.DecodeError("truncated"),
    "DamagedData": lambda: DamagedData("undecodable"),
    "PayloadTooLarge": lambda: PayloadTooLarge("too large"),
}


class Fault:
    """Raises ``make()`` for the victim from its ``nth`` call of the step on."""

    def __init__(self, victim: str, nth: int, make: Callable[[], BaseException]) -> None:
        self.victim = victim
        self.nth = nth
        self.make = make
        self.calls = 0
        self.fired = False

    def hit(self, workflow_ids: str) -> None:
        """Called for the workflow(s) (comma-separated) a call of the step is about."""
        if self.victim not in workflow_ids.split(","):
            return
        self.calls += 1
        if self.calls >= self.nth:
            self.fired = True
            raise self.make()


def _patch_function(owner: Any, name: str, id_of: Callable[..., str], fault: Fault) -> Any:
    real = getattr(owner, name)
    if asyncio.iscoroutinefunction(real):

        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            fault.hit(id_of(*args))
            return await real(*args, **kwargs)

        setattr(owner, name, async_wrapper)
    else:

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            fault.hit(id_of(*args))
            return real(*args, **kwargs)

        setattr(owner, name, wrapper)
    return real


def _decoded(data: bytes) -> str:
    return str(_real_decode_header(data).workflow_id)


_real_decode_header = snapshots.decode_header


def _committed(self: Coordinator, batch: Batch) -> str:
    """The workflows whose state a commit writes: one, or many (a batch of events)."""
    prefix = keys.state("w").removesuffix("w")
    return ",".join(
        op.key.removeprefix(prefix)
        for op in batch.ops
        if isinstance(op, PutOp) and op.key.startswith(prefix)
    )


#: step -> (object, attribute, how to find the workflow id in the call's arguments)
STEPS: dict[str, tuple[Any, str, Callable[..., str]]] = {
    "load": (coordinator_module, "read_state", lambda store, wid, plan: wid),
    "decode": (snapshots, "decode_header", _decoded),
    "compile": (compiled_module, "compile_plan", lambda d, params: str(d.name)),
    "resolve": (Coordinator, "_resolve_refs", lambda self, e, ev: e.state.workflow_id),
    "apply": (machine, "apply", lambda plan, state, *_: state.workflow_id),
    "track": (Coordinator, "_track_deadlines", lambda self, e, ev: e.state.workflow_id),
    "stage": (coordinator_module, "stage_state", lambda b, state, s: state.workflow_id),
    "settle": (coordinator_module, "settle_state", lambda s, state, *_: state.workflow_id),
    "sweep": (Coordinator, "_sweep_one", lambda self, e, now: e.state.workflow_id),
    # Outside any named step: a commit of many workflows' events, and the run's metrics.
    "commit": (Coordinator, "_commit", _committed),
    "telemetry": (RunTelemetry, "applied", lambda self, name, state, *_: state.workflow_id),
}


@contextlib.contextmanager
def injected(step: str, fault: Fault) -> Iterator[None]:
    owner, name, id_of = STEPS[step]
    real = _patch_function(owner, name, id_of, fault)
    try:
        yield
    finally:
        setattr(owner, name, real)


async def drive(coord: Coordinator, store: Store, clock: FakeClock, rounds: int) -> None:
    for _ in range(rounds):
        await coord.step()
        await coord.sweep()
        await work(store, clock)
        clock.advance(1.0)


async def statuses(store: Store) -> dict[str, str]:
    client = Client(store)
    return {w: (await client.status(w)).status for w in WORKFLOWS}


async def scenario(step: str, exception: str, victim: str, nth: int) -> None:
    clock = FakeClock()
    store = open_memory_store(clock=clock)
    tasks = [{"name": "a"}, {"name": "b", "depends_on": ["a"]}, {"name": "c", "depends_on": ["b"]}]
    for w in WORKFLOWS:  # each its own name, so the compile step can tell them apart
        await submit(store, definition(tasks, name=w), workflow_id=w, clock=clock)
    PLANS.clear()  # the coordinator compiles them, as one in another process would
    coord = Coordinator(store, clock=clock)
    fault = Fault(victim, nth, EXCEPTIONS[exception])

    with injected(step, fault):
        await drive(coord, store, clock, rounds=8)
    seen = await statuses(store)

    for w in WORKFLOWS:
        if w != victim:
            assert seen[w] == "completed", (w, seen)
    if fault.fired:
        assert seen[victim] == QUARANTINED, seen
        record = await quarantine.read(store, victim)
        assert record is not None and exception.rsplit(".", maxsplit=1)[-1] in record[0].reason
    else:
        assert seen[victim] == "completed", seen
    depth = await store.queues.depth(keys.COMPLETIONS_QUEUE)
    assert depth.visible + depth.invisible == 0
    assert await store.queues.dead_letters(None) == []

    if fault.fired:  # the cause is fixed: released, it finishes from its kept events
        await Client(store).release(victim)
        await drive(coord, store, clock, rounds=8)
        assert (await statuses(store))[victim] == "completed"


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    step=st.sampled_from(sorted(STEPS)),
    exception=st.sampled_from(sorted(EXCEPTIONS)),
    victim=st.sampled_from(WORKFLOWS),
    nth=st.integers(min_value=1, max_value=4),
)
def test_an_exception_at_any_step_quarantines_only_that_workflow(
    step: str, exception: str, victim: str, nth: int
) -> None:
    asyncio.run(scenario(step, exception, victim, nth))


@pytest.mark.parametrize("step", sorted(STEPS))
def test_each_step_once(step: str) -> None:
    """Every step, failing from its first call: the victim is surely quarantined."""
    asyncio.run(scenario(step, "RuntimeError", "w1", 1))
