"""``dagq store copy SRC DST``: a sqlite store with finished and unfinished runs, a
pending event and a dead letter, copied into PostgreSQL; the copy lists the same, and
the unfinished runs complete there."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dagq import keys
from dagq.stores.base import OutgoingMessage, Store
from tests.conftest import postgres_url
from tests.integration.cli_harness import DagqCli
from tests.postgres import Cluster

pytestmark = pytest.mark.timeout(90)


def chain(log: Path) -> list[dict[str, object]]:
    return [
        {"name": "a", "cmd": f"echo a >> {log}"},
        {"name": "b", "cmd": f"echo b >> {log}", "depends_on": ["a"]},
    ]


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[DagqCli]:
    with DagqCli(tmp_path) as cli:
        yield cli


def listing(cli: DagqCli) -> dict[str, str]:
    return {row["id"]: row["status"] for row in cli.json("list")}


def test_a_sqlite_store_copied_to_postgres_lists_the_same_and_finishes_its_runs(
    cli: DagqCli, postgres_cluster: Cluster
) -> None:
    log = cli.workdir / "effects.log"
    assert cli.run_here("done", chain(log)) == "completed"
    cli.submit_here("waiting-1", {"name": "w", "tasks": chain(cli.workdir / "effects.log")})
    cli.submit_here("waiting-2", {"name": "w", "tasks": chain(cli.workdir / "effects.log")})

    async def bury(store: Store) -> None:
        await store.queues.send("default", [OutgoingMessage(b"not a task", id="junk")])
        [message] = await store.queues.receive("default", max_messages=1, visibility_timeout_s=9)
        await store.queues.dead_letter("default", message.receipt, "cannot be parsed")

    cli.with_store(bury)
    before = listing(cli)
    sqlite_url = cli.store_url
    target = postgres_url(postgres_cluster)

    copied = cli.run("store", "copy", sqlite_url, target)

    assert copied.code == 0, copied.output
    assert "3 index row(s)" in copied.stdout and "1 dead letter(s)" in copied.stdout
    cli.store_url = target
    assert listing(cli) == before
    [letter] = cli.json("dlq", "list")
    assert letter["reason"] == "cannot be parsed"
    pending = cli.with_store(lambda s: s.queues.depth(keys.COMPLETIONS_QUEUE))
    assert pending.visible >= 2  # the submitted runs' wake-up events came along
    cli.start_coordinator()
    cli.start_worker("-q", "default")
    assert cli.wait_for_end("waiting-1", timeout_s=40) == "completed"
    assert cli.wait_for_end("waiting-2", timeout_s=40) == "completed"
    assert listing(cli) == {"done": "completed", "waiting-1": "completed", "waiting-2": "completed"}
    assert sorted(log.read_text().split()) == [
        "a",
        "a",
        "a",
        "b",
        "b",
        "b",
    ]


def test_copy_refuses_a_destination_that_is_not_empty(
    cli: DagqCli, postgres_cluster: Cluster
) -> None:
    cli.submit_here("one", {"name": "w", "tasks": chain(cli.workdir / "effects.log")})
    target = postgres_url(postgres_cluster)
    assert cli.run("store", "copy", cli.store_url, target).code == 0

    again = cli.run("store", "copy", cli.store_url, target)

    assert again.code == 2, again.output
    [line] = again.stderr.strip().splitlines()
    assert line.startswith("error: ") and "is not empty" in line


def test_copy_refuses_while_a_coordinator_runs_on_the_source(
    cli: DagqCli, postgres_cluster: Cluster
) -> None:
    cli.submit_here("one", {"name": "w", "tasks": chain(cli.workdir / "effects.log")})
    cli.start_coordinator()

    refused = cli.run("store", "copy", cli.store_url, postgres_url(postgres_cluster))

    assert refused.code == 2, refused.output
    assert "a coordinator" in refused.stderr and "stop it" in refused.stderr


@pytest.mark.parametrize(
    ("source", "destination", "fault"),
    [
        ("memory://", "sqlite:///copy.db", "memory:// lives only inside one process"),
        ("sqlite:///a.db", "sqlite:///a.db", "SRC and DST are the same store"),
        ("sqlite:///missing.db", "sqlite:///copy.db", "no dagq store at missing.db"),
    ],
)
def test_copy_refuses_what_cannot_be_copied_in_one_line(
    cli: DagqCli, source: str, destination: str, fault: str
) -> None:
    done = cli.run("store", "copy", source, destination)
    assert done.code == 2, done.output
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("error: ") and fault in line
    assert not (cli.workdir / "copy.db").exists()
