"""The payload layer under ``dagq run``: what a task, a param or a signal may carry,
and what happens above the bounds — on real processes, as a user sees it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dagq import payloads
from tests.integration.cli_harness import DagqCli

pytestmark = pytest.mark.timeout(120)

TASKS_MODULE = """
def long_error(ctx):
    raise ValueError("start-" + "x" * 60000 + "-end")


def deep_output(ctx):
    value = 1
    for _ in range(5000):
        value = [value]
    return value


def echo(value):
    return len(value)
"""


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DagqCli]:
    with DagqCli(tmp_path_factory.mktemp("payloads")) as cli:
        cli.write("tasks_mod.py", TASKS_MODULE)
        yield cli


@pytest.fixture
def cli(shared: DagqCli) -> Iterator[DagqCli]:
    with shared.scope() as cli:
        yield cli


def test_a_60000_character_error_ends_the_run_shown_cut_and_kept_whole(cli: DagqCli) -> None:
    path = cli.workflow(
        "long-error.yaml",
        {
            "name": "long-error",
            "tasks": [
                {"name": "boom", "call": "tasks_mod:long_error"},
                {"name": "fine", "cmd": "echo fine"},
            ],
        },
    )

    result = cli.run("run", path, "--id", "long-error", timeout_s=60)

    assert result.code == 1, result.output
    assert "ValueError:" in result.stdout and "start-xxx" in result.stdout
    assert result.summary_rows()["fine"][0] == "completed"
    error = cli.json("status", "long-error")["failed"][0]["error"]
    assert len(error) <= payloads.ERROR_INLINE_CHARS
    assert error.startswith("ValueError: start-xxx") and "characters cut" in error
    assert "whole text: dagq logs long-error boom" in error
    logs = cli.run("logs", "long-error", "boom")
    assert logs.code == 0, logs.output
    assert "start-" + "x" * 60000 + "-end" in logs.stdout


@pytest.mark.parametrize(
    "task",
    [
        {"call": "tasks_mod:deep_output"},
        {
            "cmd": "python3 -c \"import os; open(os.environ['DAGQ_OUTPUT'], 'w')"
            ".write('[' * 5000 + ']' * 5000)\""
        },
    ],
    ids=["python-return-value", "shell-dagq-output"],
)
def test_an_output_nested_5000_deep_fails_its_attempt_with_a_clear_error(
    cli: DagqCli, task: dict[str, str]
) -> None:
    path = cli.workflow("deep.yaml", {"name": "deep", "tasks": [{"name": "deep", **task}]})

    result = cli.run("run", path, timeout_s=60)

    assert result.code == 1, result.output
    assert "output is nested more than 100 levels deep" in result.stdout
