"""``dagq run`` at scale: a 10,000-task fan-out of no-op Python tasks completes.

The wall time and rate are printed (run pytest with ``-s`` to see them) for the
closing note; the performance issue sets the targets.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.cli_harness import DagqCli

FAN_OUT = 10_000


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[DagqCli]:
    with DagqCli(tmp_path) as cli:
        cli.write("noop.py", "def noop():\n    return None\n")
        yield cli


def fan_out(cli: DagqCli, width: int) -> Path:
    """root → ``width`` parallel no-op tasks → join."""
    tasks = [{"name": "root", "call": "noop:noop"}]
    tasks += [
        {"name": f"t{i:05d}", "depends_on": ["root"], "call": "noop:noop"} for i in range(width)
    ]
    tasks.append(
        {"name": "join", "depends_on": [t["name"] for t in tasks[1:]], "call": "noop:noop"}
    )
    path = cli.workdir / "fan_out.json"
    path.write_text(json.dumps({"name": "fan-out", "tasks": tasks}))
    return path


@pytest.mark.timeout(180)
def test_ten_thousand_task_fan_out_completes(cli: DagqCli) -> None:
    wf = fan_out(cli, FAN_OUT)
    started = time.monotonic()

    result = cli.run("run", wf, "--workers", "16", "--id", "fan", timeout_s=170)

    wall = time.monotonic() - started
    total = FAN_OUT + 2
    print(f"\n{total:,} tasks in {wall:.1f}s wall ({total / wall:,.0f} tasks/s, incl. start-up)")
    assert result.code == 0, result.output[-3000:]
    assert "workflow completed" in result.verdict()
    assert f"{total:,} tasks" in result.verdict()
    view = cli.view("fan")
    assert view.status == "completed"
    assert view.counts == {"completed": total}
    assert all(row.attempts == 1 for row in view.tasks)
