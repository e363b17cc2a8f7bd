"""``dagq dlq``: dead letters listed, shown, replayed after a fix, purged.

Each test has a store of its own. Messages reach the dead letters the way the
engine puts them there (``queues.dead_letter`` after a receive); replay must put the
message back on its queue, where the engine takes it up again.
"""

from __future__ import annotations

import getpass
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from dagq import keys
from dagq.stores.base import OutgoingMessage, Store
from tests.integration.cli_harness import DagqCli, wait_until

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[DagqCli]:
    with DagqCli(tmp_path) as cli:
        yield cli


def bury(cli: DagqCli, queue: str, reason: str) -> None:
    """Dead-letter the next message of ``queue`` (it must be there)."""

    async def move(store: Store) -> None:
        [message] = await store.queues.receive(queue, max_messages=1, visibility_timeout_s=30)
        await store.queues.dead_letter(queue, message.receipt, reason)

    cli.with_store(move)


def queued(cli: DagqCli, queue: str) -> int:
    async def depth(store: Store) -> int:
        found = await store.queues.depth(queue)
        return found.visible + found.invisible

    return int(cli.with_store(depth))


def send_garbage(cli: DagqCli, queue: str, body: bytes) -> None:
    async def send(store: Store) -> None:
        await store.queues.send(queue, [OutgoingMessage(body)])

    cli.with_store(send)


@pytest.mark.timeout(120)  # eleven dagq commands and two processes, on a shared machine
def test_a_buried_task_is_listed_shown_and_replayed_and_its_workflow_completes(
    cli: DagqCli,
) -> None:
    cli.start_coordinator()
    cli.submit_here("w", {"name": "w", "tasks": [{"name": "t", "queue": "dl", "cmd": "true"}]})
    wait_until(lambda: queued(cli, "dl") == 1, timeout_s=15, what="the task message")
    bury(cli, "dl", "kept killing its worker")

    listed = cli.json("dlq", "list")
    [dead] = listed
    assert (dead["queue"], dead["kind"], dead["summary"]) == ("dl", "task", "w/t#1")
    assert dead["reason"] == "kept killing its worker"
    assert dead["message_id"] == "w/t/1"
    shown = cli.json("dlq", "show", dead["key"])
    assert shown["dead_letter"] == dead
    assert shown["body"][0]["workflow_id"] == "w"
    human = cli.run("dlq", "list")
    assert human.code == 0 and "kept killing its worker" in human.stdout

    replayed = cli.run("dlq", "replay", dead["key"])

    assert replayed.code == 0, replayed.output
    assert "replayed 1" in replayed.stdout
    assert cli.json("dlq", "list") == []
    assert queued(cli, "dl") == 1  # back on its queue, under its own id
    cli.start_worker("-q", "dl")
    assert cli.wait_for_end("w", timeout_s=20) == "completed"
    [entry] = [e for e in cli.json("events", "w") if e["kind"] == "dead_letter_replayed"]
    assert entry["actor"] == f"cli:{getpass.getuser()}"
    assert dead["key"] in entry["detail"] and "task t#1" in entry["detail"]


def test_doctor_warns_until_the_dead_letters_are_purged(cli: DagqCli) -> None:
    send_garbage(cli, "somewhere", b"\xff not a task")
    bury(cli, "somewhere", "cannot be parsed: test")
    send_garbage(cli, keys.COMPLETIONS_QUEUE, b"\xff not events")
    bury(cli, keys.COMPLETIONS_QUEUE, "cannot be parsed: test")

    doctor = cli.run("doctor", "--json")
    assert doctor.code == 1
    warned = [f for f in json.loads(doctor.stdout) if "dead-lettered" in f["detail"]]
    assert sorted(f["check"] for f in warned) == ["completion queue", "queue 'somewhere'"]
    assert all("dagq dlq" in f["fix"] for f in warned)
    [one] = cli.json("dlq", "list", "--queue", "somewhere")
    assert one["kind"] == "unreadable"
    shown = cli.run("dlq", "show", one["key"])
    assert shown.code == 0 and "not a task" in shown.stdout

    purged = cli.run("dlq", "purge", "--all", "--yes")

    assert purged.code == 0, purged.output
    assert "purged 2" in purged.stdout
    assert cli.json("dlq", "list") == []
    assert not [f for f in cli.json("doctor") if "dead-lettered" in f["detail"]]


def test_replay_all_of_one_queue_leaves_the_others(cli: DagqCli) -> None:
    for queue in ("a", "a", "b"):
        send_garbage(cli, queue, b"x")
        bury(cli, queue, "test")

    result = cli.run("dlq", "replay", "--all", "--queue", "a")

    assert result.code == 0 and "replayed 2" in result.stdout
    assert [d["queue"] for d in cli.json("dlq", "list")] == ["b"]
    assert queued(cli, "a") == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["show", "nope"], "no dead letter with key 'nope'"),
        (["replay", "nope"], "no dead letter with key 'nope'"),
        (["replay"], "give the keys"),
        (["purge", "k", "--all"], "not both"),
        (["purge", "k", "--queue", "a"], "--queue goes with --all"),
    ],
)
def test_bad_dlq_requests_are_refused_in_one_line(
    cli: DagqCli, args: list[str], message: str
) -> None:
    send_garbage(cli, "a", b"x")  # the store exists
    bury(cli, "a", "test")

    result = cli.run("dlq", *args)

    assert result.code == 2, result.output
    assert message in result.stderr
    assert "Traceback" not in result.output
