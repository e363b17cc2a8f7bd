"""A shell task that leaves a child running (``cmd &``) ends with its command, on a
real ``dagq worker``: what it printed is kept and the child is stopped."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.integration.cli_harness import DagqCli, wait_until


def _running(token: str) -> list[int]:
    """The live processes whose command line holds ``token``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if token.encode() in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


@pytest.mark.timeout(120)
def test_a_child_left_running_does_not_keep_the_task_running(tmp_path: Path) -> None:
    with DagqCli(tmp_path) as cli:
        token = f"left-{os.getpid()}-{tmp_path.name}"
        loop = f"(while true; do echo tick; sleep 1; done) & echo started {token}"
        path = cli.workflow("bg.yaml", {"name": "bg", "tasks": [{"name": "bg", "cmd": loop}]})
        cli.start_coordinator()
        cli.start_worker()

        done = cli.run("submit", path, "--id", "bg1", "--wait", "--timeout", "60", timeout_s=90)

        assert done.code == 0, done.output
        log = cli.run("logs", "bg1", "bg").stdout
        assert f"started {token}" in log and "tick" in log
        wait_until(lambda: not _running(token), timeout_s=10, what="the child to be stopped")
