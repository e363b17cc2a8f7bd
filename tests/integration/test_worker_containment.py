"""A worker's faults, with real processes: a slow store never makes a finished task
run again (heartbeat and acknowledgement are ordered per message), and a background
task that keeps failing stops ``dagq worker`` with a clear error and exit code 1."""

from __future__ import annotations

import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.azurite import Azurite
from tests.conftest import azure_prefix
from tests.integration.cli_harness import DagqCli, lines, wait_until
from tests.integration.test_fault_injection import start_faulty

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[DagqCli]:
    with DagqCli(tmp_path) as cli:
        yield cli


@pytest.fixture
def azure_cli(tmp_path: Path, azurite: Azurite) -> Iterator[DagqCli]:
    with DagqCli(tmp_path) as cli:
        cli.store_url = f"azure://devstoreaccount1/{azure_prefix()}"
        yield cli


def queue_drained(cli: DagqCli) -> bool:
    depth = cli.with_store(lambda store: store.queues.depth("default"))
    return depth.visible + depth.invisible == 0


#: A chain of tasks, each ending at another moment of its message's renewal cycle.
CHAIN = {
    "name": "chain",
    "tasks": [
        {
            "name": f"t{i}",
            "cmd": f'echo "$DAGQ_TASK" >> runs.log; sleep {0.7 + 0.15 * i:.2f}',
            **({"depends_on": [f"t{i - 1}"]} if i else {}),
        }
        for i in range(8)
    ],
}


def each_task_ran_once_despite_slow_renewals(cli: DagqCli) -> None:
    cli.submit_here("w", CHAIN)
    cli.start_coordinator()
    # Heartbeats renew a held message every 2/3 s (a third of the visibility timeout);
    # the store renews at once, but its answer, with the new receipt, takes 0.5s to
    # come back (as on a distant Azure). A task that ends in that window must not be
    # acknowledged with the receipt the renewal has just replaced: the store would
    # ignore the delete, and the finished task would run again.
    start_faulty(
        cli,
        "queues.extend@1+=delay-after:0.5",
        "worker",
        "-q",
        "default",
        "-c",
        "1",
        "--visibility-timeout",
        "2",
    )

    assert cli.wait_for_end("w", timeout_s=60) == "completed"
    wait_until(lambda: queue_drained(cli), timeout_s=15, what="every task message deleted")
    assert Counter(lines(cli.workdir / "runs.log")) == {f"t{i}": 1 for i in range(8)}


def test_a_slow_store_never_makes_a_finished_task_run_again_on_sqlite(cli: DagqCli) -> None:
    each_task_ran_once_despite_slow_renewals(cli)


def test_a_slow_store_never_makes_a_finished_task_run_again_on_azure(azure_cli: DagqCli) -> None:
    each_task_ran_once_despite_slow_renewals(azure_cli)


def test_a_heartbeat_that_keeps_failing_stops_the_worker_with_exit_1(cli: DagqCli) -> None:
    cli.submit_here(
        "w", {"name": "w", "tasks": [{"name": "long", "cmd": "echo run >> runs.log; sleep 20"}]}
    )
    cli.start_coordinator()
    broken = start_faulty(
        cli,
        "queues.extend@1+=crash",
        "worker",
        "-q",
        "default",
        "--visibility-timeout",
        "1",
        "--grace",
        "0.2",
    )

    stopped = broken.wait(timeout_s=30)

    assert stopped.code == 1, stopped.stderr
    last = stopped.stderr.strip().splitlines()[-1]
    assert "worker stopped: worker: background task 'heartbeat' failed 4 times in a row" in last
    assert "RuntimeError: injected fault: queues.extend call 4 crashed" in last
    assert stopped.stderr.count("failed (restart") == 3  # restarted, with its traceback
    assert "Traceback" in stopped.stderr


def test_sigterm_ends_the_worker_within_its_grace_while_the_store_refuses_reports(
    cli: DagqCli,
) -> None:
    cli.submit_here(
        "w", {"name": "w", "tasks": [{"name": "quick", "cmd": 'echo "$DAGQ_TASK" >> runs.log'}]}
    )
    cli.start_coordinator()
    stuck = start_faulty(
        cli,
        "batch.commit@1+=fail",
        "worker",
        "-q",
        "default",
        "--grace",
        "1",
        "--visibility-timeout",
        "2",
    )
    wait_until(lambda: "retrying in" in stuck.stderr(), timeout_s=15, what="a report to be refused")

    sent = time.monotonic()
    stuck.send(signal.SIGTERM)
    stopped = stuck.wait(timeout_s=20)

    assert time.monotonic() - sent < 6, "the worker waited for the store past its grace"
    assert stopped.code == 0, stopped.stderr
    assert "will be delivered again" in stopped.stderr
    # Its report never went out, so its message was not deleted: another worker runs it.
    cli.start_worker("-q", "default")
    assert cli.wait_for_end("w", timeout_s=30) == "completed"
    assert lines(cli.workdir / "runs.log") == ["quick", "quick"]


def test_sigterm_ends_dagq_run_within_its_grace_while_the_store_refuses_writes(
    cli: DagqCli,
) -> None:
    workflow = cli.workflow("wf.yaml", {"name": "w", "tasks": [{"name": "a", "cmd": "sleep 1"}]})
    running = start_faulty(cli, "batch.commit@3+=fail", "run", workflow, "--quiet")
    wait_until(
        lambda: running.stderr().count("injected fault") >= 3,
        timeout_s=20,
        what="writes to be refused",
    )

    sent = time.monotonic()
    running.send(signal.SIGTERM)
    stopped = running.wait(timeout_s=30)

    assert stopped.code == 143, stopped.output
    assert time.monotonic() - sent < 15  # the run's grace is 5 s, then 2 s for reports
