"""Bad input to the commands of issue 3: one clear line on stderr, exit code 2.

Unknown workflows and tasks, ids that are not valid names, stores that cannot be
reached or are not supported, unknown filter values and queue names: each gets one
line saying what is wrong, never a traceback, and nothing on stdout.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.integration.cli_harness import DagqCli, Finished

# The first test pays for the shared fixture: ~50 dagq processes started side by side.
pytestmark = pytest.mark.timeout(120)

LONG_ID = "a" * 200


@dataclass(frozen=True)
class Case:
    """A command line and what its one-line error must mention."""

    args: tuple[str, ...]
    mentions: tuple[str, ...]


def case(*args: str, mentions: tuple[str, ...]) -> Case:
    return Case(args, mentions)


UNREACHABLE = "sqlite:////dev/null/dagq.db"  # a file cannot hold a directory

CASES = {
    # unknown workflows
    "status-unknown-id": case("status", "ghost", mentions=("no workflow 'ghost'",)),
    "tasks-unknown-id": case("tasks", "ghost", mentions=("no workflow 'ghost'",)),
    "output-unknown-id": case("output", "ghost", "a", mentions=("no workflow 'ghost'",)),
    "logs-unknown-id": case("logs", "ghost", "a", mentions=("no workflow 'ghost'",)),
    "events-unknown-id": case("events", "ghost", mentions=("no workflow 'ghost'",)),
    "cancel-unknown-id": case("cancel", "ghost", mentions=("no workflow 'ghost'",)),
    "retry-unknown-id": case("retry", "ghost", mentions=("no workflow 'ghost'",)),
    "graph-unknown-id": case("graph", "ghost", mentions=("no workflow 'ghost'",)),
    "purge-unknown-id": case("purge", "ghost", mentions=("no workflow 'ghost'",)),
    # unknown tasks and attempts
    "output-unknown-task": case("output", "known", "nope", mentions=("no task named 'nope'",)),
    "logs-unknown-task": case("logs", "known", "nope", mentions=("no task named 'nope'",)),
    "retry-unknown-task": case(
        "retry", "failed", "--task", "nope", mentions=("no task named 'nope'",)
    ),
    "logs-unknown-attempt": case("logs", "known", "a", "--attempt", "9", mentions=("attempt 9",)),
    "logs-of-a-task-that-never-ran": case("logs", "idle", "a", mentions=("never run", "pending")),
    "output-of-a-failed-task": case("output", "failed", "a", mentions=("'a'", "failed")),
    "retry-of-an-unfinished-workflow": case("retry", "idle", mentions=("still pending",)),
    "retry-with-nothing-to-retry": case("retry", "known", mentions=("nothing to retry",)),
    # invalid ids
    "status-dotdot-id": case("status", "../x", mentions=("'../x' is not valid",)),
    "status-empty-id": case("status", "", mentions=("'' is not valid",)),
    "status-long-id": case("status", LONG_ID, mentions=("is not valid", "1-128")),
    "submit-dotdot-id": case("submit", "wf.yaml", "--id", "../x", mentions=("'../x'",)),
    "purge-dotdot-id": case("purge", "../x", mentions=("'../x' is not valid",)),
    # stores
    "status-unsupported-store": case(
        "status", "x", "--store", "redis://host/0", mentions=("redis://host/0", "not supported")
    ),
    "list-bad-azure-store": case(
        "list", "--store", "azure://acct/x", mentions=("azure://acct/x", "prefix 'x'")
    ),
    "status-unreachable-store": case(
        "status", "x", "--store", UNREACHABLE, mentions=("no dagq store at /dev/null/dagq.db",)
    ),
    "list-mistyped-store": case(
        "list", "--store", "sqlite:////tmp/no/such/dagq.db", mentions=("no dagq store at",)
    ),
    "coordinator-unreachable-store": case(
        "coordinator", "--store", UNREACHABLE, mentions=("cannot open",)
    ),
    "worker-unreachable-store": case("worker", "--store", UNREACHABLE, mentions=("cannot open",)),
    "worker-unsupported-store": case("worker", "--store", "ftp://x", mentions=("not supported",)),
    # filters and queues
    "tasks-unknown-state": case(
        "tasks", "known", "--state", "bogus", mentions=("unknown task state 'bogus'", "running")
    ),
    "list-unknown-status": case(
        "list", "--status", "bogus", mentions=("unknown workflow status 'bogus'", "running")
    ),
    "worker-invalid-queue": case(
        "worker", "-q", "bad queue!", mentions=("'bad queue!'", "not a valid queue name")
    ),
    "worker-empty-queue": case("worker", "-q", "", mentions=("not a valid queue name",)),
    "submit-missing-file": case("submit", "nowhere.yaml", mentions=("nowhere.yaml",)),
    # options that mean nothing alone
    "status-interval-without-watch": case(
        "status", "known", "--interval", "5", mentions=("--interval needs --watch",)
    ),
}


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DagqCli]:
    """A store holding a completed ('known'), a failed and a pending ('idle') workflow."""
    with DagqCli(tmp_path_factory.mktemp("errors")) as cli:
        assert cli.run_here("known", [{"name": "a", "cmd": "echo hi"}]) == "completed"
        assert cli.run_here("failed", [{"name": "a", "cmd": "exit 1"}]) == "failed"
        cli.workflow("wf.yaml", {"name": "w", "tasks": [{"name": "a", "cmd": "true"}]})
        cli.submit_here("idle", {"name": "w", "tasks": [{"name": "a", "cmd": "true"}]})
        yield cli


@pytest.fixture(scope="module")
def outcomes(cli: DagqCli) -> dict[str, Finished]:
    """Every bad command line, run side by side (each is independent of the others)."""
    return cli.run_many({key: list(bad.args) for key, bad in CASES.items()})


@pytest.mark.parametrize("key", CASES)
def test_bad_input_gets_one_error_line_and_exit_code_2(
    outcomes: dict[str, Finished], key: str
) -> None:
    result = outcomes[key]

    assert result.code == 2, result.output
    assert "Traceback" not in result.output
    assert result.stdout == ""
    error_lines = result.stderr.strip().splitlines()
    assert len(error_lines) == 1, result.stderr
    assert error_lines[0].startswith("error: ")
    for mention in CASES[key].mentions:
        assert mention in error_lines[0]
