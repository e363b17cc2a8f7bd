"""``dagq run --quiet``: the result in one line, not the task table; a failure also names
the tasks that failed."""

from __future__ import annotations

import re
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from dagq.client import Client
from dagq.stores.base import Store
from tests.integration.cli_harness import DagqCli, wait_until

pytestmark = pytest.mark.timeout(90)

#: ``(3 tasks in 412ms)``, ``(1,002 tasks in 2.3s)``
TIMING = r"\((?:\d{1,3}(?:,\d{3})*) tasks? in \d[\d.:]*(?:ms|s)?\)"


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[DagqCli]:
    with DagqCli(tmp_path) as cli:
        yield cli


def chain(cli: DagqCli, *, fail: str | None = None) -> Path:
    """Three tasks in a chain; ``fail`` names one that exits 3."""
    return cli.workflow(
        "chain.yaml",
        {
            "name": "chain",
            "tasks": [
                {
                    "name": name,
                    **({"depends_on": [parent]} if parent else {}),
                    "cmd": "echo broke >&2; exit 3" if name == fail else "true",
                }
                for name, parent in (("a", None), ("b", "a"), ("c", "b"))
            ],
        },
    )


def test_a_completed_run_prints_one_line(cli: DagqCli) -> None:
    result = cli.run("run", chain(cli), "--id", "ok", "--quiet")

    assert result.code == 0, result.output
    assert re.fullmatch(rf"completed: ok {TIMING}\n", result.stdout), result.stdout
    assert result.stderr == ""
    assert cli.statuses("ok") == {"a": "completed", "b": "completed", "c": "completed"}


def test_a_failed_run_names_its_error_and_its_failed_tasks(cli: DagqCli) -> None:
    result = cli.run("run", chain(cli, fail="b"), "--id", "bad", "--quiet")

    assert result.code == 1, result.output
    first, failed = result.stdout.splitlines()
    assert re.fullmatch(
        rf"failed: bad {TIMING}: task 'b' failed: exit code 3; stderr: broke", first
    ), first
    assert failed == "failed tasks: b (errors: dagq tasks bad --state failed)"
    assert "\t" not in result.stdout  # no table
    assert cli.statuses("bad") == {"a": "completed", "b": "failed", "c": "upstream_failed"}


def test_many_failed_tasks_are_named_up_to_ten_and_counted(cli: DagqCli) -> None:
    wide = cli.workflow(
        "wide.yaml",
        {"name": "wide", "tasks": [{"name": f"t{n:02d}", "cmd": "exit 1"} for n in range(12)]},
    )

    result = cli.run("run", wide, "--id", "wide", "--quiet")

    assert result.code == 1, result.output
    failed = result.stdout.splitlines()[-1]
    named = ", ".join(f"t{n:02d}" for n in range(10))
    assert failed == f"failed tasks: {named} and 2 more (errors: dagq tasks wide --state failed)"


def test_a_finished_run_asked_again_prints_its_result_in_one_line(cli: DagqCli) -> None:
    assert cli.run("run", chain(cli), "--id", "again", "--quiet").code == 0

    result = cli.run("run", chain(cli), "--id", "again", "--quiet")

    assert result.code == 0, result.output
    assert re.fullmatch(rf"completed: again {TIMING}\n", result.stdout), result.stdout


def test_on_a_terminal_quiet_shows_no_progress_only_the_result(cli: DagqCli) -> None:
    result = cli.run_on_terminal("run", chain(cli), "--id", "tty", "--quiet")

    assert result.code == 0, result.stdout
    shown = [line for line in result.stdout.replace("\r", "").split("\n") if line]
    assert len(shown) == 1, result.stdout
    assert re.fullmatch(rf"completed: tty {TIMING}", shown[0]), shown


def test_a_run_cancelled_with_a_blank_reason_still_gets_its_line(cli: DagqCli) -> None:
    slow = cli.workflow("slow.yaml", {"name": "slow", "tasks": [{"name": "t", "cmd": "sleep 30"}]})
    assert cli.run("submit", slow, "--id", "blank").code == 0

    async def cancel(store: Store) -> None:
        await Client(store).cancel("blank", " \n ")  # a reason of blanks, as the API takes it

    cli.with_store(cancel)

    result = cli.run("run", slow, "--id", "blank", "--quiet")

    assert "Traceback" not in result.stderr, result.stderr
    assert re.fullmatch(r"cancelled: blank \(1 task in [^)]+\)\n", result.stdout), result.output
    assert result.code != 0


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
def test_an_interrupted_quiet_run_keeps_stdout_to_its_result(
    cli: DagqCli, sig: signal.Signals
) -> None:
    napping = cli.workflow(
        "nap.yaml", {"name": "nap", "tasks": [{"name": "t", "cmd": "touch t.started; sleep 60"}]}
    )
    running = cli.start("run", napping, "--id", "nap", "--quiet")
    wait_until((cli.workdir / "t.started").exists, timeout_s=20, what="the task to start")
    running.send(sig)
    result = running.wait(timeout_s=30)

    assert result.code != 0, result.output
    assert len(result.stdout.splitlines()) == 1, result.stdout  # the result line alone
    assert result.stdout.startswith("cancelled: nap" if sig == signal.SIGINT else "running: nap")
    assert "resume it with: dagq run" in result.stderr  # what to do next: on stderr
