"""Sagas survive cancel and deadlines: the undos of completed tasks run after a cancel
or a workflow deadline stopped the run, and are not themselves stopped by it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from dagq import machine
from dagq.coordinator import control_document
from dagq.dispatching import task_message
from dagq.history import read_history
from dagq.local import LocalRunner
from dagq.messages import CancelRequested, TaskFinished, decode_task
from dagq.state import TaskStatus
from dagq.stores.memory import open_memory_store
from dagq.submission import request_cancel
from tests.helpers import Sim, definition

pytestmark = pytest.mark.timeout(60)


def saga() -> Sim:
    undo = {"cmd": "refund", "num_retries": 0}
    return Sim(
        [
            {"name": "charge", "compensate": undo},
            {"name": "ship", "depends_on": ["charge"]},
        ]
    )


def stopped_through(sim: Sim) -> int:
    """The epoch through which workers stop attempts, per the control document."""
    return int(msgspec.json.decode(control_document(sim.state))["stop_through"])


def undo_epochs(sim: Sim, fx: machine.Effects) -> list[int]:
    return [
        decode_task(bytes(task_message(sim.plan, sim.state, d).message.body)).epoch
        for d in fx.dispatch
        if d.undo
    ]


@pytest.mark.parametrize(
    "stop",
    [
        pytest.param(lambda sim: sim.apply(CancelRequested(workflow_id="wf-1")), id="cancel"),
        pytest.param(
            lambda sim: machine.cancel(
                sim.plan, sim.state, sim.now, machine.Effects(), "deadline", final="failed"
            ),
            id="deadline",
        ),
    ],
)
def test_undos_after_a_stop_are_sent_in_an_epoch_the_stop_does_not_cover(
    stop: Callable[[Sim], object],
) -> None:
    sim = saga()
    sim.start()
    sim.finish("charge")
    sim.started("ship")
    stop(sim)
    assert sim.state.status == "cancelling"
    stop_through = stopped_through(sim)
    assert stop_through >= 0  # workers are told to stop the running 'ship'

    fx = sim.finish("ship", ok=False, error="stopped", retryable=False)

    assert sim.state.status == "compensating"
    epochs = undo_epochs(sim, fx)
    assert epochs and all(epoch > stop_through for epoch in epochs)


def test_a_compensation_after_a_plain_failure_still_ends_the_run() -> None:
    sim = saga()
    sim.start()
    sim.finish("charge")
    sim.finish("ship", ok=False, error="carrier down", retryable=False)
    assert sim.state.status == "compensating"
    i = sim.index("charge")
    sim.apply(TaskFinished(workflow_id="wf-1", task=i, attempt=1, at=sim.now, ok=True, undo=True))
    assert sim.state.status == "failed"
    assert stopped_through(sim) == sim.state.epoch  # the end stops everything, undos too


# --- on a store, with a worker running the shell commands ------------------------------


def saga_definition(workdir: Path, **workflow: object) -> object:
    return definition(
        [
            {"name": "charge", "cmd": "true", "compensate": {"cmd": f"touch {workdir}/refunded"}},
            {"name": "ship", "cmd": "sleep 30", "depends_on": ["charge"]},
        ],
        **workflow,
    )


async def _until_running(runner: LocalRunner, task: int) -> None:
    while (await runner.current_state()).task_status[task] != TaskStatus.RUNNING:
        await asyncio.sleep(0.02)


async def test_a_cancel_while_a_task_runs_refunds_the_completed_charge(tmp_path: Path) -> None:
    store = open_memory_store()
    runner = LocalRunner(store, workers=2)
    await runner.submit(saga_definition(tmp_path), params={}, workflow_id="w")  # type: ignore[arg-type]
    drive = asyncio.create_task(runner.drive())
    await asyncio.wait_for(_until_running(runner, 1), 20)

    await request_cancel(store, "w", "changed my mind")
    status = await asyncio.wait_for(drive, 30)

    assert status == "cancelled"
    assert (tmp_path / "refunded").exists()
    kinds = [e.kind for e in await read_history(store, "w")]
    assert "compensated" in kinds and "compensation_failed" not in kinds


async def test_a_workflow_deadline_while_a_task_runs_refunds_the_completed_charge(
    tmp_path: Path,
) -> None:
    store = open_memory_store()
    runner = LocalRunner(store, workers=2)
    wf = saga_definition(tmp_path, deadline_s=1)
    await runner.submit(wf, params={}, workflow_id="w")  # type: ignore[arg-type]

    status = await asyncio.wait_for(runner.drive(), 30)

    assert status == "failed"
    assert (tmp_path / "refunded").exists()
    history = await read_history(store, "w")
    assert any(e.kind == "compensated" and e.task == "charge" for e in history)
    assert "deadline of 1s exceeded" in (history[-1].detail or "")
