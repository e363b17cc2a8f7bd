"""Everyday conveniences through the CLI: shell completion, log level and JSON logs,
confirmation of destructive bulk commands (piped and on a pseudo-terminal), and a
``--store`` help that names every store kind."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dagq.stores import SUPPORTED_URLS
from dagq.stores.base import OutgoingMessage, Store
from tests.integration.cli_harness import DagqCli
from tests.integration.test_run_bad_input import assert_one_clear_line

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[DagqCli]:
    with DagqCli(tmp_path) as cli:
        yield cli


# --- completion ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shell", "marker"),
    [
        ("bash", "complete -o nosort -F"),
        ("zsh", "#compdef dagq"),
        ("fish", "complete --no-files --command dagq"),
    ],
)
def test_completion_prints_a_script_for_each_shell(cli: DagqCli, shell: str, marker: str) -> None:
    result = cli.run("completion", shell)

    assert result.code == 0, result.output
    assert marker in result.stdout
    assert "_DAGQ_COMPLETE" in result.stdout


def test_the_completion_script_completes_commands_and_choices(cli: DagqCli) -> None:
    def complete(words: str, index: int) -> list[str]:
        env = {"_DAGQ_COMPLETE": "bash_complete", "COMP_WORDS": words, "COMP_CWORD": str(index)}
        return cli.run(store=False, env=env).stdout.split()

    assert "plain,status" in complete("dagq sta", 1)
    assert complete("dagq worker --isolation ", 3) == ["plain,process", "plain,thread"]


def test_completion_of_an_unknown_shell_is_refused(cli: DagqCli) -> None:
    assert_one_clear_line(cli.run("completion", "tcsh"), "'tcsh' is not one of")


# --- logging -------------------------------------------------------------------------------


def test_coordinator_logs_one_json_object_per_line(cli: DagqCli) -> None:
    coordinator = cli.start_coordinator("--log-format", "json", "--log-level", "debug")

    finished = coordinator.stop()

    assert finished.code == 0, finished.output
    records = [json.loads(line) for line in finished.stderr.splitlines()]
    assert records, "no log records"
    assert all(set(r) >= {"time", "level", "logger", "message"} for r in records)
    assert any(r["level"] == "debug" for r in records)
    assert any("holds the lease" in r["message"] for r in records)
    assert records[-1]["message"] == "coordinator stopped; lease released"


def test_dagq_log_level_hides_info_lines_of_a_worker(cli: DagqCli) -> None:
    cli.env["DAGQ_LOG_LEVEL"] = "warning"
    worker = cli.start("worker", "--idle-timeout", "0.5")

    finished = worker.wait(30)

    assert finished.code == 0, finished.output
    assert finished.stderr == ""


def test_run_logs_json_at_the_level_asked(cli: DagqCli) -> None:
    cli.workflow("wf.yaml", {"name": "wf", "tasks": [{"name": "a", "cmd": "true"}]})
    cli.env["DAGQ_LOG_FORMAT"] = "json"

    result = cli.run("run", "wf.yaml", "--quiet", "--log-level", "info")

    assert result.code == 0, result.output
    records = [json.loads(line) for line in result.stderr.splitlines()]
    assert any(r["logger"].startswith("dagq") and r["level"] == "info" for r in records)


def test_a_bad_log_level_is_refused(cli: DagqCli) -> None:
    assert_one_clear_line(
        cli.run("coordinator", "--log-level", "loud"), "invalid value for '--log-level'"
    )


# --- confirmation of destructive bulk commands ---------------------------------------------


def bury_two(cli: DagqCli) -> None:
    async def bury(store: Store) -> None:
        await store.queues.send("q", [OutgoingMessage(b"x"), OutgoingMessage(b"y")])
        for message in await store.queues.receive("q", max_messages=2, visibility_timeout_s=30):
            await store.queues.dead_letter("q", message.receipt, "test")

    cli.with_store(bury)


def finished_workflow(cli: DagqCli) -> None:
    assert cli.run_here("done", [{"name": "a", "cmd": "true"}]) == "completed"


BULK = {
    "dlq-purge-all": (bury_two, ("dlq", "purge", "--all"), "remove every dead letter"),
    "purge-older-than": (finished_workflow, ("purge", "--older-than", "0"), "purge every"),
}


def remaining(cli: DagqCli, name: str) -> int:
    if name == "dlq-purge-all":
        return len(cli.json("dlq", "list"))
    return len(cli.json("list"))


@pytest.mark.parametrize("name", BULK.keys())
def test_a_bulk_purge_without_a_terminal_needs_yes(cli: DagqCli, name: str) -> None:
    prepare, args, _ = BULK[name]
    prepare(cli)

    refused = cli.run(*args)
    assert_one_clear_line(refused, "needs confirmation: pass --yes")
    assert remaining(cli, name) > 0

    done = cli.run(*args, "--yes")
    assert done.code == 0, done.output
    assert remaining(cli, name) == 0


def on_a_terminal(cli: DagqCli, args: tuple[str, ...], answer: bytes) -> tuple[int, str]:
    """Run ``dagq ARGS`` on a pseudo-terminal, answer its prompt, return (code, shown)."""
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        cli.command(*args),
        cwd=cli.workdir,
        env=cli.env,
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
    )
    os.close(terminal)
    shown = b""
    deadline = time.monotonic() + 30
    while b"[y/N]" not in shown and time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            shown += os.read(controller, 4096)
    os.write(controller, answer + b"\n")
    with contextlib.suppress(OSError):  # EIO once the command has closed the terminal
        while chunk := os.read(controller, 4096):
            shown += chunk
    os.close(controller)
    return process.wait(timeout=30), shown.decode("utf-8", "replace")


@pytest.mark.parametrize("name", BULK.keys())
def test_a_bulk_purge_on_a_terminal_asks_and_a_no_keeps_everything(cli: DagqCli, name: str) -> None:
    prepare, args, question = BULK[name]
    prepare(cli)

    code, shown = on_a_terminal(cli, args, b"n")

    assert question in shown and "[y/N]" in shown
    assert code == 1, shown
    assert "nothing done" in shown
    assert remaining(cli, name) > 0

    code, shown = on_a_terminal(cli, args, b"y")

    assert code == 0, shown
    assert remaining(cli, name) == 0


# --- --store help --------------------------------------------------------------------------


def test_store_help_names_every_store_kind(cli: DagqCli) -> None:
    shown = " ".join(cli.run("status", "--help").stdout.split())

    for url in SUPPORTED_URLS:
        assert url in shown, url
    assert "pip install 'dagq[postgres]'" in shown
