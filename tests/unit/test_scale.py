"""What keeps a very large run small (issue 17, scale): a plan shares equal task specs,
a run keeps at most a window of attempts in flight, the submitter's plan is the
coordinator's, and a known plan's definition is not decoded task by task."""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from dagq import coordinator, explanation
from dagq.definition import TaskDef, WorkflowDef
from dagq.plan import compile_plan, resolve_params
from dagq.snapshots import decode, encode
from dagq.stores import open_store
from dagq.submission import submit
from dagq.transitions import DISPATCH_WINDOW
from tests.helpers import Sim, definition


def fan_out(n: int, **workflow: Any) -> Sim:
    tasks: list[dict[str, Any]] = [{"name": "root", "cmd": "true"}]
    tasks += [{"name": f"t{i}", "cmd": "true", "depends_on": ["root"]} for i in range(n)]
    tasks.append({"name": "join", "cmd": "true", "depends_on": [f"t{i}" for i in range(n)]})
    return Sim(tasks, **workflow)


def test_tasks_with_equal_specs_share_one_spec_object() -> None:
    d = definition(
        [
            {"name": "a", "call": "m:f", "args": {"x": [1, 2]}},
            {"name": "b", "call": "m:f", "args": {"x": [1, 2]}},
            {"name": "c", "call": "m:f", "args": {"x": [1, 3]}},
            {"name": "d", "call": "m:f", "args": {"x": [1.0, 2]}},
            {"name": "e", "cmd": "echo hi"},
            {"name": "f", "cmd": "echo hi"},
        ]
    )
    plan = compile_plan(d, resolve_params(d, {}))
    a, b, c, d_, e, f = plan.tasks
    assert a.spec is b.spec and e.spec is f.spec
    assert c.spec is not a.spec and c.spec.args == {"x": [1, 3]}
    assert d_.spec is not a.spec and d_.spec.args == {"x": [1.0, 2]}


# Values whose encodings may be equal although the values differ in type.
_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats(-3, 3) | st.sampled_from("ab"),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.lists(inner, max_size=3).map(tuple)
        | st.dictionaries(st.sampled_from("xy"), inner, max_size=2)
    ),
    max_leaves=6,
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_values, min_size=2, max_size=4))
def test_a_shared_spec_is_always_equal_in_value_and_type(args: list[Any]) -> None:
    """Sharing never changes a task's spec: each is what the task compiled alone gets,
    types included (a task never receives 1 where it was given 1.0, nor a list for a
    tuple)."""
    tasks = [TaskDef(name=f"t{i}", call="m:f", args=a) for i, a in enumerate(args)]
    plan = compile_plan(WorkflowDef(name="w", tasks=tasks), {})
    for task, alone in zip(plan.tasks, tasks, strict=True):
        own = compile_plan(WorkflowDef(name="w", tasks=[alone]), {}).tasks[0].spec
        assert task.spec == own
        assert _shape(task.spec.args) == _shape(own.args)


def _shape(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return (type(value), [_shape(v) for v in value])
    return (type(value), value)


def test_a_fan_out_wider_than_the_window_sends_a_window_then_one_per_finished() -> None:
    n = DISPATCH_WINDOW + 50
    sim = fan_out(n)
    sim.start()
    sim.finish("root")
    assert len(sim.dispatched) == 1 + DISPATCH_WINDOW
    assert sim.state.in_flight == DISPATCH_WINDOW
    assert len(sim.state.held) == 50
    assert sim.status(f"t{n - 1}") == "ready"  # ready, not yet sent
    sim.finish("t0")
    sim.finish("t1")
    assert [name for name, *_ in sim.dispatched[-2:]] == [f"t{DISPATCH_WINDOW}", f"t{n - 49}"]
    found = explanation.explain(
        sim.plan, sim.state, [], sim.index(f"t{n - 1}"), explanation.Facts(now=sim.now)
    )
    assert "the dispatch window" in found.waiting_for[0].detail
    for i in range(2, n):
        sim.finish(f"t{i}")
    sim.finish("join")
    assert sim.state.status == "completed"
    assert len(sim.dispatched) == n + 2  # each task sent once


def test_tasks_held_by_the_window_are_held_again_after_a_reload() -> None:
    """The window needs nothing stored: a state read back holds the same tasks."""
    sim = fan_out(DISPATCH_WINDOW + 5)
    sim.start()
    sim.finish("root")
    again = decode(encode(sim.state), sim.plan)
    assert list(again.held) == list(sim.state.held)
    assert again.in_flight == DISPATCH_WINDOW


def test_a_smaller_max_parallelism_still_rules() -> None:
    sim = fan_out(30, max_parallelism=7)
    sim.start()
    sim.finish("root")
    assert sim.state.in_flight == 7


async def test_the_submitters_plan_is_handed_over_before_anything_is_stored() -> None:
    store = open_store("memory://")
    handed: list[tuple[str, Any, list[str]]] = []
    stored: list[str] = []
    put = store.documents.put

    async def recording_put(key: str, data: bytes, **options: Any) -> str:
        stored.append(key)
        return await put(key, data, **options)

    store.documents.put = recording_put  # type: ignore[method-assign]
    d = definition([{"name": "a", "cmd": "true"}])
    result = await submit(
        store, d, workflow_id="wf-x", compiled=lambda f, p: handed.append((f, p, list(stored)))
    )
    assert handed == [(result.fingerprint, result.plan, [])]  # before any document
    assert stored  # and the documents were stored afterwards
    await store.close()


def test_a_known_plan_is_used_without_decoding_the_tasks() -> None:
    d = definition([{"name": "a", "cmd": "true"}, {"name": "b", "cmd": "true"}])
    plan = compile_plan(d, {})
    document = {
        "workflow_id": "wf-x",
        "definition": msgspec.to_builtins(d),
        "params": {},
        "created_at": 1.0,
        "fingerprint": "f" * 32,
        "tenant": "t1",
        "labels": {"k": "v"},
        "submitted_by": "cli:me",
    }
    # A task no decoder would accept: it is never decoded when the plan is known.
    document["definition"]["tasks"][1]["bogus"] = 1
    data = msgspec.json.encode(document)
    found = coordinator._compile(data, {"f" * 32: plan}.get)
    assert found.plan is plan and not found.new
    assert (found.name, found.tenant, found.labels, found.submitted_by) == (
        d.name,
        "t1",
        {"k": "v"},
        "cli:me",
    )
