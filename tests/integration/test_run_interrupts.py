"""Stopping a run and its tasks: Ctrl-C, a second Ctrl-C, SIGTERM, per-attempt timeouts.

Ctrl-C cancels the workflow cleanly; SIGTERM stops the process but leaves the
workflow resumable; a timeout kills one task's process group only. Tasks write the
PIDs of their shell and of a child they spawn to files, so the tests can check that
exactly those processes are gone.
"""

from __future__ import annotations

import resource
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration.cli_harness import (
    DagqCli,
    Finished,
    lines,
    pid_alive,
    read_pids,
    wait_until,
)

#: The shell records its PID and that of a child it waits for.
SPAWNS_A_CHILD = "echo $$ >> {tag}.shell.pids; sleep {seconds} & echo $! >> {tag}.child.pids; wait"


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[DagqCli]:
    with DagqCli(tmp_path) as cli:
        yield cli


def _pids(cli: DagqCli, tag: str) -> list[int]:
    return read_pids(cli.workdir / f"{tag}.shell.pids") + read_pids(
        cli.workdir / f"{tag}.child.pids"
    )


def _all_gone(pids: list[int]) -> bool:
    return not any(pid_alive(pid) for pid in pids)


# --- Ctrl-C -------------------------------------------------------------------------


def sleepy(cli: DagqCli) -> Path:
    return cli.workflow(
        "sleepy.yaml",
        {
            "name": "sleepy",
            "tasks": [
                {"name": "first", "cmd": "true"},
                {
                    "name": "nap",
                    "depends_on": ["first"],
                    "cmd": SPAWNS_A_CHILD.format(tag="nap", seconds=60),
                },
                {"name": "after", "depends_on": ["nap"], "cmd": "touch after.ran"},
            ],
        },
    )


@dataclass(frozen=True)
class Interrupted:
    """A run stopped by Ctrl-C while 'nap' slept: its result and what it left behind."""

    cli: DagqCli
    result: Finished
    nap_pids: list[int]
    exit_s: float


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Interrupted]:
    with DagqCli(tmp_path_factory.mktemp("ctrl-c")) as cli:
        running = cli.start("run", sleepy(cli), "--id", "sleepy")
        wait_until(
            lambda: read_pids(cli.workdir / "nap.child.pids"), timeout_s=15, what="the nap to start"
        )
        pids = _pids(cli, "nap")
        assert len(pids) == 2
        assert not _all_gone(pids)
        sent = time.monotonic()
        running.send(signal.SIGINT)
        result = running.wait(timeout_s=10)
        yield Interrupted(cli, result, pids, time.monotonic() - sent)


@pytest.mark.timeout(30)
def test_ctrl_c_cancels_the_run_and_exits_1_within_seconds(interrupted: Interrupted) -> None:
    result = interrupted.result

    assert result.code == 1, result.output
    assert interrupted.exit_s < 5, f"exiting after Ctrl-C took {interrupted.exit_s:.1f}s"
    assert "cancelled by Ctrl-C" in result.stdout
    assert "workflow cancelled" in result.verdict()
    assert "Traceback" not in result.output


@pytest.mark.timeout(30)
def test_ctrl_c_kills_the_running_task_and_its_child(interrupted: Interrupted) -> None:
    pids = interrupted.nap_pids

    wait_until(lambda: _all_gone(pids), timeout_s=5, what=f"processes {pids} to be gone")


@pytest.mark.timeout(30)
def test_ctrl_c_leaves_the_workflow_cancelled_in_the_store(interrupted: Interrupted) -> None:
    cli = interrupted.cli

    view = cli.view("sleepy")
    assert view.status == "cancelled"
    assert view.error is not None
    assert "Ctrl-C" in view.error
    statuses = {row.name: row.status for row in view.tasks}
    assert statuses == {"first": "completed", "nap": "cancelled", "after": "cancelled"}
    assert not (cli.workdir / "after.ran").exists()


@pytest.mark.timeout(30)
def test_second_ctrl_c_quits_at_once_with_130_without_a_traceback(cli: DagqCli) -> None:
    running = cli.start("run", sleepy(cli), "--id", "sleepy")
    wait_until(
        lambda: read_pids(cli.workdir / "nap.child.pids"), timeout_s=15, what="the nap to start"
    )
    pids = _pids(cli, "nap")
    running.send(signal.SIGINT)
    wait_until(
        lambda: "cancelling" in running.stdout_file.read_text(encoding="utf-8"),
        timeout_s=5,
        what="the first Ctrl-C to be acknowledged",
    )

    sent = time.monotonic()
    running.send(signal.SIGINT)
    result = running.wait(timeout_s=10)

    assert result.code == 130, result.output
    assert time.monotonic() - sent < 5
    assert "Traceback" not in result.output
    assert "never retrieved" not in result.output
    assert "workflow sleepy is safe on disk: resume it with: dagq run" in result.stdout
    assert "--id sleepy" in result.stdout
    wait_until(lambda: _all_gone(pids), timeout_s=5, what=f"processes {pids} to be gone")


