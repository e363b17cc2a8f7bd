"""Oversized payloads on every store: a 60 KB param rendered into a command, a 60 KB
compensation command, large signal data — each workflow runs to its end, because no
message dagq builds is ever over the queue limit (they travel by reference; every
store refuses a message over it)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from dagq.client import Client
from dagq.local import LocalRunner
from dagq.state import TaskStatus
from dagq.stores.azure import open_azure_store
from dagq.stores.base import Store
from dagq.stores.memory import open_memory_store
from dagq.stores.sqlite import open_sqlite_store
from dagq.views import load_view
from tests.conftest import azure_prefix
from tests.helpers import definition

pytestmark = pytest.mark.timeout(120)

BIG = "b" * 60_000


@pytest.fixture(params=["memory", "sqlite", "azure"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    if request.param == "memory":
        opened: Store = open_memory_store()
    elif request.param == "sqlite":
        opened = open_sqlite_store(tmp_path / "dagq.db")
    else:
        request.getfixturevalue("azurite")
        opened = open_azure_store(f"azure://devstoreaccount1/{azure_prefix()}", environ={})
    yield opened
    await opened.close()


async def run(store: Store, tasks: list[dict[str, Any]], **params: Any) -> tuple[str, Any]:
    d = definition(tasks, params={name: "" for name in params})
    runner = LocalRunner(store, workers=2)
    submitted = await runner.submit(d, params=params, workflow_id="wf")
    status = await asyncio.wait_for(runner.drive(), 90)
    return status, await load_view(store, submitted.workflow_id)


async def test_a_60_kb_param_in_a_command_runs_to_completion(store: Store) -> None:
    count = 'printf %s {{ params.big }} | wc -c | tr -d " " > "$DAGQ_OUTPUT"'
    status, _ = await run(store, [{"name": "count", "cmd": count}], big=BIG)

    assert status == "completed"
    assert await Client(store).output("wf", "count") == 60_000


async def test_a_60_kb_compensation_command_runs(store: Store, tmp_path: Path) -> None:
    undone = tmp_path / "undone.txt"
    tasks = [
        {
            "name": "charge",
            "cmd": "true",
            "compensate": {"cmd": f"printf %s {{{{ params.big }}}} | wc -c > {undone}"},
        },
        {"name": "ship", "cmd": "exit 1", "depends_on": ["charge"]},
    ]
    status, view = await run(store, tasks, big=BIG)

    assert status != "running", view
    assert undone.read_text().strip() == "60000"


async def test_large_signal_data_reaches_the_waiting_task(store: Store) -> None:
    tasks = [
        {"name": "approve", "wait_for": {"signal": "approved"}},
        {"name": "use", "call": "tests.sample_tasks:length", "depends_on": ["approve"]},
    ]
    d = definition(tasks)
    runner = LocalRunner(store, workers=2)
    await runner.submit(d, params={}, workflow_id="wf")
    driving = asyncio.create_task(runner.drive())

    async def waiting() -> None:
        while (await runner.current_state()).task_status[0] != TaskStatus.WAITING:
            await asyncio.sleep(0.02)

    await asyncio.wait_for(waiting(), 30)
    await Client(store).signal("wf", "approved", {"note": BIG})
    status = await asyncio.wait_for(driving, 60)

    assert status == "completed"
    assert await Client(store).output("wf", "approve") == {"note": BIG}
    assert await Client(store).output("wf", "use") == 1
