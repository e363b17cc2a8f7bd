"""What tasks write, as ``dagq logs`` shows it — kept per attempt, and followed live
with ``--follow`` — and foreach instances reached by name (``square[2]``), with real
``dagq`` processes on a SQLite store."""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.integration.cli_harness import DagqCli, wait_for_file

pytestmark = pytest.mark.timeout(60)

TASKS = """
import logging, os, subprocess, sys, time

def chatty():
    print("printed")
    logging.info("logged at info")
    logging.getLogger("mine").warning("logged at warning")
    os.write(1, b"written to fd 1\\n")
    subprocess.run(["echo", "from a subprocess"], check=True)
    print("to stderr", file=sys.stderr)
    return "done"

def broken():
    print("about to fail")
    raise ValueError("it broke")

def waits(go):
    print("first line")
    deadline = time.monotonic() + 20
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.05)
    print("second line")
    raise RuntimeError("failed after the wait")

def square(item, attempts_dir):
    marker = os.path.join(attempts_dir, f"{item}")
    if item == 3 and not os.path.exists(marker):
        open(marker, "w").close()
        print("instance 2 fails once")
        raise RuntimeError("first try of item 3")
    print(f"squaring {item}")
    return item * item
"""


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[DagqCli]:
    with DagqCli(tmp_path) as cli:
        cli.write("logtasks.py", TASKS)
        yield cli


@pytest.fixture
def follow(cli: DagqCli) -> Iterator[Callable[..., Follower]]:
    """Starts ``dagq logs ... --follow``; whatever still runs at the end is killed."""
    started: list[Follower] = []

    def start(*args: str) -> Follower:
        started.append(Follower(cli, *args))
        return started[-1]

    yield start
    for follower in started:
        follower.close()


def run(cli: DagqCli, workflow_id: str, tasks: list[dict[str, object]]) -> None:
    path = cli.workflow(f"{workflow_id}.yaml", {"name": workflow_id, "tasks": tasks})
    cli.run("run", path, "--id", workflow_id, "--quiet")


class Follower:
    """``dagq logs ... --follow`` running in the background, read line by line."""

    def __init__(self, cli: DagqCli, *args: str) -> None:
        self.process = subprocess.Popen(
            cli.command("logs", *args, "--follow"),
            cwd=cli.workdir,
            env=cli.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert self.process.stdout is not None
        self._fd = self.process.stdout.fileno()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._fd, selectors.EVENT_READ)
        self._buffer = b""
        self.lines: list[str] = []

    def wait_for_line(self, text: str, *, timeout_s: float = 20) -> None:
        """Read until a line equal to ``text`` has come (failing at the deadline)."""
        deadline = time.monotonic() + timeout_s
        while text not in self.lines:
            left = deadline - time.monotonic()
            if left <= 0 or (self.process.poll() is not None and not self._ready(0)):
                raise AssertionError(f"no line {text!r} within {timeout_s}s; got {self.lines}")
            if self._ready(left):
                chunk = os.read(self._fd, 65536)
                if not chunk and self.process.poll() is not None:
                    continue
                self._buffer += chunk
                *whole, self._buffer = self._buffer.split(b"\n")
                self.lines += [line.decode() for line in whole]

    def _ready(self, timeout_s: float) -> bool:
        return bool(self._selector.select(min(timeout_s, 0.2)))

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.communicate()
        self._selector.close()

    def finish(self, timeout_s: float = 20) -> tuple[int, str]:
        """Wait for it to end: its exit code and everything it printed on stdout."""
        out, err = self.process.communicate(timeout=timeout_s)
        text = "\n".join(self.lines) + "\n" + (self._buffer + out).decode()
        return self.process.returncode, text + err.decode()


# --- Python tasks' output, kept -----------------------------------------------------


def test_print_logging_fd_and_subprocess_output_of_a_python_task_are_its_log(
    cli: DagqCli,
) -> None:
    run(cli, "py", [{"name": "chatty", "call": "logtasks:chatty"}])

    result = cli.run("logs", "py", "chatty")

    assert result.code == 0, result.output
    stdout, _, stderr = result.stdout.partition("--- stderr ---")
    for line in ("printed", "written to fd 1", "from a subprocess"):
        assert line in stdout
    assert "INFO root: logged at info" in stderr
    assert "WARNING mine: logged at warning" in stderr
    assert "to stderr" in stderr
    assert "no output was captured" not in result.stdout


