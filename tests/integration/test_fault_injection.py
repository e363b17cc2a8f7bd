"""Crash safety with real processes: a coordinator or worker SIGKILLed at a chosen
storage call (``DAGQ_FAULTS``), then replaced.

The workflow is a diamond of shell tasks. Each run of a task appends to ``runs.log``;
its side effect, guarded by the task's idempotency key, appends to ``effects.log``.
After each crash and restart: the workflow completes, every task's effect happened
exactly once, and no task whose completion was recorded ran again. Every test runs on
sqlite and on PostgreSQL (a batch is one transaction on both).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from dagq.stores.faults import FAULTS_ENV
from tests.conftest import postgres_url
from tests.integration.cli_harness import DagqCli, Started, lines

pytestmark = pytest.mark.timeout(60)

EFFECT = (
    'echo "$DAGQ_TASK" >> runs.log; '
    'k=effect-$(printf %s "$DAGQ_IDEMPOTENCY_KEY" | tr -c A-Za-z0-9 _); '
    'if [ ! -e "$k" ]; then touch "$k" && echo "$DAGQ_TASK" >> effects.log; fi'
)
DIAMOND = {
    "name": "diamond",
    "tasks": [
        {"name": "a", "cmd": EFFECT},
        {"name": "b", "cmd": EFFECT, "depends_on": ["a"]},
        {"name": "c", "cmd": EFFECT, "depends_on": ["a"]},
        {"name": "d", "cmd": EFFECT, "depends_on": ["b", "c"]},
    ],
}


@pytest.fixture(params=["sqlite", "postgres"])
def cli(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[DagqCli]:
    """The command in a scratch directory, on a sqlite file or a PostgreSQL schema."""
    with DagqCli(tmp_path) as cli:
        if request.param == "postgres":
            cli.store_url = postgres_url(request.getfixturevalue("postgres_cluster"))
        yield cli


def start_faulty(cli: DagqCli, faults: str, *args: str) -> Started:
    cli.env[FAULTS_ENV] = faults
    try:
        return cli.start(*args)
    finally:
        del cli.env[FAULTS_ENV]


def killed(started: Started) -> None:
    finished = started.wait(timeout_s=30)
    assert finished.code == -9, f"expected a SIGKILL, got {finished.code}:\n{finished.stderr}"
    assert "injected fault" in finished.stderr


def effects_once(cli: DagqCli) -> Counter[str]:
    """Each task's guarded effect happened once; how often each task ran."""
    assert sorted(lines(cli.workdir / "effects.log")) == ["a", "b", "c", "d"]
    return Counter(lines(cli.workdir / "runs.log"))


@pytest.mark.parametrize("action", ["kill", "kill-after"])
@pytest.mark.parametrize("call", [1, 2, 3, 4])
def test_a_coordinator_killed_at_any_commit_is_replaced_and_nothing_runs_twice(
    cli: DagqCli, call: int, action: str
) -> None:
    cli.submit_here("w", DIAMOND)
    cli.start_worker("-q", "default", "--visibility-timeout", "2")
    killed(start_faulty(cli, f"batch.commit@{call}={action}", "coordinator"))

    cli.start_coordinator()

    assert cli.wait_for_end("w", timeout_s=30) == "completed"
    assert effects_once(cli) == {"a": 1, "b": 1, "c": 1, "d": 1}


@pytest.mark.parametrize("action", ["kill", "kill-after"])
@pytest.mark.parametrize("call", [1, 2, 3])
def test_a_worker_killed_at_any_report_is_replaced_and_effects_happen_once(
    cli: DagqCli, call: int, action: str
) -> None:
    cli.submit_here("w", DIAMOND)
    cli.start_coordinator()
    doomed = start_faulty(
        cli, f"batch.commit@{call}={action}", "worker", "-q", "default", "--visibility-timeout", "1"
    )
    killed(doomed)

    cli.start_worker("-q", "default", "--visibility-timeout", "1")

    assert cli.wait_for_end("w", timeout_s=30) == "completed"
    runs = effects_once(cli)
    # A task runs again only if its worker died before its completion was durable
    # (the tasks in flight then): once more at most; the effects stay single.
    assert set(runs) == {"a", "b", "c", "d"} and max(runs.values()) <= 2


def test_a_store_outage_is_waited_out_and_nothing_is_lost_or_run_twice(cli: DagqCli) -> None:
    cli.submit_here("w", DIAMOND)
    # Receives fail for a while on both sides; a worker report fails once and
    # another hangs for two seconds before the store answers.
    coordinator = start_faulty(cli, "queues.receive@3-6=fail", "coordinator")
    worker = start_faulty(
        cli,
        "queues.receive@2-6=fail,batch.commit@1=fail,batch.commit@3=delay:2",
        "worker",
        "-q",
        "default",
        "--visibility-timeout",
        "30",
    )

    assert cli.wait_for_end("w", timeout_s=50) == "completed"
    assert effects_once(cli) == {"a": 1, "b": 1, "c": 1, "d": 1}
    for process in (coordinator, worker):
        assert process.process.poll() is None  # still serving: no one had to restart it
        assert "retrying in" in process.stderr()


# --- submit -----------------------------------------------------------------------------


def submit_file(cli: DagqCli) -> Path:
    return cli.workflow("diamond.yaml", DIAMOND)


@pytest.mark.parametrize(
    "fault",
    ["index.upsert@1=kill-after", "documents.put@1=kill-after", "documents.put@2=kill"],
    ids=["after-index-row", "after-definition", "before-state"],
)
def test_a_submit_killed_before_its_state_is_written_completes_when_repeated(
    cli: DagqCli, fault: str
) -> None:
    crashed = cli.run("submit", submit_file(cli), "--id", "w", env={FAULTS_ENV: fault})
    assert crashed.code == -9

    again = cli.run("submit", submit_file(cli), "--id", "w")

    assert again.code == 0, again.output
    cli.start_coordinator()
    cli.start_worker("-q", "default")
    assert cli.wait_for_end("w", timeout_s=30) == "completed"
    assert effects_once(cli) == {"a": 1, "b": 1, "c": 1, "d": 1}


@pytest.mark.parametrize(
    "fault",
    ["documents.put@2=kill-after", "queues.send@1=kill"],
    ids=["after-state", "before-wake-up-event"],
)
def test_a_submit_killed_after_its_state_is_written_runs_without_repeating_it(
    cli: DagqCli, fault: str
) -> None:
    crashed = cli.run("submit", submit_file(cli), "--id", "w", env={FAULTS_ENV: fault})
    assert crashed.code == -9

    cli.start_coordinator()  # finds it in the index at start-up
    cli.start_worker("-q", "default")

    assert cli.wait_for_end("w", timeout_s=30) == "completed"
    assert effects_once(cli) == {"a": 1, "b": 1, "c": 1, "d": 1}
