"""``dagq run --id X`` survives a SIGKILL: started again, it finishes the same workflow.

Tasks append ``start NAME`` / ``end NAME`` to a log, so the test can tell what ran
and how often. The kill lands mid-run (after some tasks ended, while a chain of
short tasks still has a long way to go).
"""

from __future__ import annotations

import itertools
import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.cli_harness import DagqCli, lines, wait_until

CHAIN = 14
PARALLEL = 16
TASK_S = 0.2


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[DagqCli]:
    with DagqCli(tmp_path) as cli:
        yield cli


def _logged(name: str) -> str:
    return f"echo 'start {name}' >> run.log; sleep {TASK_S}; echo 'end {name}' >> run.log"


def crashable(cli: DagqCli) -> Path:
    """A chain of short tasks, plus a fan of parallel ones hanging off its first link."""
    chain = [f"c{i:02d}" for i in range(CHAIN)]
    tasks = [{"name": chain[0], "cmd": _logged(chain[0])}]
    tasks += [
        {"name": name, "depends_on": [parent], "cmd": _logged(name)}
        for parent, name in itertools.pairwise(chain)
    ]
    tasks += [
        {"name": f"p{i:02d}", "depends_on": [chain[0]], "cmd": _logged(f"p{i:02d}")}
        for i in range(PARALLEL)
    ]
    return cli.workflow("crashable.yaml", {"name": "crashable", "tasks": tasks})


def _ended(log: Path) -> int:
    return sum(1 for line in lines(log) if line.startswith("end "))


@pytest.mark.timeout(90)
def test_killed_run_resumes_with_the_same_id_and_reruns_no_completed_task(cli: DagqCli) -> None:
    wf = crashable(cli)
    log = cli.workdir / "run.log"
    first = cli.start("run", wf, "--id", "crash", "--workers", "4")
    wait_until(lambda: _ended(log) >= 6, timeout_s=30, what="six tasks to end")

    first.send(signal.SIGKILL)
    assert first.wait(timeout_s=10).code == -signal.SIGKILL
    after_kill = cli.statuses("crash")
    completed = {name for name, state in after_kill.items() if state == "completed"}
    assert completed, "nothing was recorded as completed before the kill"
    assert completed != set(after_kill), "the kill landed after the end"

    second = cli.run("run", wf, "--id", "crash", "--workers", "4", timeout_s=80)

    assert second.code == 0, second.output
    assert "resuming workflow crash" in second.stdout
    assert "workflow completed" in second.verdict()
    assert set(cli.statuses("crash").values()) == {"completed"}
    starts = Counter(line.split()[1] for line in lines(log) if line.startswith("start "))
    assert {name: starts[name] for name in completed} == dict.fromkeys(completed, 1)
    assert set(starts) == set(after_kill)
