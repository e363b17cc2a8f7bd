"""``dagq server`` for operators, end to end on a real uvicorn: live logs, the stream of
every run's changes, workers, queues, doctor, dead letters, bulk actions by filter, and
why a task waits and when each attempt ran.

Like test_server_api: one server, coordinator and worker (queue ``default``) on one
SQLite store for the module; each test submits workflows of its own.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from dagq.stores.base import OutgoingMessage, Store
from tests.integration.cli_harness import DagqCli, wait_until
from tests.integration.test_server_api import (
    GATED,
    ApiServer,
    problem,
    wait_for_end,
    wait_for_status,
)

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DagqCli]:
    with DagqCli(tmp_path_factory.mktemp("server-ops")) as harness:
        harness.start_coordinator()
        harness.start_worker("-c", "4")
        yield harness


@pytest.fixture(scope="module")
def server(cli: DagqCli) -> Iterator[ApiServer]:
    api = ApiServer(cli)
    api.start()
    yield api
    if api.process is not None and api.process.process.poll() is None:
        api.stop()


@pytest.fixture
def http(server: ApiServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=20) as client:
        yield client


def submit(http: httpx.Client, definition: dict[str, Any], workflow_id: str) -> str:
    answer = http.post("/v1/workflows", json={"definition": definition, "id": workflow_id})
    assert answer.status_code == 202, answer.text
    return str(answer.headers["location"])


# --- logs -------------------------------------------------------------------------------


def test_logs_come_incrementally_while_the_task_runs_then_complete(
    http: httpx.Client, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    talker = {
        "name": "api-talker",
        "tasks": [
            {
                "name": "talk",
                "cmd": f"echo first; echo 'naïve ünïcode'; "
                f"while [ ! -f {go} ]; do sleep 0.05; done; echo second",
            }
        ],
    }
    location = submit(http, talker, "api-talker")
    logs = f"{location}/tasks/talk/logs"

    def partial() -> dict[str, Any] | None:
        body: dict[str, Any] = http.get(logs).json()
        return body if "ünïcode" in body["text"] else None

    first = wait_until(partial, timeout_s=30, what="the first lines live")
    assert first["complete"] is False and first["attempt"] == 1
    assert first["text"] == "first\nnaïve ünïcode\n"
    assert first["next_offset"] == len(first["text"].encode())
    again = http.get(logs, params={"offset": first["next_offset"]}).json()
    assert (again["text"], again["complete"]) == ("", False)  # nothing new yet

    go.touch()

    def rest() -> dict[str, Any] | None:
        body: dict[str, Any] = http.get(logs, params={"offset": first["next_offset"]}).json()
        return body if body["complete"] else None

    last = wait_until(rest, timeout_s=30, what="the attempt to end")
    assert last["text"] == "second\n"
    assert http.get(logs, params={"offset": 6}).json()["text"].startswith("naïve")
    assert wait_for_end(http, location)["status"] == "completed"
    problem(http.get(logs, params={"attempt": 2}), 404)
    problem(http.get(logs, params={"offset": -1}), 422)
    problem(http.get(f"{location}/tasks/nope/logs"), 404)


def test_logs_of_a_task_not_started_are_empty_and_not_complete(http: httpx.Client) -> None:
    location = submit(http, GATED, "api-logs-waiting")
    wait_until(
        lambda: http.get(f"{location}/tasks/gate").json()["status"] == "waiting",
        timeout_s=30,
        what="the gate to wait",
    )
    body = http.get(f"{location}/tasks/after/logs").json()
    assert body == {
        "task": "after",
        "attempt": 0,
        "offset": 0,
        "next_offset": 0,
        "text": "",
        "complete": False,
    }
    http.post(f"{location}/cancel")
    wait_for_end(http, location)


# --- why a task waits, and when each attempt ran -----------------------------------------


def test_a_waiting_task_says_why_and_the_timeline_has_every_attempt(http: httpx.Client) -> None:
    location = submit(http, GATED, "api-why")
    wait_until(
        lambda: http.get(f"{location}/tasks/gate").json()["status"] == "waiting",
        timeout_s=30,
        what="the gate to wait",
    )
    gate = http.get(f"{location}/tasks/gate").json()
    after = http.get(f"{location}/tasks/after").json()
    first = http.get(f"{location}/tasks/first").json()
    assert "go" in gate["reason"] and "signal" in gate["reason"], gate["reason"]
    assert "gate" in after["reason"], after["reason"]
    assert first["reason"] is None  # completed: nothing to wait for
    [attempt] = first["attempts"]
    assert attempt["enqueued_at"] <= attempt["started_at"] <= attempt["finished_at"]
    assert (attempt["sent_at"], attempt["ended_at"]) == (
        attempt["enqueued_at"],
        attempt["finished_at"],
    )

    assert http.post(f"{location}/signals/go", json={"ok": True}).status_code == 202
    wait_for_end(http, location)
    timeline = http.get(f"{location}/timeline").json()["items"]
    by_task = {item["task"]: item for item in timeline}
    assert set(by_task) == {"first", "after"}  # the gate ran no attempt: a signal ended it
    for item in timeline:
        assert item["attempt"] == 1 and item["status"] == "completed", item
        assert item["enqueued_at"] <= item["started_at"] <= item["finished_at"], item
    assert by_task["first"]["finished_at"] <= by_task["after"]["enqueued_at"]
    problem(http.get("/v1/workflows/nope/timeline"), 404)


def test_a_task_on_a_queue_no_worker_serves_says_so(http: httpx.Client) -> None:
    lonely = {"name": "api-lonely", "tasks": [{"name": "t", "queue": "nobody", "cmd": "true"}]}
    location = submit(http, lonely, "api-lonely")
    wait_until(
        lambda: http.get(f"{location}/tasks/t").json()["status"] == "ready",
        timeout_s=30,
        what="the task to be sent",
    )
    reason = http.get(f"{location}/tasks/t").json()["reason"]
    assert "nobody" in reason and "worker" in reason, reason
    queues = {q["queue"]: q for q in http.get("/v1/queues").json()["items"]}
    assert queues["nobody"]["depth"] == 1 and queues["nobody"]["workers"] == 0
    assert queues["default"]["workers"] == 1
    doctor = http.get("/v1/doctor").json()
    assert doctor["ok"] is False
    assert any(
        f["what"] == "queue 'nobody'" and f["level"] == "warn" for f in doctor["findings"]
    ), doctor
    http.post(f"{location}/cancel")
    wait_for_end(http, location)


def test_workers_are_listed_with_their_queues(http: httpx.Client) -> None:
    [worker] = http.get("/v1/workers").json()["items"]
    assert worker["queues"] == ["default"] and worker["concurrency"] == 4
    assert worker["last_seen"] >= worker["started_at"]


# --- the stream of every run ------------------------------------------------------------


def read_changes(
    url: str,
    params: dict[str, str],
    done: Any,
    *,
    last_event_id: str | None = None,
) -> list[dict[str, Any]]:
    """The ``workflow`` events of ``/v1/stream`` (id and row) until ``done(events)``."""
    headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
    found: list[dict[str, Any]] = []
    with httpx.stream(
        "GET", f"{url}/v1/stream", params=params, headers=headers, timeout=30
    ) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        fields: dict[str, str] = {}
        for line in response.iter_lines():
            if line and not line.startswith(":"):
                name, _, value = line.partition(":")
                fields[name] = value.removeprefix(" ")
                continue
            if fields.get("event") == "workflow":
                found.append({"id": fields["id"], "row": json.loads(fields["data"])})
                if done(found):
                    return found
            fields = {}
    raise AssertionError(f"the stream ended after {found}")


def ended(*ids: str) -> Any:
    def check(events: list[dict[str, Any]]) -> bool:
        latest = {e["row"]["id"]: e["row"]["status"] for e in events}
        return all(latest.get(i) == "completed" for i in ids)

    return check


def test_the_stream_of_runs_resumes_with_last_event_id_losing_no_change(
    http: httpx.Client, server: ApiServer
) -> None:
    quick = {"name": "api-streamed-runs", "tasks": [{"name": "t", "cmd": "true"}]}
    wanted = {"name": "api-streamed-runs"}
    first: list[dict[str, Any]] = []
    reader = threading.Thread(
        target=lambda: first.extend(read_changes(server.url, wanted, lambda found: found))
    )
    reader.start()  # a run submitted before it connects is sent too (list, then stream)
    location = submit(http, quick, "api-streamed-1")
    reader.join(timeout=30)
    [event] = first
    assert event["row"]["id"] == "api-streamed-1" and event["row"]["name"] == quick["name"]
    assert set(event["row"]) == set(http.get("/v1/workflows").json()["items"][0])
    wait_for_end(http, location)

    # Away: two more runs start and end; resuming from the first event sends them all.
    for n in (2, 3):
        wait_for_end(http, submit(http, quick, f"api-streamed-{n}"))
    resumed = read_changes(
        server.url,
        wanted,
        ended("api-streamed-1", "api-streamed-2", "api-streamed-3"),
        last_event_id=event["id"],
    )
    ids = [float(e["id"]) for e in resumed]
    assert ids == sorted(ids)
    problem(http.get("/v1/stream", headers={"Last-Event-ID": "yesterday"}), 400)
    problem(http.get("/v1/stream", params={"status": "sleepy"}), 422)
    problem(http.get("/v1/stream", params={"label": "nokey"}), 422)


# --- dead letters -----------------------------------------------------------------------


def test_dead_letters_are_listed_shown_replayed_and_purged(
    http: httpx.Client, cli: DagqCli
) -> None:
    held = {"name": "api-buried", "tasks": [{"name": "t", "queue": "graveyard", "cmd": "true"}]}
    location = submit(http, held, "api-buried")
    submit(http, {**held, "name": "api-buried-2"}, "api-buried-2")

    async def bury_all(store: Store) -> int:
        messages = await store.queues.receive("graveyard", max_messages=2, visibility_timeout_s=30)
        for message in messages:
            await store.queues.dead_letter("graveyard", message.receipt, "kept killing a worker")
        return len(messages)

    wait_until(
        lambda: (
            http.get("/v1/queues").json()["items"]
            and {q["queue"]: q for q in http.get("/v1/queues").json()["items"]}.get(
                "graveyard", {}
            ).get("depth")
            == 2
        ),
        timeout_s=30,
        what="both task messages",
    )
    assert cli.with_store(bury_all) == 2
    listed = http.get("/v1/dead-letters", params={"queue": "graveyard"}).json()["items"]
    assert sorted(d["summary"] for d in listed) == ["api-buried-2/t#1", "api-buried/t#1"]
    one = next(d for d in listed if d["summary"] == "api-buried/t#1")
    other = next(d for d in listed if d is not one)
    shown = http.get(f"/v1/dead-letters/{one['key']}").json()
    assert shown["dead_letter"] == one and shown["body"][0]["workflow_id"] == "api-buried"
    queues = {q["queue"]: q for q in http.get("/v1/queues").json()["items"]}
    assert queues["graveyard"]["dead_letters"] == 2

    problem(http.post("/v1/dead-letters/replay", json={"keys": [one["key"], "nope"]}), 404)
    problem(http.post("/v1/dead-letters/replay", json={"keys": []}), 422)
    problem(http.post("/v1/dead-letters/purge", content=b"{"), 400)
    assert http.post("/v1/dead-letters/replay", json={"keys": [one["key"]]}).json() == {"count": 1}
    assert http.post("/v1/dead-letters/purge", json={"keys": [other["key"]]}).json() == {"count": 1}
    assert http.get("/v1/dead-letters", params={"queue": "graveyard"}).json() == {"items": []}
    problem(http.get(f"/v1/dead-letters/{one['key']}"), 404)
    queues = {q["queue"]: q for q in http.get("/v1/queues").json()["items"]}
    assert queues["graveyard"]["depth"] == 1  # the replayed one, back on its queue
    http.post(f"{location}/cancel")


def test_dead_letter_replay_and_purge_are_in_the_runs_events_with_who_did_it(
    http: httpx.Client, cli: DagqCli, server: ApiServer
) -> None:
    held = {"name": "api-dl-audit", "tasks": [{"name": "t", "queue": "crypt", "cmd": "true"}]}
    location = submit(http, held, "api-dl-audit")

    async def bury(store: Store) -> int:
        found = await store.queues.receive("crypt", max_messages=5, visibility_timeout_s=30)
        for message in found:
            await store.queues.dead_letter("crypt", message.receipt, "kept killing a worker")
        return len(found)

    async def bury_garbage(store: Store) -> None:
        await store.queues.send("junk", [OutgoingMessage(b"\xffnot a message")])
        [message] = await store.queues.receive("junk", max_messages=1, visibility_timeout_s=30)
        await store.queues.dead_letter("junk", message.receipt, "cannot be parsed")

    def dead_in(queue: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = http.get("/v1/dead-letters", params={"queue": queue}).json()[
            "items"
        ]
        return items

    def entries(kind: str) -> list[dict[str, Any]]:
        return [e for e in http.get(f"{location}/events").json() if e["kind"] == kind]

    wait_until(lambda: cli.with_store(bury) == 1, timeout_s=30, what="the task message")
    [first] = dead_in("crypt")
    assert http.post("/v1/dead-letters/replay", json={"keys": [first["key"]]}).json()["count"] == 1
    [replayed] = wait_until(
        lambda: entries("dead_letter_replayed"), timeout_s=30, what="the replay in the events"
    )
    assert replayed["actor"] == "anonymous"
    assert first["key"] in replayed["detail"] and "task t#1" in replayed["detail"]

    wait_until(lambda: cli.with_store(bury) == 1, timeout_s=30, what="the replayed message")
    [second] = dead_in("crypt")
    assert http.post("/v1/dead-letters/purge", json={"keys": [second["key"]]}).json()["count"] == 1
    [purged] = wait_until(
        lambda: entries("dead_letter_purged"), timeout_s=30, what="the purge in the events"
    )
    assert purged["actor"] == "anonymous" and second["key"] in purged["detail"]

    cli.with_store(bury_garbage)
    [garbage] = dead_in("junk")
    assert http.post("/v1/dead-letters/purge", json={"keys": [garbage["key"]]}).json()["count"] == 1
    assert server.process is not None
    wait_until(
        lambda: (
            f"dead letter {garbage['key']}" in server.process.stderr()  # type: ignore[union-attr]
            and "names no workflow" in server.process.stderr()
        ),  # type: ignore[union-attr]
        timeout_s=10,
        what="the purge of a message naming no run in the server's log",
    )
    http.post(f"{location}/cancel")
    http.post("/v1/workflows/api-buried-2/cancel")
    wait_for_status(http, location, "cancelled")


# --- labels and bulk actions --------------------------------------------------------------


def test_bulk_cancel_counts_in_a_dry_run_then_cancels_only_the_runs_matched(
    http: httpx.Client,
) -> None:
    locations = []
    for n, batch in enumerate(["b1", "b1", "b1", "b2"]):
        body = {"definition": GATED, "id": f"api-bulk-{n}", "labels": {"batch": batch}}
        answer = http.post("/v1/workflows", json=body)
        assert answer.status_code == 202, answer.text
        locations.append(answer.headers["location"])
    for location in locations:
        wait_for_status(http, location, "running")
    listed = http.get("/v1/workflows", params={"label": "batch=b1"}).json()["items"]
    assert sorted(w["id"] for w in listed) == ["api-bulk-0", "api-bulk-1", "api-bulk-2"]
    assert all(w["labels"] == {"batch": "b1"} for w in listed)
    both = http.get("/v1/workflows", params=[("label", "batch=b1"), ("label", "x=y")]).json()
    assert both["items"] == []

    dry = http.post("/v1/workflows/cancel", json={"label": "batch=b1"})
    assert dry.status_code == 200, dry.text
    assert dry.json() == {
        "matched": 3,
        "ids": ["api-bulk-2", "api-bulk-1", "api-bulk-0"],
        "dry_run": True,
        "skipped": {},
    }
    assert all(http.get(loc).json()["status"] == "running" for loc in locations)  # untouched

    real = http.post(
        "/v1/workflows/cancel", json={"label": "batch=b1", "dry_run": False, "reason": "bulk"}
    ).json()
    assert (real["matched"], real["dry_run"], real["skipped"]) == (3, False, {})
    for location in locations[:3]:
        assert wait_for_end(http, location)["status"] == "cancelled"
    assert http.get(locations[3]).json()["status"] == "running"
    retry = http.post("/v1/workflows/retry", json={"label": ["batch=b1"], "dry_run": True})
    assert retry.json()["matched"] == 3  # cancelled runs can be retried
    assert http.post("/v1/workflows/cancel", json={"label": "batch=b1"}).json()["matched"] == 0

    problem(http.post("/v1/workflows/cancel", json={"dry_run": "yes"}), 422)
    problem(http.post("/v1/workflows/cancel", json={"status": "sleepy"}), 422)
    problem(http.post("/v1/workflows/cancel", json={"colour": "red"}), 422)
    problem(http.post("/v1/workflows/retry", content=b'{"name": '), 400)
    bad = {"definition": GATED, "labels": {"a=b": "c"}}
    problem(http.post("/v1/workflows", json=bad), 422)
    http.post(f"{locations[3]}/cancel")
    wait_for_end(http, locations[3])


def test_a_bulk_retry_sent_again_under_its_idempotency_key_acts_once(http: httpx.Client) -> None:
    failing = {"name": "api-bulk-fails", "tasks": [{"name": "boom", "cmd": "exit 3"}]}
    locations = []
    for n in range(2):
        body = {"definition": failing, "id": f"api-bulk-r{n}", "labels": {"batch": "r1"}}
        locations.append(http.post("/v1/workflows", json=body).headers["location"])
    for location in locations:
        assert wait_for_end(http, location)["status"] == "failed"
    request = {"label": "batch=r1", "dry_run": False}
    headers = {"Idempotency-Key": "bulk-retry-once"}

    first = http.post("/v1/workflows/retry", json=request, headers=headers)
    assert first.status_code == 200, first.text
    assert first.json()["matched"] == 2 and first.json()["skipped"] == {}
    for location in locations:
        wait_until(
            lambda location=location: (
                http.get(f"{location}/tasks/boom").json()["attempt"] == 2
                and http.get(location).json()["status"] == "failed"
            ),
            timeout_s=30,
            what="the retried run to fail again",
        )
    again = http.post("/v1/workflows/retry", json=request, headers=headers)

    assert again.status_code == 200
    assert again.headers["idempotent-replayed"] == "true"
    assert again.content == first.content
    for location in locations:
        attempts = http.get(f"{location}/tasks/boom").json()["attempts"]
        assert [a["attempt"] for a in attempts] == [1, 2]
    other = {"Idempotency-Key": "bulk-retry-other"}  # another key: a new request, it acts
    assert http.post("/v1/workflows/retry", json=request, headers=other).json()["matched"] == 2


def test_every_attempt_of_a_retried_task_has_its_start_on_the_timeline(
    http: httpx.Client, tmp_path: Path
) -> None:
    mark = tmp_path / "tried"
    flaky = {
        "name": "api-flaky",
        "tasks": [
            {
                "name": "flaky",
                "cmd": f"if [ -f {mark} ]; then echo ok; else touch {mark}; exit 1; fi",
                "num_retries": 1,
                "retry": {"backoff_s": 0},
            }
        ],
    }
    location = submit(http, flaky, "api-flaky")
    assert wait_for_end(http, location)["status"] == "completed"
    items = http.get(f"{location}/timeline").json()["items"]
    assert [(i["task"], i["attempt"], i["status"]) for i in items] == [
        ("flaky", 1, "retried"),
        ("flaky", 2, "completed"),
    ]
    for item in items:
        assert item["enqueued_at"] <= item["started_at"] <= item["finished_at"], item
    assert items[0]["finished_at"] <= items[1]["enqueued_at"]
    attempts = http.get(f"{location}/tasks/flaky").json()["attempts"]
    assert [a["started_at"] for a in attempts] == [i["started_at"] for i in items]


def test_every_attempt_of_a_retried_foreach_instance_has_its_times_on_the_timeline(
    http: httpx.Client, tmp_path: Path
) -> None:
    """The run's state keeps only an instance's latest attempt; the failed ones are on
    the timeline all the same, each with when it was sent, started and ended."""
    marks = tmp_path / "instance-tries"
    marks.mkdir()
    flaky = {
        "name": "api-flaky-each",
        "tasks": [
            {"name": "split", "cmd": "echo '[1, 2]' > \"$DAGQ_OUTPUT\""},
            {
                "name": "each",
                "depends_on": ["split"],
                "foreach": "inputs.split",
                "num_retries": 2,
                "retry": {"backoff_s": 0},
                # Item 1 fails twice, then succeeds; item 0 succeeds at once.
                "cmd": f'f={marks}/$DAGQ_INDEX; echo x >> "$f"; '
                f'[ "$DAGQ_INDEX" = 0 ] || [ "$(wc -l < "$f")" -ge 3 ]',
            },
        ],
    }
    location = submit(http, flaky, "api-flaky-each")
    assert wait_for_end(http, location)["status"] == "completed"
    items = http.get(f"{location}/timeline").json()["items"]
    instance = [i for i in items if i["task"] == "each[1]"]
    assert [(i["attempt"], i["status"]) for i in instance] == [
        (1, "retried"),
        (2, "retried"),
        (3, "completed"),
    ]
    for item in instance:
        assert item["enqueued_at"] <= item["started_at"] <= item["finished_at"], item
    for before, after in itertools.pairwise(instance):
        assert before["finished_at"] <= after["enqueued_at"]
    assert [(i["attempt"], i["status"]) for i in items if i["task"] == "each[0]"] == [
        (1, "completed")
    ]
