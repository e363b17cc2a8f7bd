"""``dagq run`` starts a Python process for its pool only when its file has Python tasks.

A worker starts its pool's first process as it starts (``WorkerOptions.warm_pool``), so
the first Python task does not wait for an interpreter to boot. A run whose tasks are
all shell commands (undos included) would only boot one to stop it again, and wait for
that at its end; it starts none, and still starts one on demand if a Python task came.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dagq.local import LocalRunner
from dagq.plan import compile_plan, runs_python
from dagq.runners.pool import TaskPool
from dagq.stores.memory import open_memory_store
from tests.helpers import definition

pytestmark = pytest.mark.timeout(30)


def plan_of(tasks: list[dict[str, Any]]) -> Any:
    return compile_plan(definition(tasks), {})


def test_a_plan_runs_python_when_a_task_or_an_undo_is_not_a_shell_command() -> None:
    shell = {"name": "a", "cmd": "true"}
    python = {"name": "b", "call": "tests.sample_tasks:echo"}
    undone_in_python = {**shell, "compensate": {"call": "tests.sample_tasks:echo"}}

    assert not runs_python(plan_of([shell]))
    assert runs_python(plan_of([shell, python]))
    assert runs_python(plan_of([undone_in_python]))


@pytest.fixture
def starts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What asked the pools for a process: 'warm' (at the start), 'task' (on demand)."""
    asked: list[str] = []
    warm, acquire = TaskPool.warm, TaskPool._acquire

    def counted_warm(self: TaskPool) -> None:
        asked.append("warm")
        warm(self)

    async def counted_acquire(self: TaskPool) -> Any:
        asked.append("task")
        return await acquire(self)

    monkeypatch.setattr(TaskPool, "warm", counted_warm)
    monkeypatch.setattr(TaskPool, "_acquire", counted_acquire)
    return asked


async def run(tasks: list[dict[str, Any]]) -> str:
    runner = LocalRunner(open_memory_store(), workers=2)
    await runner.submit(definition(tasks), params={}, workflow_id="w")
    return await asyncio.wait_for(runner.drive(), 20)


async def test_a_run_of_shell_tasks_starts_no_python_process(starts: list[str]) -> None:
    status = await run([{"name": "a", "cmd": "true"}, {"name": "b", "depends_on": ["a"]}])

    assert status == "completed"
    assert starts == []


async def test_a_run_with_a_python_task_warms_its_pool_first(starts: list[str]) -> None:
    status = await run(
        [{"name": "a", "cmd": "true"}, {"name": "b", "call": "tests.sample_tasks:pid"}]
    )

    assert status == "completed"
    assert starts == ["warm", "task"]
