"""``dagq server`` end to end: a real uvicorn process on 127.0.0.1, an HTTP client, and
a ``dagq coordinator`` and ``dagq worker`` on one SQLite store.

The server, coordinator and worker are shared by the module (each test submits its own
workflows); tests that restart the server leave it running again.
"""

from __future__ import annotations

import concurrent.futures
import json
import signal
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from dagq.server.idempotency import PREFIX
from dagq.stores import open_store
from tests.integration.cli_harness import DagqCli, Started, wait_until

pytestmark = pytest.mark.timeout(90)

TERMINAL = {"completed", "failed", "cancelled", "compensation_failed"}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class ApiServer:
    """``dagq server`` on a free loopback port, restartable on the same port."""

    def __init__(self, cli: DagqCli) -> None:
        self.cli = cli
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: Started | None = None

    def start(self) -> None:
        self.process = self.cli.start(
            "server", "--store", self.cli.store_url, "--port", str(self.port)
        )
        wait_until(self._answers, timeout_s=60, what="the server to answer /healthz")

    def _answers(self) -> bool:
        assert self.process is not None
        if self.process.process.poll() is not None:
            raise AssertionError(f"dagq server exited:\n{self.process.stderr()}")
        try:
            return httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    def stop(self) -> int:
        """SIGTERM; the exit code."""
        assert self.process is not None
        return self.process.stop(signal.SIGTERM, timeout_s=20).code

    def restart(self) -> None:
        assert self.stop() == 0
        self.start()


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DagqCli]:
    with DagqCli(tmp_path_factory.mktemp("server")) as harness:
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


def as_yaml(data: dict[str, Any]) -> str:
    return yaml.safe_dump(data, sort_keys=False)


YAML = {"content-type": "application/yaml"}
PIPELINE = {
    "name": "api-pipeline",
    "tasks": [
        {"name": "fetch", "cmd": 'echo \'{"rows": 3}\' > "$DAGQ_OUTPUT"'},
        {"name": "report", "depends_on": ["fetch"], "cmd": "echo done"},
    ],
}
GATED = {
    "name": "api-gated",
    "tasks": [
        {"name": "first", "cmd": "true"},
        {"name": "gate", "depends_on": ["first"], "wait_for": {"signal": "go"}},
        {"name": "after", "depends_on": ["gate"], "cmd": "true"},
    ],
}


def wait_for_end(http: httpx.Client, location: str, timeout_s: float = 30) -> dict[str, Any]:
    def ended() -> dict[str, Any] | None:
        body: dict[str, Any] = http.get(location).json()
        return body if body["status"] in TERMINAL else None

    return wait_until(ended, timeout_s=timeout_s, what=f"{location} to end", interval_s=0.05)


def wait_for_status(http: httpx.Client, location: str, status: str) -> None:
    wait_until(
        lambda: http.get(location).json()["status"] == status,
        timeout_s=30,
        what=f"{location} to be {status}",
        interval_s=0.05,
    )


