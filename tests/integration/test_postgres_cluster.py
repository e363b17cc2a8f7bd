"""The PostgreSQL store end to end: ``dagq coordinator`` and two ``dagq worker``
processes on one database run a workflow with a fan-out, conditions and a retried
failure, submitted with ``dagq submit``; the coordinator and a worker are SIGKILLed
mid-run and restarted. It completes, and no task is completed twice in state.

``DAGQ_PG_TASKS`` sizes the fan-out (default 2,000, the size the issue asks for: some
20 s here)."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import postgres_url
from tests.integration.cli_harness import DagqCli, wait_until
from tests.postgres import Cluster

FAN = int(os.environ.get("DAGQ_PG_TASKS", "2000"))

pytestmark = pytest.mark.timeout(120 + FAN // 20)

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
def cli(tmp_path: Path, postgres_cluster: Cluster) -> Iterator[DagqCli]:
    with DagqCli(tmp_path) as cli:
        cli.store_url = postgres_url(postgres_cluster)
        (tmp_path / "pg_tasks.py").write_text(TASKS)
        yield cli


def workflow(cli: DagqCli) -> Path:
    fan = [{"name": f"t{i}", "call": "pg_tasks:noop", "depends_on": ["root"]} for i in range(FAN)]
    return cli.workflow(
        "big.yaml",
        {
            "name": "big",
            "tasks": [
                {"name": "root", "call": "pg_tasks:noop"},
                *fan,
                {"name": "score", "call": "pg_tasks:score", "depends_on": ["root"]},
                {
                    "name": "good",
                    "call": "pg_tasks:noop",
                    "depends_on": ["score"],
                    "condition": "inputs.score.score > 0.5",
                },
                {
                    "name": "bad",
                    "call": "pg_tasks:noop",
                    "depends_on": ["score"],
                    "condition": "inputs.score.score <= 0.5",
                },
                {
                    "name": "flaky",
                    "call": "pg_tasks:flaky",
                    "queue": "retry",
                    "depends_on": ["root"],
                    "args": {"marker": str(cli.workdir / "flaky.marker")},
                    "num_retries": 2,
                    "retry": {"backoff_s": 0.5},
                },
                {
                    "name": "join",
                    "call": "pg_tasks:noop",
                    "depends_on": [f"t{i}" for i in range(FAN)] + ["good", "bad", "flaky"],
                },
            ],
        },
    )


def completed(cli: DagqCli) -> int:
    try:
        return cli.view("big").counts.get("completed", 0)
    except Exception:  # not submitted yet
        return 0


def test_a_fan_out_survives_killing_the_coordinator_and_a_worker(cli: DagqCli) -> None:
    coordinator = cli.start_coordinator(timeout_s=60)
    worker_args = ("-q", "default", "-c", "8", "--visibility-timeout", "3")
    worker_args += ("--import-path", str(cli.workdir))
    workers = [cli.start_worker(*worker_args, timeout_s=60) for _ in range(2)]
    # The retried task has a worker of its own that is never killed: a worker killed after
    # a failed attempt but before its report went out has that attempt delivered again, and
    # the redelivery (the marker now written) succeeds as attempt 1, which is right but
    # would not show the retry.
    retry_args = ("-q", "retry", "-c", "1", "--import-path", str(cli.workdir))
    cli.start_worker(*retry_args, timeout_s=60)
    submitted = cli.run("submit", workflow(cli), "--id", "big", timeout_s=60)
    assert submitted.code == 0, submitted.output

    wait_until(lambda: completed(cli) >= FAN // 5, timeout_s=60, what="a fifth to complete")
    coordinator.kill()
    workers[0].kill()
    cli.start_coordinator(timeout_s=60)  # takes over the dead one's lease
    cli.start_worker(*worker_args, timeout_s=60)

    assert cli.wait_for_end("big", timeout_s=60 + FAN // 20) == "completed"
    statuses = cli.statuses("big")
    assert statuses["bad"] == "skipped" and statuses["good"] == "completed"
    assert sum(s == "completed" for s in statuses.values()) == FAN + 5
    tasks = {t["name"]: t for t in cli.json("tasks", "big", timeout_s=60)}
    assert tasks["flaky"]["attempt"] == 2
    events = cli.json("events", "big", timeout_s=60)
    done = Counter(e["task"] for e in events if e["kind"] == "completed")
    assert max(done.values()) == 1, "a task was completed twice in state"