def interruptible(cli: DagqCli) -> Path:
    """'first' runs once; 'nap' sleeps until the file 'resume' exists, then succeeds."""
    nap = "test -f resume && exit 0; " + SPAWNS_A_CHILD.format(tag="nap", seconds=60)
    return cli.workflow(
        "again.yaml",
        {
            "name": "again",
            "tasks": [
                {"name": "first", "cmd": "echo ran >> first.runs"},
                {"name": "nap", "depends_on": ["first"], "cmd": nap},
                {"name": "after", "depends_on": ["nap"], "cmd": "touch after.ran"},
            ],
        },
    )


@pytest.mark.timeout(60)
@pytest.mark.parametrize("presses", [1, 2])
def test_a_run_interrupted_by_ctrl_c_resumes_with_the_same_id(cli: DagqCli, presses: int) -> None:
    wf = interruptible(cli)
    running = cli.start("run", wf, "--id", "again")
    wait_until(
        lambda: read_pids(cli.workdir / "nap.child.pids"), timeout_s=15, what="the nap to start"
    )
    running.send(signal.SIGINT)
    if presses == 2:
        wait_until(
            lambda: "cancelling" in running.stdout_file.read_text(encoding="utf-8"),
            timeout_s=5,
            what="the first Ctrl-C to be acknowledged",
        )
        running.send(signal.SIGINT)
    stopped = running.wait(timeout_s=10)
    assert "resume it with: dagq run" in stopped.stdout, stopped.output
    (cli.workdir / "resume").touch()

    resumed = cli.run("run", wf, "--id", "again", timeout_s=40)

    assert resumed.code == 0, resumed.output
    assert "resuming workflow again (interrupted by Ctrl-C)" in resumed.stdout
    assert "workflow completed" in resumed.verdict()
    assert (cli.workdir / "after.ran").exists()
    assert lines(cli.workdir / "first.runs") == ["ran"]  # completed tasks are kept


@pytest.mark.timeout(60)
def test_ctrl_c_during_a_saga_runs_the_undo_of_the_completed_task(cli: DagqCli) -> None:
    wf = cli.workflow(
        "saga.yaml",
        {
            "name": "saga",
            "tasks": [
                {"name": "charge", "cmd": "true", "compensate": {"cmd": "touch refunded"}},
                {
                    "name": "ship",
                    "depends_on": ["charge"],
                    "cmd": SPAWNS_A_CHILD.format(tag="ship", seconds=60),
                },
            ],
        },
    )
    running = cli.start("run", wf, "--id", "saga")
    wait_until(
        lambda: read_pids(cli.workdir / "ship.child.pids"), timeout_s=15, what="ship to start"
    )

    running.send(signal.SIGINT)
    result = running.wait(timeout_s=20)

    assert result.code == 1, result.output
    assert "workflow cancelled" in result.verdict()
    assert (cli.workdir / "refunded").exists(), "the undo of 'charge' never ran"
    kinds = [e["kind"] for e in cli.json("events", "saga")]
    assert "compensated" in kinds and "compensation_failed" not in kinds
    assert cli.view("saga").status == "cancelled"


# --- SIGTERM (docker stop, systemd, timeout) ----------------------------------------


def stoppable(cli: DagqCli) -> Path:
    """'nap' sleeps until the file 'resume' exists; then it succeeds at once."""
    nap = "test -f resume && exit 0; " + SPAWNS_A_CHILD.format(tag="nap", seconds=60)
    return cli.workflow(
        "term.yaml",
        {
            "name": "term",
            "tasks": [
                {"name": "nap", "cmd": nap},
                {"name": "after", "depends_on": ["nap"], "cmd": "true"},
            ],
        },
    )


@dataclass(frozen=True)
class Terminated:
    """A run stopped by SIGTERM while 'nap' slept, then resumed with the same id."""

    cli: DagqCli
    stopped: Finished
    nap_pids: list[int]
    status_after_stop: str
    resumed: Finished
    resume_s: float


@pytest.fixture(scope="module")
def terminated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Terminated]:
    with DagqCli(tmp_path_factory.mktemp("sigterm")) as cli:
        wf = stoppable(cli)
        running = cli.start("run", wf, "--id", "term")
        wait_until(
            lambda: read_pids(cli.workdir / "nap.child.pids"), timeout_s=15, what="the nap to start"
        )
        pids = _pids(cli, "nap")
        running.send(signal.SIGTERM)
        stopped = running.wait(timeout_s=20)
        wait_until(lambda: _all_gone(pids), timeout_s=5, what=f"processes {pids} to be gone")
        status = cli.view("term").status
        (cli.workdir / "resume").touch()
        started = time.monotonic()
        resumed = cli.run("run", wf, "--id", "term", timeout_s=40)
        yield Terminated(cli, stopped, pids, status, resumed, time.monotonic() - started)


