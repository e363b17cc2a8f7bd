"""The azure store end to end, on a real Azurite: ``dagq coordinator`` and two ``dagq
worker`` processes run a 500-task workflow submitted with ``dagq submit``; the
coordinator is SIGKILLed mid-run and restarted; a second coordinator is refused."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.azurite import Azurite
from tests.conftest import azure_prefix
from tests.integration.cli_harness import DagqCli, wait_until

pytestmark = pytest.mark.timeout(300)

TASKS = """
import os

def noop(**_):
    return None

def flaky(marker):
    # Fails on its first attempt only: the retry must pick it up.
    if not os.path.exists(marker):
        open(marker, "w").close()
        raise RuntimeError("first attempt fails on purpose")
    return {"ok": True}

def score():
    return {"score": 0.9}
"""


@pytest.fixture
def cli(tmp_path: Path, azurite: Azurite) -> Iterator[DagqCli]:
    with DagqCli(tmp_path) as cli:
        cli.store_url = f"azure://devstoreaccount1/{azure_prefix()}"
        (tmp_path / "azure_tasks.py").write_text(TASKS)
        yield cli


def workflow(cli: DagqCli) -> Path:
    fan = [
        {"name": f"t{i}", "call": "azure_tasks:noop", "depends_on": ["root"]} for i in range(494)
    ]
    return cli.workflow(
        "big.yaml",
        {
            "name": "big",
            "tasks": [
                {"name": "root", "call": "azure_tasks:noop"},
                *fan,
                {"name": "score", "call": "azure_tasks:score", "depends_on": ["root"]},
                {
                    "name": "good",
                    "call": "azure_tasks:noop",
                    "depends_on": ["score"],
                    "condition": "inputs.score.score > 0.5",
                },
                {
                    "name": "bad",
                    "call": "azure_tasks:noop",
                    "depends_on": ["score"],
                    "condition": "inputs.score.score <= 0.5",
                },
                {
                    "name": "flaky",
                    "call": "azure_tasks:flaky",
                    "depends_on": ["root"],
                    "args": {"marker": str(cli.workdir / "flaky.marker")},
                    "num_retries": 2,
                    "retry": {"backoff_s": 0.5},
                },
                {
                    "name": "join",
                    "call": "azure_tasks:noop",
                    "depends_on": [f"t{i}" for i in range(494)] + ["good", "bad", "flaky"],
                },
            ],
        },
    )


def completed(cli: DagqCli) -> int:
    try:
        return cli.view("big").counts.get("completed", 0)
    except Exception:  # not submitted yet
        return 0


def test_a_500_task_workflow_survives_a_coordinator_kill_on_azure(cli: DagqCli) -> None:
    coordinator = cli.start_coordinator(timeout_s=60)
    workers = [
        cli.start_worker(
            "-q", "default", "-c", "8", "--import-path", str(cli.workdir), timeout_s=60
        )
        for _ in range(2)
    ]
    listed = cli.json("workers", timeout_s=60)  # on record before they take any work
    assert {w.pid for w in workers} <= {w["pid"] for w in listed}
    submitted = cli.run("submit", workflow(cli), "--id", "big", timeout_s=60)
    assert submitted.code == 0, submitted.output
    wait_until(lambda: completed(cli) >= 100, timeout_s=120, what="100 tasks to complete")
    coordinator.kill()
    cli.start_coordinator(timeout_s=60)  # takes over the dead one's lease
    assert cli.wait_for_end("big", timeout_s=240) == "completed"
    statuses = cli.statuses("big")
    assert statuses["bad"] == "skipped" and statuses["good"] == "completed"
    assert sum(s == "completed" for s in statuses.values()) == 499
    tasks = {t["name"]: t for t in cli.json("tasks", "big", timeout_s=60)}
    assert tasks["flaky"]["attempt"] == 2
    events = cli.json("events", "big", timeout_s=60)
    done = Counter(e["task"] for e in events if e["kind"] == "completed")
    assert max(done.values()) == 1, "a task was completed twice in state"


def test_a_second_coordinator_is_refused_while_the_lease_is_held(cli: DagqCli) -> None:
    first = cli.start_coordinator(timeout_s=60)
    refused = cli.run("coordinator", timeout_s=60)
    assert refused.code != 0
    assert f":{first.pid}:" in refused.stderr
    assert "acquired" in refused.stderr
    doctor = json.loads(cli.run("doctor", "--json", timeout_s=60).stdout)
    lease = next(f for f in doctor if f["check"] == "coordinator")
    assert f":{first.pid}:" in lease["detail"]
