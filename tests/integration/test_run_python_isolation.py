"""Python tasks run in pool processes under ``dagq run``: a task that takes its process
down, hangs past its timeout or returns what cannot be an output fails its own attempt
(retried per its policy), and the run goes on and ends with the right exit code.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.cli_harness import DagqCli, lines, pid_alive, read_pids

pytestmark = pytest.mark.timeout(90)

TASKS = """
import ctypes
import os
import signal
import time


def _count(name):
    with open(f"{name}.attempts", "a") as f:
        f.write(f"{os.getpid()}\\n")


def leave(ctx):
    _count(ctx.task)
    os._exit(0)


def segfault(ctx):
    _count(ctx.task)
    ctypes.string_at(0)


def oom(ctx):
    _count(ctx.task)
    os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's out-of-memory killer does


def hang(ctx):
    _count(ctx.task)
    time.sleep(60)


def quick(ctx):
    _count(ctx.task)
    return {"pid": os.getpid()}


def deep():
    value = []
    for _ in range(5000):
        value = [value]
    return value


def generator():
    return (i for i in range(3))


def fail(ctx):
    def inner():
        raise ValueError("the input has no rows")

    inner()
"""


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[DagqCli]:
    with DagqCli(tmp_path) as cli:
        cli.write("pytasks.py", TASKS)
        yield cli


def retried(name: str, call: str, retries: int = 1, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "call": call,
        "num_retries": retries,
        "retry": {"backoff_s": 0.05, "jitter": 0},
        **extra,
    }


def run(cli: DagqCli, tasks: list[dict[str, Any]], *args: str) -> Any:
    workflow = cli.workflow("wf.yaml", {"name": "iso", "tasks": tasks})
    return cli.run("run", workflow, "--id", "iso", *args, timeout_s=60)


@pytest.mark.parametrize(
    ("call", "how"),
    [
        ("pytasks:leave", "exited with code 0"),
        ("pytasks:segfault", "was killed by signal SIGSEGV"),
        ("pytasks:oom", "was killed by signal SIGKILL (out of memory?)"),
    ],
    ids=["os-exit-0", "segfault", "killed"],
)
def test_a_task_that_takes_its_process_down_fails_its_attempts_and_the_run_goes_on(
    cli: DagqCli, call: str, how: str
) -> None:
    result = run(cli, [retried("doomed", call), retried("fine", "pytasks:quick")])

    assert result.code == 1, result.output  # failed: never a false "completed"
    state, attempts, _, _ = result.summary_rows()["doomed"]
    assert (state, attempts) == ("failed", "2")  # retried per its policy
    [doomed] = [t for t in cli.view("iso").tasks if t.name == "doomed"]
    assert doomed.error == f"its Python process {how} while running it"
    assert len(set(lines(cli.workdir / "doomed.attempts"))) == 2  # a fresh process each
    assert result.summary_rows()["fine"][0] == "completed"
    assert cli.statuses("iso") == {"doomed": "failed", "fine": "completed"}


def test_a_sync_task_past_its_timeout_is_killed_and_later_tasks_run_normally(
    cli: DagqCli,
) -> None:
    tasks = [
        {"name": "stuck", "call": "pytasks:hang", "timeout_s": 0.5},
        {"name": "first", "call": "pytasks:quick"},
        *(
            {
                "name": f"after{i}",
                "call": "pytasks:quick",
                "depends_on": ["stuck", "first"],
                "dep_policy": "all_settled",
            }
            for i in range(3)
        ),
    ]
    began = time.monotonic()
    result = run(cli, tasks, "--workers", "1")

    assert time.monotonic() - began < 30
    rows = result.summary_rows()
    assert rows["stuck"][0] == "failed"
    assert "timed out after 0.5s; its process was killed" in rows["stuck"][3]
    assert all(rows[f"after{i}"][0] == "completed" for i in range(3)), result.output
    [hung] = read_pids(cli.workdir / "stuck.attempts")
    assert not pid_alive(hung)


def test_an_output_too_deep_or_not_json_fails_its_task_cleanly(cli: DagqCli) -> None:
    result = run(
        cli,
        [
            {"name": "deep", "call": "pytasks:deep", "num_retries": 2},
            {"name": "gen", "call": "pytasks:generator", "num_retries": 2},
            {"name": "fine", "call": "pytasks:quick"},
        ],
    )

    assert result.code == 1, result.output
    rows = result.summary_rows()
    assert rows["deep"][:2] == ["failed", "1"]  # not retried: it would fail the same way
    assert "the output is nested more than 100 levels deep" in rows["deep"][3]
    assert rows["gen"][:2] == ["failed", "1"]
    assert "not JSON-serialisable" in rows["gen"][3]
    assert "Traceback" not in result.output
    assert rows["fine"][0] == "completed"


def test_a_tasks_error_is_its_type_and_message_and_its_traceback_is_in_the_log(
    cli: DagqCli,
) -> None:
    result = run(cli, [{"name": "bad", "call": "pytasks:fail"}])

    assert result.code == 1
    assert cli.view("iso").tasks[0].error == "ValueError: the input has no rows"
    assert "Traceback" not in result.output
    status = cli.run("status", "iso")
    assert "ValueError: the input has no rows" in status.output
    assert "Traceback" not in status.output
    logs = cli.run("logs", "iso", "bad")
    assert logs.code == 0, logs.output
    assert "Traceback (most recent call last)" in logs.stdout
    assert "in inner" in logs.stdout
    assert "ValueError: the input has no rows" in logs.stdout


def test_a_task_failing_with_a_huge_error_ends_the_run_within_seconds(cli: DagqCli) -> None:
    cli.write("loud.py", 'def shout():\n    raise ValueError("x" * 60_000)\n')
    began = time.monotonic()
    result = run(
        cli,
        [{"name": "loud", "call": "loud:shout"}, {"name": "fine", "call": "pytasks:quick"}],
    )

    assert result.code == 1, result.output
    assert time.monotonic() - began < 30
    rows = {t.name: t for t in cli.view("iso").tasks}
    assert rows["fine"].status == "completed"
    assert rows["loud"].status == "failed"
    assert (rows["loud"].error or "").startswith(("ValueError: xxx", "its report could not"))
    assert len(rows["loud"].error or "") < 5000