def test_a_failed_python_tasks_log_has_its_output_then_its_traceback(cli: DagqCli) -> None:
    run(cli, "bad", [{"name": "broken", "call": "logtasks:broken"}])

    result = cli.run("logs", "bad", "broken")

    assert result.code == 0, result.output
    text = result.stdout
    assert text.index("about to fail") < text.index("--- traceback ---")
    assert "Traceback (most recent call last)" in text
    assert text.rstrip().endswith("ValueError: it broke")


def test_a_thread_isolated_python_task_leaves_its_output_alone(cli: DagqCli) -> None:
    """Threads share the worker's stdout: nothing is captured there (documented)."""
    cli.submit_here("threads", {"name": "t", "tasks": [{"name": "c", "call": "logtasks:chatty"}]})
    cli.start_coordinator()
    worker = cli.start_worker("--isolation", "thread")
    wait_until_done(cli, "threads")

    assert "printed" in worker.stdout_file.read_text()


def wait_until_done(cli: DagqCli, workflow_id: str) -> None:
    result = cli.run("status", workflow_id, "--watch", timeout_s=30)
    assert result.code == 0, result.output


# --- following ----------------------------------------------------------------------


def test_follow_prints_a_shell_tasks_lines_as_they_come(
    cli: DagqCli, follow: Callable[..., Follower]
) -> None:
    go = cli.workdir / "go"
    cli.start_coordinator()
    cli.start_worker()
    cli.submit_here(
        "sh",
        {
            "name": "sh",
            "tasks": [
                {"name": "talk", "cmd": f"echo first; {wait_for_file(str(go))}; echo second"}
            ],
        },
    )

    follower = follow("sh", "talk")
    follower.wait_for_line("first")
    assert "second" not in follower.lines  # the task is still waiting for the file
    go.touch()
    code, text = follower.finish()

    assert code == 0, text
    assert text.index("first") < text.index("second")


def test_follow_streams_a_python_task_and_exits_1_when_it_fails(
    cli: DagqCli, follow: Callable[..., Follower]
) -> None:
    go = cli.workdir / "go"
    cli.start_coordinator()
    cli.start_worker()
    cli.submit_here(
        "pyf",
        {"name": "p", "tasks": [{"name": "w", "call": "logtasks:waits", "args": {"go": str(go)}}]},
    )

    follower = follow("pyf", "w")
    follower.wait_for_line("first line")
    go.touch()
    code, text = follower.finish()

    assert code == 1, text
    assert "second line" in text
    assert "RuntimeError: failed after the wait" in text


def test_follow_waits_for_a_task_that_has_not_started(
    cli: DagqCli, follow: Callable[..., Follower]
) -> None:
    go = cli.workdir / "go"
    cli.submit_here(
        "later",
        {"name": "l", "tasks": [{"name": "t", "cmd": f"echo hello; {wait_for_file(str(go))}"}]},
    )
    follower = follow("later", "t")  # no coordinator yet: it cannot have started
    cli.start_coordinator()
    cli.start_worker()

    follower.wait_for_line("hello")
    go.touch()
    code, text = follower.finish()

    assert code == 0, text


def test_follow_of_a_finished_attempt_prints_it_and_exits_with_its_outcome(
    cli: DagqCli,
) -> None:
    run(cli, "fin", [{"name": "ok", "cmd": "echo all good"}, {"name": "no", "cmd": "exit 3"}])

    good = cli.run("logs", "fin", "ok", "--follow")
    bad = cli.run("logs", "fin", "no", "--follow")

    assert good.code == 0, good.output
    assert "all good" in good.stdout
    assert bad.code == 1, bad.output
    assert "exit code 3" in bad.stdout


# --- foreach instances by name -------------------------------------------------------


@pytest.fixture
def fanned(cli: DagqCli) -> DagqCli:
    attempts = cli.workdir / "attempts"
    attempts.mkdir()
    run(
        cli,
        "fan",
        [
            {
                "name": "square",
                "foreach": "[1, 2, 3]",
                "call": "logtasks:square",
                "args": {"attempts_dir": str(attempts)},
                "num_retries": 1,
            }
        ],
    )
    return cli


def test_the_output_of_one_instance(fanned: DagqCli) -> None:
    result = fanned.run("output", "fan", "square[2]")

    assert result.code == 0, result.output
    assert json.loads(result.stdout) == 9


def test_the_logs_of_one_instance_and_of_its_first_attempt(fanned: DagqCli) -> None:
    latest = fanned.run("logs", "fan", "square[2]")
    first = fanned.run("logs", "fan", "square[2]", "--attempt", "1")

    assert "squaring 3" in latest.stdout
    assert "instance 2 fails once" in first.stdout
    assert "RuntimeError: first try of item 3" in first.stdout


