"""``dagq.run`` and ``dagq.run_async``: what ``dagq run`` does, from Python."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import dagq
from dagq.errors import ValidationError

pytestmark = pytest.mark.timeout(60)

FLAKY = """
name: flaky
params:
  n: 3
tasks:
  - name: count
    cmd: "echo '{\\"n\\": {{ params.n }}}' > $DAGQ_OUTPUT"
  - name: upload
    depends_on: [count]
    cmd: test -f fixed
"""


@pytest.fixture
def flaky(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "flaky.yaml"
    path.write_text(FLAKY)
    return path


def test_a_failed_run_is_a_result_not_an_exception(flaky: Path) -> None:
    result = dagq.run(flaky, params={"n": 7}, workflow_id="f", workers=2)

    assert (result.id, result.status, result.completed) == ("f", "failed", False)
    assert result.outputs == {"count": {"n": 7}}
    assert [t.name for t in result.failed] == ["upload"]
    assert not result.resumed


def test_the_same_id_again_returns_the_result_without_running(flaky: Path) -> None:
    dagq.run(flaky, workflow_id="f")
    (flaky.parent / "fixed").touch()

    again = dagq.run(flaky, workflow_id="f")

    assert again.resumed
    assert again.status == "failed"  # finished runs are reported, never run twice


def test_a_param_of_the_wrong_type_raises_before_anything_runs(flaky: Path) -> None:
    with pytest.raises(ValidationError, match="param 'n': expected an int"):
        dagq.run(flaky, params={"n": "many"}, store="memory://")


def test_run_async_and_run_inside_a_running_loop(flaky: Path) -> None:
    (flaky.parent / "fixed").touch()

    async def notebook_cell() -> tuple[dagq.RunResult, dagq.RunResult]:
        awaited = await dagq.run_async(flaky, store="memory://", params={"n": 1})
        blocking = dagq.run(flaky, store="memory://", params={"n": 2})  # in a thread
        return awaited, blocking

    awaited, blocking = asyncio.run(notebook_cell())

    assert awaited.completed and awaited.outputs["count"] == {"n": 1}
    assert blocking.completed and blocking.outputs["count"] == {"n": 2}
