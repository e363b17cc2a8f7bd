"""Tasks with the same parents, dispatched together, get their inputs gathered once."""

from __future__ import annotations

import pytest

from dagq.dispatching import SharedInputs, task_message
from dagq.machine import Dispatch
from dagq.messages import decode_task
from tests.helpers import Sim

pytestmark = pytest.mark.timeout(10)


def layer_below(width: int) -> tuple[Sim, list[Dispatch]]:
    """Two layers, every task of the second fed by every task of the first; the first
    has run: its last end made the whole second layer ready at once."""
    above = [f"a{j}" for j in range(width)]
    tasks: list[dict[str, object]] = [{"name": name} for name in above]
    tasks += [{"name": f"b{j}", "depends_on": above} for j in range(width)]
    sim = Sim(tasks)
    sim.start()
    for j, name in enumerate(above):
        sim.started(name)
        fx = sim.finish(name, output={"n": j})
    return sim, fx.dispatch


def test_a_layer_gets_its_parents_outputs_gathered_once_into_whole_messages() -> None:
    sim, dispatched = layer_below(5)
    assert len(dispatched) == 5
    shared: SharedInputs = {}

    sent = [task_message(sim.plan, sim.state, d, shared=shared) for d in dispatched]
    alone = [task_message(sim.plan, sim.state, d) for d in dispatched]

    assert len(shared) == 1  # one set of parents: gathered once
    assert [o.message.body for o in sent] == [o.message.body for o in alone]
    message = decode_task(sent[3].message.body)
    assert message.name == sim.plan.tasks[dispatched[3].task].name
    assert message.inputs == {f"a{j}": {"n": j} for j in range(5)}
