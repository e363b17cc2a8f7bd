"""Readers never see a half-deleted state (issue 11, case 6), on real processes.

A ``dagq coordinator`` and a ``dagq worker`` run a 3,000-task workflow — over
``persistence.INLINE_TASKS``, so its state is a header, a base and deltas, folded into
a new base again and again while it runs. Meanwhile ``dagq status --watch``, repeated
``dagq tasks --json`` / ``dagq status --json`` and a tight loop of reads in this
process follow the headers they read; not one of them may fail.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from dagq import keys
from dagq.persistence import INLINE_TASKS
from dagq.state import WORKFLOW_TERMINAL
from dagq.stores import open_store
from dagq.views import load_view
from tests.integration.cli_harness import DagqCli

pytestmark = pytest.mark.timeout(240)

WORKFLOW_ID = "wide-1"
N_TASKS = 3_000

TASKS = """
    import time


    def nap() -> None:
        time.sleep(0.004)
"""


def _wide() -> dict[str, Any]:
    tasks: list[dict[str, Any]] = [{"name": "root", "call": "race_tasks:nap"}]
    tasks += [
        {"name": f"t{i}", "call": "race_tasks:nap", "depends_on": ["root"]} for i in range(N_TASKS)
    ]
    return {"name": "wide", "tasks": tasks}


class TightReader:
    """Reads the run's view again and again, in a thread with its own loop, until it ends."""

    def __init__(self, store_url: str) -> None:
        self.store_url = store_url
        self.reads = 0
        self.errors: list[BaseException] = []
        self.statuses: set[str] = set()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._loop()), daemon=True)

    async def _loop(self) -> None:
        store = open_store(self.store_url)
        try:
            while not self.stop.is_set():
                try:
                    view = await load_view(store, WORKFLOW_ID)
                except Exception as exc:
                    self.errors.append(exc)
                    continue
                self.reads += 1
                self.statuses.add(view.status)
                if view.status in WORKFLOW_TERMINAL:
                    return
        finally:
            await store.close()


def test_readers_of_a_large_running_workflow_never_fail(tmp_path: Path) -> None:
    with DagqCli(tmp_path) as cli:
        cli.write("race_tasks.py", TASKS)
        wf = cli.workflow("wide.yaml", _wide())
        cli.start_coordinator()
        cli.start_worker("-c", "4", "--import-path", cli.workdir)
        cli.json("submit", wf, "--id", WORKFLOW_ID)
        watch = cli.start("status", WORKFLOW_ID, "--watch")
        reader = TightReader(cli.store_url)
        reader.thread.start()

        failures = []
        seen_running = 0
        while reader.thread.is_alive():
            for command in ("tasks", "status"):
                result = cli.run(command, WORKFLOW_ID, "--json", timeout_s=60)
                if result.code != 0:
                    failures.append(result.output)
                elif '"running"' in result.stdout:
                    seen_running += 1
            reader.thread.join(timeout=0.05)
        reader.thread.join(timeout=120)

        assert not failures, failures[0]
        assert not reader.errors, repr(reader.errors[0])
        assert watch.wait(120).code == 0, watch.stderr()
        assert "damaged" not in watch.stderr()
        # The reads overlapped the run, and the state was kept in parts that were folded.
        assert seen_running > 0 and "running" in reader.statuses and reader.reads >= 10
        assert N_TASKS > INLINE_TASKS
        parts = cli.with_store(
            lambda store: store.documents.list(keys.state_parts_prefix(WORKFLOW_ID))
        )
        assert any("/base-" in name for name in parts)
        assert cli.workflow_status(WORKFLOW_ID) == "completed"
