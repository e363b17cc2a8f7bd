"""``dagq retry ID --run``: a run started with ``dagq run`` is retried without a cluster."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.cli_harness import DagqCli, lines
from tests.integration.test_run_bad_input import assert_one_clear_line

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[DagqCli]:
    with DagqCli(tmp_path) as cli:
        cli.workflow(
            "flaky.yaml",
            {
                "name": "flaky",
                "tasks": [
                    {"name": "first", "cmd": "echo ran >> first.runs"},
                    {"name": "upload", "depends_on": ["first"], "cmd": "test -f fixed"},
                    {"name": "report", "depends_on": ["upload"], "cmd": "touch report.done"},
                ],
            },
        )
        failed = cli.run("run", "flaky.yaml", "--id", "f", "--quiet")
        assert failed.code == 1, failed.output
        yield cli


def test_retry_without_a_coordinator_says_how_to_run_it_here(cli: DagqCli) -> None:
    result = cli.run("retry", "f")

    assert result.code == 0, result.output
    assert "dagq retry f --run" in result.stderr


@pytest.mark.parametrize("asked_first", [False, True], ids=["run-only", "after-plain-retry"])
def test_retry_run_drives_the_retried_run_here_to_its_end(cli: DagqCli, asked_first: bool) -> None:
    (cli.workdir / "fixed").touch()
    if asked_first:  # a plain retry left its request waiting for a coordinator
        assert cli.run("retry", "f").code == 0

    result = cli.run("retry", "f", "--run")

    assert result.code == 0, result.output
    assert "retrying workflow f here" in result.stdout
    assert "workflow completed" in result.verdict()
    assert (cli.workdir / "report.done").exists()
    assert lines(cli.workdir / "first.runs") == ["ran"]  # completed tasks are kept
    assert cli.view("f").status == "completed"


def test_retry_run_of_a_run_that_failed_again_exits_1(cli: DagqCli) -> None:
    result = cli.run("retry", "f", "--run")

    assert result.code == 1, result.output
    assert "workflow failed" in result.verdict()


def test_retry_run_quiet_prints_only_the_result_and_the_failed_task(cli: DagqCli) -> None:
    result = cli.run("retry", "f", "--run", "--quiet")

    assert result.code == 1, result.output
    first, failed = result.stdout.splitlines()
    assert re.fullmatch(r"failed: f \(3 tasks in \S+\): task 'upload' failed: exit code 1", first)
    assert failed == "failed tasks: upload (errors: dagq tasks f --state failed)"


def test_retry_run_with_nothing_to_retry_is_one_clear_line(cli: DagqCli) -> None:
    (cli.workdir / "fixed").touch()
    assert cli.run("retry", "f", "--run", "--quiet").code == 0

    again = cli.run("retry", "f", "--run")

    assert_one_clear_line(again, "nothing to retry in f")


def test_retry_run_piped_never_wraps_a_line(cli: DagqCli) -> None:
    del cli.env["COLUMNS"]  # as in a plain shell: rich would assume 80 columns

    result = cli.run("retry", "f", "--run")

    [verdict] = [line for line in result.stdout.splitlines() if "workflow failed" in line]
    assert len(verdict) > 80
    assert verdict.endswith("task 'upload' failed: exit code 1"), result.stdout