@pytest.mark.timeout(60)
def test_sigterm_stops_the_run_with_143_and_kills_its_running_tasks(
    terminated: Terminated,
) -> None:
    stopped = terminated.stopped

    assert stopped.code == 128 + signal.SIGTERM, stopped.output
    assert "Traceback" not in stopped.output
    assert "--id term" in stopped.stdout
    assert _all_gone(terminated.nap_pids)


@pytest.mark.timeout(60)
def test_sigterm_leaves_the_workflow_unfinished_not_cancelled(terminated: Terminated) -> None:
    assert terminated.status_after_stop == "running"


@pytest.mark.timeout(60)
def test_run_stopped_by_sigterm_resumes_at_once_with_the_same_id(terminated: Terminated) -> None:
    resumed = terminated.resumed

    assert resumed.code == 0, resumed.output
    assert "resuming workflow term" in resumed.stdout
    assert terminated.cli.statuses("term") == {"nap": "completed", "after": "completed"}
    # The stopped run handed its task back: no wait for a visibility timeout to expire.
    assert terminated.resume_s < 10, f"resuming took {terminated.resume_s:.1f}s"


# --- per-attempt timeouts -----------------------------------------------------------


def timing_out(cli: DagqCli, *, num_retries: int) -> Path:
    return cli.workflow(
        "timeout.yaml",
        {
            "name": "timeout",
            "tasks": [
                {
                    "name": "slow",
                    "timeout_s": 1,
                    "num_retries": num_retries,
                    "retry": {"backoff_s": 0.05, "jitter": 0},
                    "cmd": SPAWNS_A_CHILD.format(tag="slow", seconds=60),
                },
                # Runs while 'slow' is killed: a timeout kills that task's group only.
                {"name": "sibling", "cmd": "sleep 1.5; touch sibling.done"},
            ],
        },
    )


@pytest.fixture(scope="module")
def timed_out(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DagqCli, Finished]]:
    """One run whose 'slow' task times out on its only attempt."""
    with DagqCli(tmp_path_factory.mktemp("timeout")) as cli:
        yield cli, cli.run("run", timing_out(cli, num_retries=0), "--id", "to", timeout_s=20)


@pytest.mark.timeout(30)
def test_timeout_kills_the_task_process_group_including_its_child(
    timed_out: tuple[DagqCli, Finished],
) -> None:
    cli, result = timed_out

    assert result.code == 1, result.output
    pids = _pids(cli, "slow")
    assert len(pids) == 2
    wait_until(lambda: _all_gone(pids), timeout_s=5, what=f"processes {pids} to be gone")
    row = result.summary_rows()["slow"]
    assert row[:2] == ["failed", "1"]
    assert "timed out after 1s" in row[3]


@pytest.mark.timeout(30)
def test_timeout_leaves_other_tasks_processes_alone(timed_out: tuple[DagqCli, Finished]) -> None:
    cli, _ = timed_out

    assert cli.statuses("to")["sibling"] == "completed"
    assert (cli.workdir / "sibling.done").exists()


@pytest.mark.timeout(30)
def test_timed_out_attempt_is_retried_when_retries_are_left(cli: DagqCli) -> None:
    result = cli.run("run", timing_out(cli, num_retries=1), "--id", "to", timeout_s=20)

    assert result.code == 1, result.output
    shells = read_pids(cli.workdir / "slow.shell.pids")
    assert len(shells) == 2, "two attempts, each timed out"
    assert len(read_pids(cli.workdir / "slow.child.pids")) == 2
    pids = _pids(cli, "slow")
    wait_until(lambda: _all_gone(pids), timeout_s=5, what=f"processes {pids} to be gone")
    row = result.summary_rows()["slow"]
    assert row[:2] == ["failed", "2"]
    assert "timed out" in row[3]


# --- waiting costs nothing -----------------------------------------------------------


@pytest.mark.timeout(30)
def test_run_waiting_on_a_long_task_does_not_spin_the_cpu(cli: DagqCli) -> None:
    def cpu_of_run(run_id: str, sleep: str) -> float:
        wf = cli.workflow(
            f"{run_id}.yaml",
            {
                "name": "wait",
                "tasks": [
                    {"name": "quick", "cmd": "true"},
                    {"name": "long", "depends_on": ["quick"], "cmd": f"sleep {sleep}"},
                ],
            },
        )
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        result = cli.run("run", wf, "--id", run_id)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        assert result.code == 0, result.output
        return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)

    # The same run without the wait is the baseline (start-up and the quick task, whatever the
    # machine's load makes them cost); the 3 s wait must add next to nothing to it, where a
    # loop polling without sleeping would add about 3 s.
    baseline = cpu_of_run("nowait", "0")
    waiting = cpu_of_run("wait", "3")
    extra = waiting - baseline
    assert extra < 0.6, f"waiting 3 s cost {extra:.2f}s of CPU ({waiting:.2f}s vs {baseline:.2f}s)"