def test_the_events_of_one_instance(fanned: DagqCli) -> None:
    events = fanned.json("events", "fan", "--task", "square[2]")
    whole = fanned.json("events", "fan", "--task", "square")

    # A failed attempt of an instance is recorded with when it was sent and started.
    assert [e["kind"] for e in events] == ["dispatched", "started", "retried"]
    assert [e["attempt"] for e in events] == [1, 1, 1]
    assert events[0]["at"] <= events[1]["at"] <= events[2]["at"]
    assert {e["task"] for e in events} == {"square[2]"}
    assert {e["task"] for e in whole} == {"square", "square[2]"}


def test_tasks_lists_instances_when_asked(fanned: DagqCli) -> None:
    plain = fanned.json("tasks", "fan")
    shown = fanned.json("tasks", "fan", "--instances")

    assert [t["name"] for t in plain] == ["square"]
    assert [t["name"] for t in shown] == ["square", "square[0]", "square[1]", "square[2]"]
    assert [t["attempt"] for t in shown[1:]] == [1, 1, 2]
    assert {t["status"] for t in shown} == {"completed"}
    table = fanned.run("tasks", "fan", "--instances")
    assert "square[2]" in table.stdout


def test_an_instance_that_does_not_exist_is_a_clear_error(fanned: DagqCli) -> None:
    result = fanned.run("output", "fan", "square[7]")

    assert result.code == 2
    assert result.stderr.strip() == "error: task 'square' has 3 items; there is no item 7"


def test_instances_are_listed_for_one_workflow_only(cli: DagqCli) -> None:
    result = cli.run("tasks", "--instances")

    assert result.code == 2
    assert result.stderr.strip() == (
        "error: --instances lists the instances of one workflow: give exactly one ID"
    )


def test_an_instance_and_a_different_item_option_are_refused(fanned: DagqCli) -> None:
    result = fanned.run("logs", "fan", "square[2]", "--item", "1")

    assert result.code == 2
    assert result.stderr.strip() == "error: TASK 'square[2]' names instance 2 but --item says 1"


def test_follow_of_a_task_that_runs_no_attempt_ends_when_it_does(cli: DagqCli) -> None:
    run(
        cli,
        "nap",
        [
            {"name": "pause", "sleep_s": 0.1},
            {"name": "never", "cmd": "exit 1", "condition": "false"},
        ],
    )

    timer = cli.run("logs", "nap", "pause", "--follow", timeout_s=20)
    skipped = cli.run("logs", "nap", "never", "--follow", timeout_s=20)

    assert timer.code == 0, timer.output
    assert "'pause' ran no attempt: it is completed" in timer.stderr
    assert skipped.code == 1, skipped.output
    assert "'never' ran no attempt: it is skipped" in skipped.stderr


def test_follow_escapes_control_characters_and_joins_a_character_split_between_chunks(
    cli: DagqCli, follow: Callable[..., Follower]
) -> None:
    go = cli.workdir / "go"
    cli.start_coordinator()
    cli.start_worker()
    # 'é' is two bytes: the first is sent live, the second only after the wait.
    cmd = rf"printf 'col \033[31mred\ncaf\303'; {wait_for_file(str(go))}; printf '\251 end'"
    cli.submit_here("esc", {"name": "esc", "tasks": [{"name": "t", "cmd": cmd}]})

    follower = follow("esc", "t")
    follower.wait_for_line("col \\x1b[31mred")
    go.touch()
    code, text = follower.finish()
    on_terminal = cli.run_on_terminal("logs", "esc", "t", "--follow")

    assert code == 0, text
    assert "café end" in text
    assert "\x1b" not in text
    # On a terminal the closing line starts a line of its own.
    assert "café end\r\n[attempt 1 of 't' completed]" in on_terminal.stdout


def test_logs_of_a_running_attempt_print_its_output_so_far(
    cli: DagqCli, follow: Callable[..., Follower]
) -> None:
    go = cli.workdir / "go"
    cli.start_coordinator()
    cli.start_worker()
    cmd = f"echo 'so far'; {wait_for_file(str(go))}; echo later"
    cli.submit_here("busy", {"name": "busy", "tasks": [{"name": "t", "cmd": cmd}]})
    follow("busy", "t").wait_for_line("so far")  # it has been sent live

    try:
        shown = cli.run("logs", "busy", "t")
    finally:
        go.touch()

    assert shown.code == 0, shown.output
    assert shown.stdout == "so far\n"
    assert "attempt 1 is still running: its output so far" in shown.stderr