def problem(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = response.json()
    assert body["status"] == status
    assert body["type"].startswith("urn:dagq:problem:")
    assert body["title"] and body["detail"]
    assert "Traceback" not in response.text
    return body


# --- submitting and watching -----------------------------------------------------------


def test_a_yaml_submission_is_accepted_with_its_location_and_runs_to_completion(
    http: httpx.Client,
) -> None:
    answer = http.post("/v1/workflows", content=as_yaml(PIPELINE), headers=YAML)
    assert answer.status_code == 202, answer.text
    location = answer.headers["location"]
    assert location == f"/v1/workflows/{answer.json()['id']}"
    assert int(answer.headers["retry-after"]) >= 1
    assert answer.json()["created"] is True

    done = wait_for_end(http, location)
    assert (done["status"], done["total"], done["done"], done["progress"]) == (
        "completed",
        2,
        2,
        1.0,
    )
    assert done["counts"] == {"completed": 2}
    assert http.get(f"{location}/tasks/fetch/output").json() == {"rows": 3}
    task = http.get(f"{location}/tasks/fetch").json()
    assert task["status"] == "completed"
    assert [(a["attempt"], a["outcome"]) for a in task["attempts"]] == [(1, "completed")]
    assert task["attempts"][0]["sent_at"] <= task["attempts"][0]["ended_at"]
    assert [t["name"] for t in http.get(f"{location}/tasks").json()] == ["fetch", "report"]
    kinds = [e["kind"] for e in http.get(f"{location}/events").json()]
    assert kinds[0] == "submitted" and kinds[-1] == "workflow_completed"
    drawn = http.get(f"{location}/graph").json()
    assert [(n["name"], n["state"]) for n in drawn["nodes"]] == [
        ("fetch", "completed"),
        ("report", "completed"),
    ]
    assert drawn["edges"] == [{"source": "fetch", "target": "report", "conditional": False}]


def test_a_json_envelope_names_the_run_and_sets_its_params(http: httpx.Client) -> None:
    definition = {
        "name": "api-params",
        "params": {"word": "none"},
        "tasks": [{"name": "say", "cmd": 'echo "\\"{{ params.word }}\\"" > "$DAGQ_OUTPUT"'}],
    }
    body = {"definition": definition, "params": {"word": "hello"}, "id": "api-params-1"}
    answer = http.post("/v1/workflows", json=body)
    assert answer.status_code == 202, answer.text
    assert answer.headers["location"] == "/v1/workflows/api-params-1"
    assert wait_for_end(http, "/v1/workflows/api-params-1")["status"] == "completed"
    assert http.get("/v1/workflows/api-params-1/tasks/say/output").json() == "hello"

    again = http.post("/v1/workflows", json={"name": "api-params", "params": {"word": "again"}})
    assert again.status_code == 202, again.text
    assert again.json()["id"] != "api-params-1"
    assert wait_for_end(http, again.headers["location"])["status"] == "completed"
    assert http.get(f"{again.headers['location']}/tasks/say/output").json() == "again"


def test_the_list_filters_by_name_and_time_and_pages_with_a_cursor(http: httpx.Client) -> None:
    ids = []
    for n in range(3):
        body = {"definition": {**PIPELINE, "name": "api-listed"}, "id": f"api-listed-{n}"}
        ids.append(http.post("/v1/workflows", json=body).json()["id"])
    first = http.get("/v1/workflows", params={"name": "api-listed", "limit": 2}).json()
    assert [w["id"] for w in first["items"]] == ids[:0:-1]  # newest first
    rest = http.get(
        "/v1/workflows", params={"name": "api-listed", "limit": 2, "cursor": first["next_cursor"]}
    ).json()
    assert [w["id"] for w in rest["items"]] == ids[:1]
    assert rest["next_cursor"] is None
    created = [w["created_at"] for w in first["items"]]
    window = http.get(
        "/v1/workflows",
        params={"name": "api-listed", "created_after": min(created), "created_before": 1e12},
    ).json()
    assert [w["id"] for w in window["items"]] == ids[:0:-1]
    problem(http.get("/v1/workflows", params={"status": "asleep"}), 422)
    problem(http.get("/v1/workflows", params={"created_after": "yesterday"}), 422)


def test_the_graph_of_a_definition_is_drawn_before_it_is_submitted(http: httpx.Client) -> None:
    drawn = http.post("/v1/graph", content=as_yaml(GATED), headers=YAML)
    assert drawn.status_code == 200, drawn.text
    body = drawn.json()
    assert body["id"] is None and body["counts"] == {}
    assert [(n["name"], n["state"]) for n in body["nodes"]] == [
        ("first", None),
        ("gate", None),
        ("after", None),
    ]
    assert [(e["source"], e["target"]) for e in body["edges"]] == [
        ("first", "gate"),
        ("gate", "after"),
    ]
    cyclic = {"name": "c", "tasks": [{"name": "a", "depends_on": ["a"], "cmd": "true"}]}
    assert "a" in problem(http.post("/v1/graph", json=cyclic), 422)["detail"]


def test_cancel_ends_a_waiting_run(http: httpx.Client) -> None:
    answer = http.post("/v1/workflows", json={"definition": GATED, "id": "api-cancelled"})
    location = answer.headers["location"]
    wait_until(
        lambda: http.get(f"{location}/tasks/gate").json()["status"] == "waiting",
        timeout_s=30,
        what="the gate to wait",
    )
    cancelled = http.post(f"{location}/cancel", json={"reason": "not needed"})
    assert cancelled.status_code == 202, cancelled.text
    assert cancelled.headers["location"] == location
    assert wait_for_end(http, location)["status"] == "cancelled"
    assert problem(http.post(f"{location}/cancel"), 409)["detail"].endswith("nothing to cancel")


def test_a_failed_task_shows_its_error_and_attempts_and_is_retried_by_name(
    http: httpx.Client,
) -> None:
    failing = {
        "name": "api-failing",
        "tasks": [
            {"name": "ok", "cmd": "true"},
            {"name": "boom", "cmd": "echo broken >&2; exit 3"},
        ],
    }
    location = http.post("/v1/workflows", json={"definition": failing}).headers["location"]
    ended = wait_for_end(http, location)
    assert ended["status"] == "failed"
    assert [t["name"] for t in ended["failed"]] == ["boom"]
    task = http.get(f"{location}/tasks/boom").json()
    assert task["status"] == "failed" and "broken" in task["full_error"], task
    assert [(a["attempt"], a["outcome"]) for a in task["attempts"]] == [(1, "failed")]

    assert (
        "nope" in problem(http.post(f"{location}/retry", json={"tasks": ["nope"]}), 404)["detail"]
    )
    problem(http.post(f"{location}/retry", json={"tasks": ["boom"], "all": True}), 422)
    problem(http.post(f"{location}/retry", json={"tasks": ["ok"]}), 409)  # nothing to re-run
    retried = http.post(f"{location}/retry", json={"tasks": ["boom"]})
    assert retried.status_code == 202, retried.text
    assert retried.json()["taken_up"] is True
    assert wait_for_end(http, location)["status"] == "failed"
    attempts = http.get(f"{location}/tasks/boom").json()["attempts"]
    assert [(a["attempt"], a["outcome"]) for a in attempts] == [(1, "failed"), (2, "failed")]
    assert http.get(f"{location}/tasks/ok").json()["attempt"] == 1  # kept, not re-run


# --- idempotency ----------------------------------------------------------------------


def test_the_same_key_and_body_replay_the_first_response_even_after_a_restart(
    http: httpx.Client, server: ApiServer
) -> None:
    headers = {**YAML, "Idempotency-Key": '"submit-once-1"'}
    body = as_yaml({**PIPELINE, "name": "api-once"})
    first = http.post("/v1/workflows", content=body, headers=headers)
    second = http.post("/v1/workflows", content=body, headers=headers)
    assert first.status_code == second.status_code == 202
    assert second.content == first.content
    assert second.headers["location"] == first.headers["location"]
    assert second.headers["idempotent-replayed"] == "true"
    server.restart()
    with httpx.Client(base_url=server.url, timeout=20) as fresh:
        third = fresh.post("/v1/workflows", content=body, headers=headers)
        assert third.content == first.content
        listed = fresh.get("/v1/workflows", params={"name": "api-once"}).json()["items"]
    assert [w["id"] for w in listed] == [first.json()["id"]]  # one run, not three


def test_the_same_key_with_another_body_is_422(http: httpx.Client) -> None:
    headers = {**YAML, "Idempotency-Key": "submit-once-2"}
    first = http.post("/v1/workflows", content=as_yaml(PIPELINE), headers=headers)
    assert first.status_code == 202
    other = as_yaml({**PIPELINE, "name": "api-other"})
    found = problem(http.post("/v1/workflows", content=other, headers=headers), 422)
    assert found["type"] == "urn:dagq:problem:idempotency-key-reused"


def test_a_key_still_in_flight_is_409_then_its_response_is_replayed(
    tmp_path: Path,
) -> None:
    with DagqCli(tmp_path) as own:
        coordinator = own.start_coordinator()
        own.start_worker()
        api = ApiServer(own)
        api.start()
        with httpx.Client(base_url=api.url, timeout=30) as http:
            failing = {"name": "api-fails", "tasks": [{"name": "boom", "cmd": "exit 3"}]}
            location = http.post("/v1/workflows", json={"definition": failing}).headers["location"]
            assert wait_for_end(http, location)["status"] == "failed"
            # A stopped coordinator holds its lease but takes nothing up: the retry waits.
            coordinator.send(signal.SIGSTOP)
            try:
                headers = {"Idempotency-Key": "retry-once"}
                with concurrent.futures.ThreadPoolExecutor(1) as pool:
                    pending = pool.submit(http.post, f"{location}/retry", headers=headers)
                    wait_until(
                        lambda: _records(own.store_url),
                        timeout_s=20,
                        what="the first retry to be in flight",
                    )
                    busy = http.post(f"{location}/retry", headers=headers)
                    found = problem(busy, 409)
                    assert found["type"] == "urn:dagq:problem:idempotency-key-in-use"
                    assert busy.headers["retry-after"] == "1"
                    coordinator.send(signal.SIGCONT)
                    first = pending.result(timeout=30)
            finally:
                coordinator.send(signal.SIGCONT)
            assert first.status_code == 202, first.text
            assert first.json()["taken_up"] is True
            replayed = http.post(f"{location}/retry", headers=headers)
            assert replayed.status_code == 202
            assert replayed.content == first.content
            assert replayed.headers["idempotent-replayed"] == "true"
        assert api.stop() == 0


def _records(store_url: str) -> list[str]:
    import asyncio

    async def listed() -> list[str]:
        store = open_store(store_url, create=False)
        try:
            return await store.documents.list(PREFIX)
        finally:
            await store.close()

    return asyncio.run(listed())


# --- problems -------------------------------------------------------------------------


def test_bad_input_is_answered_with_problem_json(http: httpx.Client) -> None:
    malformed = problem(http.post("/v1/workflows", content="name: [oops\n", headers=YAML), 400)
    assert "line 2" in malformed["detail"] and "invalid YAML" in malformed["detail"]
    typo = as_yaml({"name": "t", "tasks": [{"name": "a", "comand": "true"}]})
    unknown = problem(http.post("/v1/workflows", content=typo, headers=YAML), 422)
    assert "'comand'" in unknown["detail"] and "line 4" in unknown["detail"]
    bad_json = http.post("/v1/workflows", content="{", headers={"content-type": "application/json"})
    assert "invalid JSON" in problem(bad_json, 400)["detail"]
    extra = problem(http.post("/v1/workflows", json={"definition": GATED, "when": 1}), 422)
    assert "when" in extra["detail"]
    both = problem(http.post("/v1/workflows", json={"definition": GATED, "name": "x"}), 422)
    assert "either 'definition'" in both["detail"]
    bad_id = problem(http.post("/v1/workflows", json={"definition": GATED, "id": "../x"}), 422)
    assert "workflow id" in bad_id["detail"]
    form = http.post("/v1/workflows", content="a=b", headers={"content-type": "text/csv"})
    problem(form, 415)
    long_key = {**YAML, "Idempotency-Key": "k" * 300}
    problem(http.post("/v1/workflows", content=as_yaml(PIPELINE), headers=long_key), 400)


def test_a_body_over_the_limit_is_413(http: httpx.Client) -> None:
    from dagq.server.limits import MAX_BODY_BYTES

    declared = http.post("/v1/workflows", content=b"x" * (MAX_BODY_BYTES + 1), headers=YAML)
    assert "over the limit" in problem(declared, 413)["detail"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted while read
        for _ in range(MAX_BODY_BYTES // (1 << 20) + 2):
            yield b"x" * (1 << 20)

    streamed = http.post("/v1/workflows", content=chunks(), headers=YAML)
    assert "over the limit" in problem(streamed, 413)["detail"]


def test_unknown_workflows_and_tasks_are_404(http: httpx.Client) -> None:
    for path in (
        "/v1/workflows/no-such-run",
        "/v1/workflows/no-such-run/tasks",
        "/v1/workflows/no-such-run/tasks/a",
        "/v1/workflows/no-such-run/events",
        "/v1/workflows/no-such-run/graph",
        "/v1/workflows/no-such-run/stream",
    ):
        assert "no-such-run" in problem(http.get(path), 404)["detail"], path
    problem(http.post("/v1/workflows/no-such-run/cancel"), 404)
    known = http.post("/v1/workflows", json={"definition": PIPELINE}).headers["location"]
    assert "nope" in problem(http.get(f"{known}/tasks/nope"), 404)["detail"]
    problem(http.get(f"{known}/tasks/nope/output"), 404)
    problem(http.get("/v1/nothing-here"), 404)


# --- streams --------------------------------------------------------------------------


def read_events(
    http: httpx.Client, path: str, *, until: str, last_event_id: str | None = None
) -> list[dict[str, Any]]:
    """Server-sent events of ``path`` up to the first of kind (or event type) ``until``;
    then the client disconnects."""
    headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
    found: list[dict[str, Any]] = []
    with http.stream("GET", path, headers=headers) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        fields: dict[str, str] = {}
        for line in response.iter_lines():
            if line.startswith(":"):
                continue
            if line:
                name, _, value = line.partition(":")
                fields[name] = value.removeprefix(" ")
                continue
            if "data" not in fields:
                continue
            event = {"event": fields.get("event", "message"), "id": fields.get("id")}
            event["data"] = json.loads(fields["data"]) if event["event"] != "shutdown" else None
            found.append(event)
            fields = {}
            kind = event["data"].get("kind") if event["event"] == "message" else event["event"]
            if kind == until:
                return found
    raise AssertionError(f"the stream of {path} ended before {until!r}: {found}")


def test_a_stream_resumes_with_last_event_id_across_a_server_restart_losing_nothing(
    http: httpx.Client, server: ApiServer
) -> None:
    location = http.post("/v1/workflows", json={"definition": GATED, "id": "api-streamed"}).headers[
        "location"
    ]
    before = read_events(http, f"{location}/stream", until="waiting")
    assert all(e["id"] == e["data"]["id"] for e in before)

    server.restart()  # the client is away while the run goes on
    with httpx.Client(base_url=server.url, timeout=20) as fresh:
        sent = fresh.post(f"{location}/signals/go", json={"approved": True})
        assert sent.status_code == 202, sent.text
        wait_for_status(fresh, location, "completed")
        after = read_events(
            fresh, f"{location}/stream", until="end", last_event_id=before[-1]["id"]
        )
        history = fresh.get(f"{location}/events").json()

    streamed = [e["data"] for e in before] + [e["data"] for e in after if e["event"] == "message"]
    assert streamed == history  # every event once, in order
    assert [e["kind"] for e in history].count("waiting") == 1
    assert history[-1]["kind"] == "workflow_completed"
    assert after[-1]["event"] == "end" and after[-1]["id"] is None
    assert after[-1]["data"]["status"] == "completed"


def test_sigterm_ends_open_streams_cleanly_and_exits_0(
    http: httpx.Client, server: ApiServer
) -> None:
    location = http.post("/v1/workflows", json={"definition": GATED, "id": "api-drained"}).headers[
        "location"
    ]
    events: list[dict[str, Any]] = []
    with http.stream("GET", f"{location}/stream") as response:
        lines = response.iter_lines()
        for line in lines:  # connected, and events flow
            if line.startswith("data:") and '"submitted"' in line:
                break
        assert server.process is not None
        server.process.send(signal.SIGTERM)
        rest = list(lines)  # ends: the server closes the stream properly
    events = [json.loads(line[5:]) for line in rest if line.startswith("data: {")]
    assert "event: shutdown" in rest
    assert all(e["kind"] != "workflow_completed" for e in events)
    assert server.process.wait(20).code == 0
    server.start()
    http.post(f"{location}/cancel")


# --- the rest -------------------------------------------------------------------------


def test_readiness_health_and_the_openapi_document(http: httpx.Client) -> None:
    assert http.get("/healthz").json() == {"status": "ok"}
    ready = http.get("/readyz").json()
    assert ready["status"] == "ready" and ready["store"].startswith("sqlite:///")
    document = http.get("/openapi.json").json()
    for path in (
        "/v1/workflows",
        "/v1/workflows/{workflow_id}",
        "/v1/workflows/{workflow_id}/stream",
        "/v1/workflows/{workflow_id}/retry",
        "/v1/workflows/{workflow_id}/signals/{name}",
        "/v1/graph",
    ):
        assert path in document["paths"], path
    assert {"WorkflowDetail", "Problem", "Graph", "Accepted"} <= set(
        document["components"]["schemas"]
    )
    assert "swagger" in http.get("/docs").text.lower()
