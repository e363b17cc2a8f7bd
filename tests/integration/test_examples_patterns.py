"""The research-digest example: foreach, a loop, a person's approval, a compensated
publish. It is run as a user would: ``dagq run`` waits, ``dagq signal`` approves."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.cli_harness import DagqCli, wait_until

pytestmark = pytest.mark.timeout(90)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "research_digest.yaml"


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[DagqCli]:
    with DagqCli(tmp_path) as cli:
        cli.env["DIGEST_OUT"] = str(tmp_path)
        yield cli


def waiting(cli: DagqCli, workflow_id: str) -> bool:
    try:
        return cli.statuses(workflow_id).get("review") == "waiting"
    except Exception:  # not submitted yet
        return False


def test_the_digest_runs_every_pattern_and_publishes_once_approved(cli: DagqCli) -> None:
    running = cli.start("run", EXAMPLE, "--id", "digest")
    wait_until(lambda: waiting(cli, "digest"), timeout_s=60, what="the approval wait")
    sent = cli.run("signal", "digest", "approve", "--data", '{"approved": true, "by": "ana"}')
    assert sent.code == 0, sent.output
    result = running.wait(timeout_s=60)
    assert result.code == 0, result.output
    assert "workflow completed" in result.stdout
    tasks = {t["name"]: t for t in cli.json("tasks", "digest")}
    assert tasks["summarise"]["items"] == {"completed": 12}
    assert tasks["refine"]["attempt"] == 2  # iteration 1: quality 0.7; 2: 0.9, valid
    published = list((cli.workdir / "published").glob("*.json"))
    assert len(published) == 1
    assert json.loads(published[0].read_text())["approved_by"] == "ana"


def test_a_failed_announcement_takes_the_published_digest_down(cli: DagqCli) -> None:
    running = cli.start("run", EXAMPLE, "--id", "digest", "-p", "announce_fails=true")
    wait_until(lambda: waiting(cli, "digest"), timeout_s=60, what="the approval wait")
    assert cli.run("signal", "digest", "approve", "--data", '{"approved": true}').code == 0
    result = running.wait(timeout_s=60)
    assert result.code == 1, result.output
    assert cli.workflow_status("digest") == "failed"
    assert list((cli.workdir / "published").glob("*.json")) == []  # undone
    events = [e["kind"] for e in cli.json("events", "digest")]
    assert "compensating" in events and "compensated" in events


def test_a_rejection_skips_publishing(cli: DagqCli) -> None:
    running = cli.start("run", EXAMPLE, "--id", "digest")
    wait_until(lambda: waiting(cli, "digest"), timeout_s=60, what="the approval wait")
    assert cli.run("signal", "digest", "approve", "--data", '{"approved": false}').code == 0
    assert running.wait(timeout_s=60).code == 0
    assert cli.statuses("digest")["publish"] == "skipped"
