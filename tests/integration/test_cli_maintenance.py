"""``dagq doctor`` and ``dagq purge`` on stores in known conditions.

Each test has a store of its own with no coordinator running: workflows are left
pending by ``dagq submit``, or run to their end in this process, and the store is
then put into the condition under test through the storage API.
"""

from __future__ import annotations

import asyncio
import re
import signal
from collections.abc import Iterator
from pathlib import Path

import click
import msgspec
import pytest

from dagq import keys
from dagq.cli import main as dagq_main
from dagq.stores import open_store
from dagq.stores.base import OutgoingMessage, Store
from tests.integration.cli_harness import DagqCli

pytestmark = pytest.mark.timeout(30)

DAY_S = 86400.0


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[DagqCli]:
    with DagqCli(tmp_path) as cli:
        yield cli


def pending(cli: DagqCli, workflow_id: str) -> None:
    """Submit a workflow that no coordinator will start."""
    cli.submit_here(workflow_id, {"name": "p", "tasks": [{"name": "a", "cmd": "true"}]})


def age(cli: DagqCli, workflow_id: str, days: float) -> None:
    """Make the index say the workflow last changed ``days`` ago."""

    async def backdate(store: Store) -> None:
        row = await store.index.get(workflow_id)
        assert row is not None
        older = msgspec.structs.replace(
            row, created_at=row.created_at - days * DAY_S, updated_at=row.updated_at - days * DAY_S
        )
        await store.index.upsert(older)

    cli.with_store(backdate)


def dead_letter_an_event(cli: DagqCli) -> None:
    async def bury(store: Store) -> None:
        await store.queues.send(keys.COMPLETIONS_QUEUE, [OutgoingMessage(b"not msgpack")])
        [message] = await store.queues.receive(
            keys.COMPLETIONS_QUEUE, max_messages=1, visibility_timeout_s=30
        )
        await store.queues.dead_letter(keys.COMPLETIONS_QUEUE, message.receipt, "test")

    cli.with_store(bury)


def findings(cli: DagqCli) -> tuple[int, dict[str, dict[str, str]]]:
    result = cli.run("doctor", "--json")
    assert "Traceback" not in result.output
    return result.code, {f["check"]: f for f in msgspec.json.decode(result.stdout)}


# --- doctor -------------------------------------------------------------------------


def test_doctor_exits_0_on_an_empty_store(cli: DagqCli) -> None:
    asyncio.run(open_store(cli.store_url).close())  # exists, holds nothing

    code, found = findings(cli)

    assert code == 0
    assert {f["level"] for f in found.values()} == {"ok"}


def test_doctor_fails_on_a_store_that_does_not_exist(cli: DagqCli) -> None:
    code, found = findings(cli)

    assert code == 1
    assert found["store"]["level"] == "fail"
    assert "no dagq store at" in found["store"]["detail"]


def test_doctor_fails_with_a_fix_when_an_unfinished_workflow_has_no_coordinator(
    cli: DagqCli,
) -> None:
    pending(cli, "waiting")

    code, found = findings(cli)
    human = cli.run("doctor")

    assert code == 1
    assert found["coordinator"]["level"] == "fail"
    assert "dagq coordinator" in found["coordinator"]["fix"]
    assert human.code == 1
    assert "dagq coordinator" in human.stdout


def test_doctor_fails_when_the_coordinator_holding_the_lease_was_killed(cli: DagqCli) -> None:
    pending(cli, "orphan")
    coordinator = cli.start_coordinator()
    coordinator.stop(signal.SIGKILL)
    assert cli.lease() is not None  # still unexpired: only the process is gone

    code, found = findings(cli)

    assert code == 1
    assert found["coordinator"]["level"] == "fail"
    assert str(coordinator.pid) in found["coordinator"]["detail"]
    assert "dagq coordinator" in found["coordinator"]["fix"]


def test_doctor_warns_about_a_workflow_submitted_long_ago_and_never_started(
    cli: DagqCli,
) -> None:
    pending(cli, "forgotten")
    age(cli, "forgotten", days=1)

    _, found = findings(cli)

    stuck = found["workflow forgotten"]
    assert stuck["level"] == "warn"
    assert "not started" in stuck["detail"]
    assert "dagq coordinator" in stuck["fix"]


def test_doctor_warns_about_dead_lettered_messages(cli: DagqCli) -> None:
    dead_letter_an_event(cli)

    code, found = findings(cli)

    assert code == 1
    assert found["completion queue"]["level"] == "warn"
    assert "1 dead-lettered" in found["completion queue"]["detail"]
    assert found["completion queue"]["fix"]


def test_doctor_suggests_only_commands_that_exist(cli: DagqCli) -> None:
    pending(cli, "waiting")
    dead_letter_an_event(cli)

    _, found = findings(cli)

    fixes = [f["fix"] for f in found.values() if f["fix"]]
    assert len(fixes) >= 2
    suggested = {word for fix in fixes for word in re.findall(r"\bdagq (\w+)", fix)}
    assert suggested <= set(dagq_main.list_commands(click.Context(dagq_main))), fixes


# --- purge --------------------------------------------------------------------------


def test_purge_refuses_an_unfinished_workflow(cli: DagqCli) -> None:
    pending(cli, "busy")

    result = cli.run("purge", "busy")

    assert result.code == 2
    assert "--force" in result.stderr
    assert "Traceback" not in result.output
    assert cli.workflow_status("busy") == "pending"


def test_purge_force_removes_an_unfinished_workflow(cli: DagqCli) -> None:
    pending(cli, "busy")

    result = cli.run("purge", "busy", "--force")

    assert result.code == 0, result.output
    assert cli.workflow_status("busy") is None
    assert cli.with_store(lambda store: store.index.get("busy")) is None


def test_purge_older_than_removes_only_finished_workflows_past_the_cutoff(cli: DagqCli) -> None:
    for workflow_id in ("old", "new"):
        assert cli.run_here(workflow_id, [{"name": "a", "cmd": "echo hi"}]) == "completed"
    pending(cli, "old-pending")
    age(cli, "old", days=3)
    age(cli, "old-pending", days=3)

    result = cli.run("purge", "--older-than", "2", "--yes")

    assert result.code == 0, result.output
    assert "purged 1 " in result.stdout
    assert {row["id"] for row in cli.json("list")} == {"new", "old-pending"}
    assert cli.workflow_status("old") is None
    assert cli.workflow_status("new") == "completed"


def test_purge_needs_either_an_id_or_older_than(cli: DagqCli) -> None:
    result = cli.run("purge")

    assert result.code == 2
    assert "--older-than" in result.stderr
