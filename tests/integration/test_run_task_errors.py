"""How task failures steer retries under ``dagq run``: import errors, NonRetryable, RetryAfter.

Each attempt of a Python task appends a line to ``<task>.attempts``, so the tests
count attempts from side effects as well as from the summary.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.cli_harness import DagqCli, lines

pytestmark = pytest.mark.timeout(60)

TASKS_MODULE = """
import time
from pathlib import Path

import dagq


def _count(ctx):
    with open(f"{ctx.task}.attempts", "a") as f:
        f.write(f"{time.time()}\\n")


def refuse(ctx):
    _count(ctx)
    raise dagq.NonRetryable("the invoice is malformed; retrying will not help")


def busy_twice(ctx):
    _count(ctx)
    if ctx.attempt < 3:
        raise dagq.RetryAfter(0.1, "service busy")
    return {"attempt": ctx.attempt}


def crash(ctx):
    _count(ctx)
    raise ValueError("ordinary bug")
"""

BROKEN_MODULE = "raise RuntimeError('this module is broken at import time')\n"


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[DagqCli]:
    with DagqCli(tmp_path) as cli:
        cli.write("tasks_mod.py", TASKS_MODULE)
        cli.write("broken_mod.py", BROKEN_MODULE)
        yield cli


def one_task(cli: DagqCli, call: str, *, num_retries: int = 3) -> Path:
    return cli.workflow(
        "wf.yaml",
        {
            "name": "errors",
            "tasks": [
                {
                    "name": "job",
                    "call": call,
                    "num_retries": num_retries,
                    "retry": {"backoff_s": 0.05, "jitter": 0},
                },
                {"name": "after", "depends_on": ["job"], "cmd": "touch after.ran"},
            ],
        },
    )


@pytest.mark.parametrize(
    ("call", "reason"),
    [
        ("no_such_module_xyz:run", "ModuleNotFoundError: No module named 'no_such_module_xyz'"),
        ("tasks_mod:no_such_function", "AttributeError"),
        ("broken_mod:run", "RuntimeError: this module is broken at import time"),
    ],
    ids=["missing-module", "missing-function", "module-raises"],
)
def test_call_that_cannot_be_imported_fails_at_once_with_the_import_error(
    cli: DagqCli, call: str, reason: str
) -> None:
    result = cli.run("run", one_task(cli, call), "--id", "imp")

    assert result.code == 1, result.output
    state, attempts, _, error = result.summary_rows()["job"]
    assert (state, attempts) == ("failed", "1")
    assert f"cannot import '{call}'" in error
    assert reason in result.verdict()
    assert cli.statuses("imp")["after"] == "upstream_failed"


def test_non_retryable_error_fails_the_task_at_once(cli: DagqCli) -> None:
    result = cli.run("run", one_task(cli, "tasks_mod:refuse"), "--id", "nr")

    assert result.code == 1, result.output
    assert len(lines(cli.workdir / "job.attempts")) == 1
    state, attempts, _, error = result.summary_rows()["job"]
    assert (state, attempts) == ("failed", "1")
    assert "NonRetryable: the invoice is malformed" in error


def test_retry_after_asks_for_another_attempt_until_the_task_succeeds(cli: DagqCli) -> None:
    result = cli.run("run", one_task(cli, "tasks_mod:busy_twice"), "--id", "ra")

    assert result.code == 0, result.output
    times = [float(t) for t in lines(cli.workdir / "job.attempts")]
    assert len(times) == 3
    assert all(later - earlier >= 0.1 for earlier, later in itertools.pairwise(times))
    assert result.summary_rows()["job"][:2] == ["completed", "3"]


def test_ordinary_exception_is_retried_until_the_budget_is_spent(cli: DagqCli) -> None:
    result = cli.run("run", one_task(cli, "tasks_mod:crash", num_retries=1), "--id", "bug")

    assert result.code == 1, result.output
    assert len(lines(cli.workdir / "job.attempts")) == 2
    state, attempts, _, error = result.summary_rows()["job"]
    assert (state, attempts) == ("failed", "2")
    assert "ValueError: ordinary bug" in error


def test_retry_waits_at_least_the_configured_backoff_between_attempts(cli: DagqCli) -> None:
    wf = cli.workflow(
        "wf.yaml",
        {
            "name": "backoff",
            "tasks": [
                {
                    "name": "job",
                    "num_retries": 2,
                    "retry": {"backoff_s": 0.3, "backoff_multiplier": 2, "jitter": 0},
                    "cmd": "date +%s.%N >> job.attempts; exit 1",
                }
            ],
        },
    )

    result = cli.run("run", wf, "--id", "backoff")

    assert result.code == 1, result.output
    times = [float(t) for t in lines(cli.workdir / "job.attempts")]
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert len(gaps) == 2
    assert gaps[0] >= 0.3
    assert gaps[1] >= 0.6


def test_non_retryable_exit_code_fails_a_shell_task_at_once(cli: DagqCli) -> None:
    wf = cli.workflow(
        "wf.yaml",
        {
            "name": "codes",
            "tasks": [
                {
                    "name": "job",
                    "num_retries": 3,
                    "retry": {"backoff_s": 0.05, "non_retryable_exit_codes": [42]},
                    "cmd": "echo x >> job.attempts; exit 42",
                }
            ],
        },
    )

    result = cli.run("run", wf, "--id", "codes")

    assert result.code == 1, result.output
    assert len(lines(cli.workdir / "job.attempts")) == 1
    assert result.summary_rows()["job"][:2] == ["failed", "1"]


def test_a_task_deadline_does_not_count_time_held_back_by_max_parallelism(cli: DagqCli) -> None:
    wf = cli.workflow(
        "held.yaml",
        {
            "name": "held",
            "max_parallelism": 1,
            "tasks": [
                {"name": "long", "cmd": "sleep 2"},
                {
                    "name": "quick",
                    "cmd": "sleep 0.3; echo x >> quick.attempts",
                    "task_deadline_s": 1.5,
                },
            ],
        },
    )

    result = cli.run("run", wf, "--id", "held")

    assert result.code == 0, result.output
    assert result.summary_rows()["quick"][:2] == ["completed", "1"]
    assert len(lines(cli.workdir / "quick.attempts")) == 1
