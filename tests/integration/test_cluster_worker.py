"""``dagq worker``: heartbeats, visibility timeouts, graceful stops, idling out.

One ``dagq coordinator`` serves the whole module; each test runs its own workers on
a queue of its own, so no worker of one test can take another test's task. Tasks
append to a side-effect log, which tells how often each one really started.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.cli_harness import DagqCli, lines, wait_for_file, wait_until

pytestmark = pytest.mark.timeout(30)

#: Starts, then sleeps for a long time on its first run only (a marker file remembers).
LONG_FIRST_TIME = (
    'echo "start $$" >> {log}; '
    "if [ ! -f {log}.marker ]; then touch {log}.marker; sleep 30; fi; "
    "echo end >> {log}"
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DagqCli]:
    with DagqCli(tmp_path_factory.mktemp("workers")) as cli:
        cli.start_coordinator()
        yield cli


@pytest.fixture
def cli(cluster: DagqCli) -> Iterator[DagqCli]:
    """The module's store and coordinator; workers a test starts die with the test."""
    with cluster.scope() as cli:
        yield cli


def submit(cli: DagqCli, workflow_id: str, tasks: list[dict[str, Any]]) -> None:
    cli.submit_here(workflow_id, {"name": workflow_id, "tasks": tasks})


def starts(cli: DagqCli, log: str) -> list[str]:
    return [line for line in lines(cli.workdir / log) if line.startswith("start")]


def attempt_of(cli: DagqCli, workflow_id: str, task: str) -> int:
    _, plan, st = cli.run_state(workflow_id)
    return st.attempt[plan.by_name[task]]


def kill_group_of_first_start(cli: DagqCli, log: str) -> None:
    """Kill a task process orphaned by a SIGKILLed worker (its own process group)."""
    for line in starts(cli, log)[:1]:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(int(line.split()[1]), signal.SIGKILL)


def test_sigterm_lets_the_running_task_finish_and_takes_no_new_work(cli: DagqCli) -> None:
    """A free slot during the grace period stays free, though new work is queued."""
    worker = cli.start_worker("-q", "grace", "-c", "2", "--grace", "20")
    until_told = wait_for_file("grace.go")
    submit(
        cli,
        "grace",
        [
            {
                "name": "long",
                "queue": "grace",
                "cmd": f"echo start >> grace.log; {until_told}; echo end >> grace.log",
            },
            {"name": "gate", "queue": "grace-gate", "cmd": "true"},
            {
                "name": "after",
                "queue": "grace",
                "depends_on": ["gate"],
                "cmd": "echo after >> grace.log",
            },
        ],
    )
    wait_until(lambda: starts(cli, "grace.log"), timeout_s=10, what="'long' to start")

    worker.send(signal.SIGTERM)
    cli.start_worker("-q", "grace-gate")  # opens the gate: 'after' is queued for 'grace'

    wait_until(
        lambda: cli.statuses("grace")["after"] != "pending",
        timeout_s=10,
        what="'after' to be sent",
    )
    queued_at = time.monotonic()

    def after_left_waiting() -> bool:
        depth = cli.with_store(lambda store: store.queues.depth("grace"))
        taken = cli.statuses("grace")["after"] != "ready" or depth.invisible != 1  # 1: 'long'
        assert not taken, "the stopping worker took new work"
        return depth.visible == 1 and time.monotonic() - queued_at >= 1.0  # > 2 polls

    wait_until(after_left_waiting, timeout_s=10, what="'after' to wait a while in the queue")
    assert worker.process.poll() is None, "the worker left before its task finished"
    (cli.workdir / "grace.go").touch()
    stopped = worker.wait(10)

    assert stopped.code == 0, stopped.output
    assert lines(cli.workdir / "grace.log") == ["start", "end"]
    wait_until(
        lambda: cli.statuses("grace")["long"] == "completed",
        timeout_s=10,
        what="the finished task's completion to be applied",
    )
    assert cli.statuses("grace")["after"] == "ready"


def test_sigterm_past_the_grace_releases_the_task_to_another_worker_at_once(
    cli: DagqCli,
) -> None:
    first = cli.start_worker(
        "-q", "release", "-c", "1", "--grace", "0.2", "--visibility-timeout", "60"
    )
    submit(
        cli,
        "release",
        [{"name": "long", "queue": "release", "cmd": LONG_FIRST_TIME.format(log="release.log")}],
    )
    wait_until(lambda: starts(cli, "release.log"), timeout_s=10, what="the task to start")
    cli.start_worker("-q", "release", "--visibility-timeout", "60")

    stopped = first.stop(signal.SIGTERM, timeout_s=10)
    # Well inside the 60 s visibility timeout: only a released message comes back so soon.
    status = cli.wait_for_end("release", timeout_s=10)

    assert stopped.code == 0, stopped.output
    assert status == "completed"
    assert len(starts(cli, "release.log")) == 2
    assert lines(cli.workdir / "release.log")[-1] == "end"
    assert attempt_of(cli, "release", "long") == 1  # the same attempt, delivered again


