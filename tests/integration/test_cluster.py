"""The must-show of issue 3: a coordinator and two workers as separate processes.

``dagq coordinator``, a ``dagq worker -q cpu`` and a ``dagq worker -q gpu`` share one
SQLite file; ``dagq submit`` sends them a workflow whose shell and Python tasks use
both queues, with a condition that skips a branch and a failure that is retried.
``dagq status --watch`` waits for it; ``status``, ``tasks`` and ``list`` (``--json``)
must report it exactly; SIGTERM then stops every process cleanly and the coordinator
gives its lease back.

The whole scenario runs once (a module fixture); each test checks one part of it.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.integration.cli_harness import DagqCli, Finished, lines

pytestmark = pytest.mark.timeout(60)

WORKFLOW_ID = "mixed-1"

#: Python tasks, imported by the gpu worker from the scratch directory. Each records
#: the PID of its worker: a Python task runs in a pool process, forked by the worker's
#: zygote ($PPID of a shell task is its worker).
TASKS = """
    import os
    from pathlib import Path

    from dagq import TaskContext


    def _worker() -> int:
        zygote = os.getppid()
        return int(Path(f"/proc/{zygote}/stat").read_text().rpartition(")")[2].split()[1])


    def _ran(name: str) -> None:
        with open("ran.log", "a") as log:
            log.write(f"{name} {_worker()}\\n")


    def score(rows: int) -> dict:
        _ran("score")
        return {"score": 0.25 * rows, "rows": rows}


    def flaky(ctx: TaskContext) -> int:
        _ran("flaky")
        if ctx.attempt == 1:
            raise RuntimeError("the first attempt always fails")
        return ctx.attempt
"""


def _shell(name: str, extra: str = "") -> str:
    return f'echo "{name} $PPID" >> ran.log{extra}'


MIXED: dict[str, Any] = {
    "name": "mixed",
    "tasks": [
        {
            "name": "prepare",
            "queue": "cpu",
            "cmd": _shell("prepare", """; echo '{"rows": 3}' > "$DAGQ_OUTPUT\""""),
        },
        {
            "name": "score",
            "queue": "gpu",
            "depends_on": ["prepare"],
            "call": "cluster_tasks:score",
            "args": {"rows": "{{ inputs.prepare.rows }}"},
        },
        {
            "name": "publish",
            "queue": "cpu",
            "depends_on": ["score"],
            "condition": "inputs.score.score > 0.5",
            "cmd": _shell("publish"),
        },
        {
            "name": "discard",
            "queue": "cpu",
            "depends_on": ["score"],
            "condition": "inputs.score.score <= 0.5",
            "cmd": _shell("discard"),
        },
        {
            "name": "flaky",
            "queue": "gpu",
            "depends_on": ["prepare"],
            "num_retries": 1,
            "retry": {"backoff_s": 0.05, "jitter": 0},
            "call": "cluster_tasks:flaky",
        },
        {
            "name": "report",
            "queue": "cpu",
            "depends_on": ["publish", "discard", "flaky"],
            "cmd": _shell("report"),
        },
    ],
}


@dataclass(frozen=True)
class Scenario:
    """Everything the cluster run left to check."""

    cli: DagqCli
    submitted: Any
    watch: Finished
    status: Any
    tasks: Any
    listing: Any
    cpu_pid: int
    gpu_pid: int
    exits: dict[str, Finished]
    lease_after_stop: Any
    doctor_after_stop: Any


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scenario]:
    with DagqCli(tmp_path_factory.mktemp("cluster")) as cli:
        cli.write("cluster_tasks.py", TASKS)
        wf = cli.workflow("mixed.yaml", MIXED)
        coordinator = cli.start_coordinator()
        cpu = cli.start_worker("-q", "cpu", "-c", "2")
        gpu = cli.start_worker("-q", "gpu", "-c", "2", "--import-path", cli.workdir)

        submitted = cli.json("submit", wf, "--id", WORKFLOW_ID)
        watch = cli.run("status", WORKFLOW_ID, "--watch", timeout_s=30)
        status = cli.json("status", WORKFLOW_ID)
        tasks = cli.json("tasks", WORKFLOW_ID)
        listing = cli.json("list")

        for process in (coordinator, cpu, gpu):
            process.send(signal.SIGTERM)
        exits = {
            "coordinator": coordinator.wait(10),
            "cpu worker": cpu.wait(10),
            "gpu worker": gpu.wait(10),
        }
        yield Scenario(
            cli=cli,
            submitted=submitted,
            watch=watch,
            status=status,
            tasks=tasks,
            listing=listing,
            cpu_pid=cpu.pid,
            gpu_pid=gpu.pid,
            exits=exits,
            lease_after_stop=cli.lease(),
            doctor_after_stop=cli.json("doctor"),
        )