#: A Python task that blocks its thread for a long time on its first run only.
SLOW_PYTHON = """
    import pathlib
    import time


    def slow_first_time() -> str:
        marker = pathlib.Path("slowpy.marker")
        with open("slowpy.log", "a") as log:
            log.write("start\\n")
        if not marker.exists():
            marker.touch()
            time.sleep(30)
        return "done"
"""


def test_sigterm_past_the_grace_exits_at_once_though_a_python_task_still_runs(
    cli: DagqCli,
) -> None:
    """The task's pool process is killed at the end of the grace; the worker does not wait."""
    cli.write("slowpy.py", SLOW_PYTHON)
    first = cli.start_worker("-q", "slowpy", "-c", "1", "--grace", "0.2")
    submit(cli, "slowpy", [{"name": "slow", "queue": "slowpy", "call": "slowpy:slow_first_time"}])
    wait_until(lambda: lines(cli.workdir / "slowpy.log"), timeout_s=10, what="the task to start")
    cli.start_worker("-q", "slowpy")

    sent = time.monotonic()
    stopped = first.stop(signal.SIGTERM, timeout_s=20)
    exit_s = time.monotonic() - sent
    status = cli.wait_for_end("slowpy", timeout_s=10)

    assert stopped.code == 0, stopped.output
    assert exit_s < 5, f"the worker took {exit_s:.1f}s to exit"
    assert status == "completed"
    assert lines(cli.workdir / "slowpy.log") == ["start", "start"]


def test_sigkilled_workers_task_returns_after_the_visibility_timeout(cli: DagqCli) -> None:
    doomed = cli.start_worker("-q", "kill", "-c", "1", "--visibility-timeout", "1")
    submit(
        cli,
        "kill",
        [{"name": "long", "queue": "kill", "cmd": LONG_FIRST_TIME.format(log="kill.log")}],
    )
    try:
        wait_until(lambda: starts(cli, "kill.log"), timeout_s=10, what="the task to start")
        cli.start_worker("-q", "kill", "--visibility-timeout", "1")
        doomed.stop(signal.SIGKILL)
        killed_at = time.monotonic()

        status = cli.wait_for_end("kill", timeout_s=10)

        assert status == "completed"
        assert len(starts(cli, "kill.log")) == 2
        assert time.monotonic() - killed_at < 10
        assert attempt_of(cli, "kill", "long") == 1
    finally:
        kill_group_of_first_start(cli, "kill.log")


def test_heartbeats_keep_a_task_longer_than_the_visibility_timeout_from_redelivery(
    cli: DagqCli,
) -> None:
    for _ in range(2):
        cli.start_worker("-q", "beat", "-c", "1", "--visibility-timeout", "1")
    step = "echo start >> beat.log; sleep 2; echo end >> beat.log"

    submit(cli, "beat", [{"name": "long", "queue": "beat", "cmd": step}])
    status = cli.wait_for_end("beat", timeout_s=15)

    assert status == "completed"
    assert lines(cli.workdir / "beat.log") == ["start", "end"]


def test_idle_timeout_exits_0_after_idling(cli: DagqCli) -> None:
    began = time.monotonic()

    result = cli.run("worker", "-q", "idle", "--idle-timeout", "0.5", timeout_s=15)

    assert result.code == 0, result.output
    assert time.monotonic() - began >= 0.5
    assert "idle for" in result.stderr
    assert "Traceback" not in result.output


def test_a_negative_backlog_is_refused_naming_the_option(cli: DagqCli) -> None:
    result = cli.run("worker", "-q", "idle", "--backlog", "-1", timeout_s=15)

    assert result.code == 2, result.output
    assert "--backlog" in result.stderr
    assert "Traceback" not in result.output


def test_a_worker_with_no_backlog_runs_a_workflow_to_the_end(cli: DagqCli) -> None:
    submit(cli, "nobacklog", [{"name": f"t{i}", "queue": "nb", "cmd": "true"} for i in range(6)])
    cli.start_worker("-q", "nb", "-c", "2", "--backlog", "0")

    assert cli.wait_for_end("nobacklog", timeout_s=20) == "completed"