def _tasks_by_name(scenario: Scenario) -> dict[str, Any]:
    return {task["name"]: task for task in scenario.tasks}


def test_submit_prints_the_id_it_was_given_and_that_it_created_it(scenario: Scenario) -> None:
    assert scenario.submitted == {"id": WORKFLOW_ID, "created": True}


def test_status_watch_waits_for_the_end_and_exits_0(scenario: Scenario) -> None:
    assert scenario.watch.code == 0, scenario.watch.output
    assert "completed" in scenario.watch.stdout
    assert "Traceback" not in scenario.watch.output


def test_status_json_reports_the_completed_workflow(scenario: Scenario) -> None:
    status = scenario.status

    assert status["id"] == WORKFLOW_ID
    assert status["name"] == "mixed"
    assert status["status"] == "completed"
    assert (status["total"], status["done"]) == (6, 6)
    assert status["counts"] == {"completed": 5, "skipped": 1}
    assert status["error"] is None
    assert status["failed"] == []
    assert status["created_at"] <= status["finished_at"] <= status["updated_at"]


def test_tasks_json_reports_each_task_state_attempt_and_queue(scenario: Scenario) -> None:
    got = {
        name: (task["status"], task["attempt"], task["queue"])
        for name, task in _tasks_by_name(scenario).items()
    }

    assert got == {
        "prepare": ("completed", 1, "cpu"),
        "score": ("completed", 1, "gpu"),
        "publish": ("completed", 1, "cpu"),
        "discard": ("skipped", 0, "cpu"),
        "flaky": ("completed", 2, "gpu"),
        "report": ("completed", 1, "cpu"),
    }


def test_tasks_json_gives_timings_of_tasks_that_ran_and_no_start_for_skipped(
    scenario: Scenario,
) -> None:
    tasks = _tasks_by_name(scenario)

    for name in ("prepare", "score", "publish", "flaky", "report"):
        task = tasks[name]
        assert task["started_at"] <= task["finished_at"], name
        assert task["duration_s"] == pytest.approx(task["finished_at"] - task["started_at"])
        assert task["error"] is None, name
    skipped = tasks["discard"]
    assert skipped["started_at"] is None
    assert skipped["duration_s"] is None
    assert skipped["finished_at"] >= tasks["score"]["finished_at"]  # when it was decided


def test_list_json_has_the_one_workflow_with_its_counts(scenario: Scenario) -> None:
    assert len(scenario.listing) == 1
    row = scenario.listing[0]
    assert (row["id"], row["name"], row["status"]) == (WORKFLOW_ID, "mixed", "completed")
    assert row["total"] == 6
    assert row["counts"] == {"completed": 5, "skipped": 1}
    assert row["error"] is None


def test_each_worker_ran_only_the_tasks_of_its_queue(scenario: Scenario) -> None:
    ran = [line.split() for line in lines(scenario.cli.workdir / "ran.log")]
    by_worker = {scenario.cpu_pid: "cpu", scenario.gpu_pid: "gpu"}

    assert sorted((name, by_worker.get(int(pid), pid)) for name, pid in ran) == [
        ("flaky", "gpu"),
        ("flaky", "gpu"),
        ("prepare", "cpu"),
        ("publish", "cpu"),
        ("report", "cpu"),
        ("score", "gpu"),
    ]


def test_sigterm_stops_coordinator_and_workers_with_exit_0(scenario: Scenario) -> None:
    for who, finished in scenario.exits.items():
        assert finished.code == 0, f"{who}:\n{finished.output}"
        assert "Traceback" not in finished.output, who


def test_stopped_coordinator_has_released_its_lease(scenario: Scenario) -> None:
    assert scenario.lease_after_stop is None
    assert "lease released" in scenario.exits["coordinator"].stderr
    coordinator = next(f for f in scenario.doctor_after_stop if f["check"] == "coordinator")
    assert coordinator["level"] == "ok"
    assert "none running" in coordinator["detail"]
