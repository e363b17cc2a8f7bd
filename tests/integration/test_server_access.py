"""Access control of ``dagq server`` end to end: tokens made with ``dagq token`` as a
user types it, a real uvicorn on 127.0.0.1 with ``--auth``, an HTTP client.

401 without a token or with a bad, expired or revoked one; 403 when the role may not
act; a tenant's token sees none of another tenant's runs (404, empty lists, no
stream); every action is in the run's history with who did it.
"""

from __future__ import annotations

import getpass
import json
import re
import signal
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from dagq.stores.base import IndexRow, Store
from tests.integration.cli_harness import DagqCli, Started, wait_until
from tests.integration.test_server_api import (
    GATED,
    PIPELINE,
    YAML,
    as_yaml,
    free_port,
    problem,
    wait_for_end,
    wait_for_status,
)

pytestmark = pytest.mark.timeout(90)

FAILING = {"name": "api-failing", "tasks": [{"name": "boom", "cmd": "exit 3"}]}
SLOW = {"name": "api-slow", "tasks": [{"name": "nap", "cmd": "sleep 30"}]}


class Tokens:
    """Tokens made through ``dagq token create``, by the name given to each."""

    def __init__(self, cli: DagqCli) -> None:
        self.cli = cli
        self.secrets: dict[str, str] = {}
        self.ids: dict[str, str] = {}

    def make(self, name: str, *args: str) -> str:
        done = self.cli.run("token", "create", "--name", name, *args, "--store", self.cli.store_url)
        assert done.code == 0, done.output
        token = done.stdout.strip()
        [token_id] = re.findall(r"^token ([0-9a-f]{12}) ", done.stderr, re.M)
        self.secrets[name], self.ids[name] = token, token_id
        return token

    def header(self, name: str) -> dict[str, str]:
        return {"authorization": f"Bearer {self.secrets[name]}"}


def start_server(cli: DagqCli, *args: str, host: str = "127.0.0.1") -> tuple[Started, str]:
    port = free_port()
    started = cli.start(
        "server", "--store", cli.store_url, "--host", host, "--port", str(port), *args
    )
    url = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        if started.process.poll() is not None:
            raise AssertionError(f"dagq server exited:\n{started.stderr()}")
        try:
            return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    wait_until(answers, timeout_s=20, what="the server to answer /healthz")
    return started, url


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DagqCli]:
    with DagqCli(tmp_path_factory.mktemp("access")) as harness:
        harness.start_coordinator()
        harness.start_worker("-c", "4")
        yield harness


@pytest.fixture(scope="module")
def tokens(cli: DagqCli) -> Tokens:
    made = Tokens(cli)
    made.make("root", "--role", "admin")
    made.make("watcher", "--role", "viewer")
    made.make("ops", "--role", "operator")
    made.make("alice", "--role", "operator", "--tenant", "tenant-a")
    made.make("bob", "--role", "operator", "--tenant", "tenant-b")
    return made


@pytest.fixture(scope="module")
def server(cli: DagqCli, tokens: Tokens) -> Iterator[str]:
    started, url = start_server(cli, "--auth")
    assert re.search(
        r"^dagq server: tokens required \(--auth\); \d+ active$", started.stderr(), re.M
    )
    yield url
    assert started.stop(signal.SIGTERM, timeout_s=20).code == 0


@pytest.fixture
def http(server: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server, timeout=20) as client:
        yield client


def submit(http: httpx.Client, tokens: Tokens, who: str, workflow: dict[str, Any]) -> str:
    sent = http.post("/v1/workflows", content=as_yaml(workflow), headers=YAML | tokens.header(who))
    assert sent.status_code == 202, sent.text
    location: str = sent.headers["location"]
    return location


def unauthorized(response: httpx.Response, *, invalid: bool = True) -> str:
    body = problem(response, 401)
    assert body["type"] == "urn:dagq:problem:unauthorized"
    challenge = response.headers["www-authenticate"]
    assert challenge.startswith('Bearer realm="dagq"')
    assert ('error="invalid_token"' in challenge) == invalid
    detail: str = body["detail"]
    return detail


# --- 401 ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/workflows"),
        ("GET", "/v1/workflows/anything"),
        ("GET", "/v1/workflows/anything/stream"),
        ("POST", "/v1/workflows"),
        ("POST", "/v1/workflows/anything/cancel"),
        ("POST", "/v1/graph"),
    ],
)
def test_without_a_token_every_route_is_401(http: httpx.Client, method: str, path: str) -> None:
    detail = unauthorized(http.request(method, path), invalid=False)
    assert "requires a token" in detail


def test_probes_and_the_api_document_need_no_token(http: httpx.Client) -> None:
    assert http.get("/healthz").status_code == 200
    assert http.get("/readyz").status_code == 200
    document = http.get("/openapi.json").json()
    assert document["components"]["securitySchemes"]["token"]["scheme"] == "bearer"
    listing = document["paths"]["/v1/workflows"]["get"]
    assert {"401", "403"} <= set(listing["responses"]) and listing["security"]
    assert "security" not in document["paths"]["/healthz"]["get"]


@pytest.mark.parametrize(
    "header",
    [
        "Bearer dagq_0123456789ab_not-a-secret",
        "Bearer nonsense",
        "Basic cm9vdDpyb290",
        "Bearer",
    ],
)
def test_a_bad_token_is_401(http: httpx.Client, header: str) -> None:
    unauthorized(http.get("/v1/workflows", headers={"authorization": header}))


def test_a_token_with_a_wrong_secret_is_401(http: httpx.Client, tokens: Tokens) -> None:
    right = tokens.secrets["root"]
    wrong = right[:-1] + ("A" if right[-1] != "A" else "B")
    unauthorized(http.get("/v1/workflows", headers={"authorization": f"Bearer {wrong}"}))


def test_an_expired_token_is_401(http: httpx.Client, tokens: Tokens) -> None:
    tokens.make("brief", "--role", "viewer", "--expires", "2s")
    first = http.get("/v1/workflows", headers=tokens.header("brief"))
    if first.status_code == 200:  # used within its two seconds; wait for its end
        wait_until(
            lambda: http.get("/v1/workflows", headers=tokens.header("brief")).status_code == 401,
            timeout_s=10,
            what="the token to expire",
            interval_s=0.1,
        )
    detail = unauthorized(http.get("/v1/workflows", headers=tokens.header("brief")))
    assert detail == f"the token {tokens.ids['brief']} is expired"


def test_a_revoked_token_is_401_within_the_cache_bound(
    cli: DagqCli, http: httpx.Client, tokens: Tokens
) -> None:
    tokens.make("leaver", "--role", "viewer")
    assert http.get("/v1/workflows", headers=tokens.header("leaver")).status_code == 200
    done = cli.run("token", "revoke", tokens.ids["leaver"], "--store", cli.store_url)
    assert done.code == 0, done.output
    assert done.stdout.strip() == f"revoked token {tokens.ids['leaver']} (leaver)"
    wait_until(
        lambda: http.get("/v1/workflows", headers=tokens.header("leaver")).status_code == 401,
        timeout_s=10,  # the cache keeps a record 5 s
        what="the revoked token to be refused",
        interval_s=0.1,
    )
    detail = unauthorized(http.get("/v1/workflows", headers=tokens.header("leaver")))
    assert detail == f"the token {tokens.ids['leaver']} is revoked"


def test_an_open_stream_ends_once_its_token_is_revoked(
    cli: DagqCli, server: str, http: httpx.Client, tokens: Tokens
) -> None:
    tokens.make("streamer", "--role", "viewer")
    gated = submit(http, tokens, "ops", GATED)
    wait_for_status(http_as(http, tokens, "ops"), f"{gated}/tasks/gate", "waiting")
    seen: list[str] = []
    with (
        httpx.Client(base_url=server, timeout=30) as watcher,
        watcher.stream("GET", f"{gated}/stream", headers=tokens.header("streamer")) as stream,
    ):
        assert stream.status_code == 200
        lines = stream.iter_lines()
        for line in lines:  # the history so far, up to the wait
            seen.append(line)
            if line.startswith("data: ") and '"waiting"' in line:
                break
        done = cli.run("token", "revoke", tokens.ids["streamer"], "--store", cli.store_url)
        assert done.code == 0, done.output
        wait_until(  # the server's cache now knows
            lambda: http.get(gated, headers=tokens.header("streamer")).status_code == 401,
            timeout_s=10,
            what="the revoked token to be refused",
            interval_s=0.1,
        )
        http.post(f"{gated}/signals/go", headers=tokens.header("ops"))  # more events come
        after = [line for line in lines if line and not line.startswith(":")]  # no pings
    # nothing more leaked: the stream says why it ends, and ends
    assert after == ["event: unauthorized", f"data: the token {tokens.ids['streamer']} is revoked"]
    wait_for_end(http, gated)


# --- 403 ------------------------------------------------------------------------------


def test_a_viewer_reads_but_may_not_act(http: httpx.Client, tokens: Tokens) -> None:
    location = submit(http, tokens, "ops", GATED)
    workflow_id = location.rsplit("/", 1)[-1]
    viewer = tokens.header("watcher")
    for path in ("", "/tasks", "/events", "/graph"):
        assert http.get(location + path, headers=viewer).status_code == 200, path
    refused = {
        "submit": http.post("/v1/workflows", content=as_yaml(PIPELINE), headers=YAML | viewer),
        "cancel": http.post(f"/v1/workflows/{workflow_id}/cancel", headers=viewer),
        "retry": http.post(f"/v1/workflows/{workflow_id}/retry", headers=viewer),
        "signal": http.post(f"/v1/workflows/{workflow_id}/signals/go", headers=viewer),
    }
    for what, response in refused.items():
        body = problem(response, 403)
        assert body["type"] == "urn:dagq:problem:forbidden", what
        assert body["detail"].startswith(f"viewer 'token:watcher:{tokens.ids['watcher']}' may not")
        assert body["detail"].endswith("(it takes the operator role)"), what
    # the operator may: the run goes on
    sent = http.post(f"/v1/workflows/{workflow_id}/signals/go", headers=tokens.header("ops"))
    assert sent.status_code == 202, sent.text
    assert wait_for_end(http_as(http, tokens, "ops"), location)["status"] == "completed"


def http_as(http: httpx.Client, tokens: Tokens, who: str) -> httpx.Client:
    http.headers.update(tokens.header(who))
    return http


def test_a_403_is_not_recorded_under_its_idempotency_key(
    http: httpx.Client, tokens: Tokens
) -> None:
    key = {"idempotency-key": '"access-403-then-202"'}
    body = as_yaml(PIPELINE)
    refused = http.post(
        "/v1/workflows", content=body, headers=YAML | key | tokens.header("watcher")
    )
    problem(refused, 403)
    sent = http.post("/v1/workflows", content=body, headers=YAML | key | tokens.header("ops"))
    assert sent.status_code == 202, sent.text


def test_admins_manage_tokens_over_http_within_their_tenant(
    http: httpx.Client, tokens: Tokens
) -> None:
    for role in ("watcher", "ops"):
        problem(http.get("/v1/tokens", headers=tokens.header(role)), 403)
    root = tokens.header("root")
    listed = http.get("/v1/tokens", headers=root)
    assert listed.status_code == 200
    assert {"root", "alice", "bob"} <= {t["name"] for t in listed.json()["items"]}
    for secret in tokens.secrets.values():
        assert secret not in listed.text
    assert "digest" not in listed.text

    wanted = {"role": "viewer", "tenant": "tenant-a", "expires": "1h", "name": "over-http"}
    made = http.post("/v1/tokens", json=wanted, headers=root)
    assert made.status_code == 201, made.text
    token, info = made.json()["token"], made.json()["info"]
    assert info["created_by"] == f"token:root:{tokens.ids['root']}" and info["status"] == "active"
    seen = http.get("/v1/workflows", headers={"authorization": f"Bearer {token}"})
    assert seen.status_code == 200 and {r["tenant"] for r in seen.json()["items"]} <= {"tenant-a"}

    tokens.make("a-admin", "--role", "admin", "--tenant", "tenant-a")
    scoped = tokens.header("a-admin")
    own = {t["name"] for t in http.get("/v1/tokens", headers=scoped).json()["items"]}
    assert own == {"alice", "over-http", "a-admin"}
    other = {"role": "viewer", "tenant": "tenant-b"}
    problem(http.post("/v1/tokens", json=other, headers=scoped), 403)
    problem(http.post(f"/v1/tokens/{tokens.ids['bob']}/revoke", headers=scoped), 404)
    revoked = http.post(f"/v1/tokens/{info['id']}/revoke", headers=scoped)
    assert revoked.status_code == 200 and revoked.json()["status"] == "revoked"
    body = problem(http.post("/v1/tokens", json={"role": "root"}, headers=root), 422)
    assert "role 'root' is not one of viewer, operator, admin" in body["detail"]


# --- tenants --------------------------------------------------------------------------


def test_a_tenant_sees_none_of_another_tenants_runs(http: httpx.Client, tokens: Tokens) -> None:
    theirs = submit(http, tokens, "bob", GATED)
    ours = submit(http, tokens, "alice", PIPELINE)
    their_id = theirs.rsplit("/", 1)[-1]
    alice = tokens.header("alice")
    for path in ("", "/tasks", "/tasks/gate", "/tasks/first/output", "/events", "/graph"):
        body = problem(http.get(theirs + path, headers=alice), 404)
        assert their_id in body["detail"], path
    for action in ("cancel", "retry", "signals/go"):
        problem(http.post(f"{theirs}/{action}", headers=alice), 404)
    problem(http.get(f"{theirs}/stream", headers=alice), 404)

    listed = http.get("/v1/workflows", params={"limit": 500}, headers=alice).json()["items"]
    assert ours.rsplit("/", 1)[-1] in {row["id"] for row in listed}
    assert {row["tenant"] for row in listed} == {"tenant-a"}
    by_name = http.get("/v1/workflows", params={"name": GATED["name"]}, headers=alice).json()
    assert their_id not in {row["id"] for row in by_name["items"]}

    # bob sees his, and an unscoped admin sees both tenants
    assert http.get(theirs, headers=tokens.header("bob")).status_code == 200
    everyone = http.get("/v1/workflows", params={"limit": 500}, headers=tokens.header("root"))
    assert {"tenant-a", "tenant-b"} <= {row["tenant"] for row in everyone.json()["items"]}
    http.post(f"{theirs}/signals/go", headers=tokens.header("bob"))


def test_counts_by_status_cover_the_callers_tenant_and_the_filters_asked_for(
    http: httpx.Client, tokens: Tokens, cli: DagqCli
) -> None:
    async def seed(store: Store) -> None:
        now = time.time()
        for i, (status, tenant) in enumerate(
            [("completed", "tenant-a")] * 3 + [("failed", "tenant-a"), ("failed", "tenant-b")]
        ):
            labels = {"batch": "one"} if i % 2 == 0 else {}
            await store.index.upsert(
                IndexRow(
                    id=f"counted-{i}",
                    name="counted",
                    status=status,
                    tenant=tenant,
                    created_at=now - 100 + i,
                    updated_at=now,
                    data={"labels": labels},
                )
            )

    cli.with_store(seed)
    params: dict[str, Any] = {"name": "counted"}
    alice = http.get("/v1/workflows/counts", params=params, headers=tokens.header("alice"))
    assert alice.json() == {"counts": {"completed": 3, "failed": 1}, "total": 4}
    root = http.get("/v1/workflows/counts", params=params, headers=tokens.header("root")).json()
    assert root == {"counts": {"completed": 3, "failed": 2}, "total": 5}
    root_header = tokens.header("root")
    with_label = {**params, "label": "batch=one"}
    labelled = http.get("/v1/workflows/counts", params=with_label, headers=root_header).json()
    assert labelled["counts"] == {"completed": 2, "failed": 1}  # counted-0, -2 and -4
    other = {**params, "tenant": "tenant-b"}
    none = http.get("/v1/workflows/counts", params=other, headers=tokens.header("alice")).json()
    assert none == {"counts": {}, "total": 0}
    bad = {**params, "created_after": "yesterday"}
    problem(http.get("/v1/workflows/counts", params=bad, headers=tokens.header("root")), 422)
    unauthorized(http.get("/v1/workflows/counts"), invalid=False)


def test_a_tenant_streams_its_own_runs_only(http: httpx.Client, tokens: Tokens) -> None:
    ours = submit(http, tokens, "alice", PIPELINE)
    alice = tokens.header("alice")
    assert wait_for_end(http_as(http, tokens, "alice"), ours)["status"] == "completed"
    kinds = []
    with http.stream("GET", f"{ours}/stream", headers=alice) as stream:
        assert stream.status_code == 200
        for line in stream.iter_lines():
            if line.startswith("event: end"):
                break
            if line.startswith("data: "):
                kinds.append(json.loads(line[6:])["kind"])
    assert kinds[0] == "submitted" and kinds[-1] == "workflow_completed"


def test_a_tenant_may_not_submit_into_another(http: httpx.Client, tokens: Tokens) -> None:
    envelope = {"definition": PIPELINE, "tenant": "tenant-b"}
    body = problem(http.post("/v1/workflows", json=envelope, headers=tokens.header("alice")), 403)
    assert "tenant 'tenant-a' may not submit into another tenant" in body["detail"]
    own = {"definition": PIPELINE, "tenant": "tenant-a"}
    assert http.post("/v1/workflows", json=own, headers=tokens.header("alice")).status_code == 202


def test_an_unscoped_token_submits_into_the_tenant_it_names(
    http: httpx.Client, tokens: Tokens
) -> None:
    envelope = {"definition": PIPELINE, "tenant": "tenant-b"}
    sent = http.post("/v1/workflows", json=envelope, headers=tokens.header("ops"))
    assert sent.status_code == 202, sent.text
    location = sent.headers["location"]
    assert http.get(location, headers=tokens.header("bob")).status_code == 200
    problem(http.get(location, headers=tokens.header("alice")), 404)
    bad = {"definition": PIPELINE, "tenant": "no spaces"}
    body = problem(http.post("/v1/workflows", json=bad, headers=tokens.header("ops")), 422)
    assert "tenant 'no spaces' is not valid" in body["detail"]


# --- audit ----------------------------------------------------------------------------


def actors(http: httpx.Client, location: str, headers: dict[str, str]) -> dict[str, str | None]:
    events = http.get(f"{location}/events", headers=headers).json()
    return {e["kind"]: e["actor"] for e in events if e["kind"] != "dispatched"}


def test_every_action_is_in_the_history_with_who_did_it(
    cli: DagqCli, http: httpx.Client, tokens: Tokens
) -> None:
    ops = tokens.header("ops")
    ops_actor = f"token:ops:{tokens.ids['ops']}"
    gated = submit(http, tokens, "ops", GATED)
    wait_for_status(http_as(http, tokens, "ops"), f"{gated}/tasks/gate", "waiting")
    http.post(f"{gated}/signals/go", json={"ok": True}, headers=ops)
    wait_for_end(http, gated)
    seen = actors(http, gated, ops)
    assert seen["submitted"] == ops_actor and seen["signal"] == ops_actor
    assert seen["completed"] is None  # what the run did by itself has no actor

    slow = submit(http, tokens, "root", SLOW)
    wait_for_status(http, f"{slow}/tasks/nap", "running")
    http.post(f"{slow}/cancel", json={"reason": "not needed"}, headers=ops)
    assert wait_for_end(http, slow)["status"] == "cancelled"
    seen = actors(http, slow, ops)
    assert seen["submitted"] == f"token:root:{tokens.ids['root']}"
    assert seen["cancel_requested"] == ops_actor

    failing = submit(http, tokens, "ops", FAILING)
    assert wait_for_end(http, failing)["status"] == "failed"
    assert http.post(f"{failing}/retry", headers=ops).status_code == 202
    wait_until(
        lambda: "retry_requested" in actors(http, failing, ops),
        timeout_s=20,
        what="the retry in the history",
    )
    assert actors(http, failing, ops)["retry_requested"] == ops_actor
    wait_for_end(http, failing)

    # the CLI shows the same, and acts as the OS user
    failing_id = failing.rsplit("/", 1)[-1]
    done = cli.run("retry", failing_id, "--store", cli.store_url)
    assert done.code == 0, done.output
    events = cli.json("events", failing_id)
    requested = [e["actor"] for e in events if e["kind"] == "retry_requested"]
    assert requested == [ops_actor, f"cli:{getpass.getuser()}"]
    table = cli.run("events", failing_id, "--store", cli.store_url)
    assert table.stdout.splitlines()[0].split("\t")[-1] == "by"
    assert ops_actor in table.stdout
    explained = cli.json("explain", failing_id, "boom")
    assert ops_actor in {e["actor"] for e in explained["events"]}


# --- the CLI --------------------------------------------------------------------------


def test_token_list_shows_every_token_and_never_a_secret(cli: DagqCli, tokens: Tokens) -> None:
    listed = cli.json("token", "list", "--store", cli.store_url)
    by_name = {t["name"]: t for t in listed}
    assert by_name["alice"]["tenant"] == "tenant-a" and by_name["alice"]["role"] == "operator"
    assert by_name["root"]["status"] == "active"
    assert by_name["root"]["created_by"] == f"cli:{getpass.getuser()}"
    table = cli.run("token", "list", "--store", cli.store_url)
    assert table.code == 0
    assert table.stdout.splitlines()[0].split("\t") == [
        "id",
        "name",
        "role",
        "tenant",
        "status",
        "created",
        "by",
        "expires",
    ]
    for secret in tokens.secrets.values():
        assert secret not in table.stdout and secret not in json.dumps(listed)
        # The random part after "dagq_<id>_" (it may itself hold "_" or "-").
        assert secret.split("_", 2)[2] not in table.stdout


def test_token_create_json_holds_the_token_once(cli: DagqCli) -> None:
    made = cli.json("token", "create", "--role", "viewer", "--store", cli.store_url)
    assert made["token"].startswith(f"dagq_{made['info']['id']}_")
    assert made["info"]["name"] == made["info"]["id"] and made["info"]["expires_at"] is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--role", "root"), "error: role 'root' is not one of viewer, operator, admin"),
        (
            ("--role", "viewer", "--expires", "soon"),
            "error: --expires: duration 'soon' is not valid: use a number and a unit "
            "(w, d, h, m, s), e.g. 90d, 12h, 30m or 1d12h",
        ),
        (("--role", "viewer", "--tenant", "a/b"), "error: tenant 'a/b' is not valid"),
        ((), "error: missing option '--role'"),
    ],
)
def test_bad_token_input_is_one_line_and_exit_2(
    cli: DagqCli, args: tuple[str, ...], message: str
) -> None:
    done = cli.run("token", "create", *args, "--store", cli.store_url)
    assert done.code == 2, done.output
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(message), line
    assert done.stdout == ""


def test_revoking_an_unknown_token_is_one_line(cli: DagqCli) -> None:
    done = cli.run("token", "revoke", "feedfeedfeed", "--store", cli.store_url)
    assert done.code == 2
    assert done.stderr.strip() == ("error: no token with id 'feedfeedfeed' (see 'dagq token list')")


# --- when tokens are required -----------------------------------------------------------


def test_a_non_loopback_host_requires_tokens(cli: DagqCli, tokens: Tokens) -> None:
    started, url = start_server(cli, host="0.0.0.0")
    try:
        assert "dagq server: tokens required (0.0.0.0 is not loopback)" in started.stderr()
        unauthorized(httpx.get(f"{url}/v1/workflows", timeout=10), invalid=False)
        answer = httpx.get(f"{url}/v1/workflows", headers=tokens.header("watcher"), timeout=10)
        assert answer.status_code == 200
    finally:
        assert started.stop(signal.SIGTERM, timeout_s=20).code == 0


def test_loopback_without_auth_says_so_and_still_checks_a_token_sent(
    cli: DagqCli, tokens: Tokens
) -> None:
    started, url = start_server(cli)
    try:
        lines = [ln for ln in started.stderr().splitlines() if ln.startswith("dagq server:")]
        assert lines == [
            "dagq server: no token required on 127.0.0.1 (loopback only): every local "
            "caller acts as admin; --auth requires tokens"
        ]
        assert httpx.get(f"{url}/v1/workflows", timeout=10).status_code == 200
        bad = {"authorization": "Bearer dagq_0123456789ab_nope"}
        unauthorized(httpx.get(f"{url}/v1/workflows", headers=bad, timeout=10))
        scoped = httpx.get(f"{url}/v1/workflows", headers=tokens.header("alice"), timeout=10)
        assert {row["tenant"] for row in scoped.json()["items"]} <= {"tenant-a"}
    finally:
        assert started.stop(signal.SIGTERM, timeout_s=20).code == 0


def test_a_host_that_is_not_an_address_is_one_line(cli: DagqCli) -> None:
    done = cli.run("server", "--host", "example.invalid", "--store", cli.store_url)
    assert done.code == 2
    assert done.stderr.strip().splitlines() == [
        "error: --host 'example.invalid' is not an IP address; use 127.0.0.1, ::1, localhost, "
        "or an address of this machine (0.0.0.0 for all of them)"
    ]


def test_a_bulk_action_is_in_each_runs_history_with_who_asked(
    http: httpx.Client, tokens: Tokens
) -> None:
    alice = tokens.header("alice")
    body = {"definition": GATED, "labels": {"batch": "access-bulk"}}
    sent = http.post("/v1/workflows", json=body, headers=alice)
    assert sent.status_code == 202, sent.text
    location = sent.headers["location"]
    wait_for_status(http_as(http, tokens, "alice"), f"{location}/tasks/gate", "waiting")

    done = http.post(
        "/v1/workflows/cancel",
        json={"label": "batch=access-bulk", "dry_run": False},
        headers=alice,
    )

    assert done.json()["matched"] == 1, done.text
    assert wait_for_end(http, location)["status"] == "cancelled"
    assert actors(http, location, alice)["cancel_requested"] == f"token:alice:{tokens.ids['alice']}"


def test_dead_letters_take_an_admin_of_no_tenant(http: httpx.Client, tokens: Tokens) -> None:
    tokens.make("tenant-admin", "--role", "admin", "--tenant", "tenant-a")

    refused = http.get("/v1/dead-letters", headers=tokens.header("tenant-admin"))
    replay = http.post(
        "/v1/dead-letters/replay", json={"keys": []}, headers=tokens.header("tenant-admin")
    )

    assert "bound to tenant 'tenant-a'" in problem(refused, 403)["detail"]
    problem(replay, 403)
    assert http.get("/v1/dead-letters", headers=tokens.header("root")).status_code == 200


def test_the_stream_of_every_run_ends_once_its_token_is_revoked(
    cli: DagqCli, server: str, http: httpx.Client, tokens: Tokens
) -> None:
    tokens.make("all-streamer", "--role", "viewer")
    with (
        httpx.Client(base_url=server, timeout=30) as watcher,
        watcher.stream("GET", "/v1/stream", headers=tokens.header("all-streamer")) as stream,
    ):
        assert stream.status_code == 200
        lines = stream.iter_lines()
        submit(http, tokens, "ops", PIPELINE)  # a change it sees
        for line in lines:
            if line.startswith("data: "):
                break
        done = cli.run("token", "revoke", tokens.ids["all-streamer"], "--store", cli.store_url)
        assert done.code == 0, done.output
        wait_until(
            lambda: (
                http.get("/v1/workflows", headers=tokens.header("all-streamer")).status_code == 401
            ),
            timeout_s=10,
            what="the revoked token to be refused",
            interval_s=0.1,
        )
        submit(http, tokens, "ops", PIPELINE)  # more changes come
        after = [line for line in lines if line.startswith("event:")]
    assert after[-1] == "event: unauthorized"
    assert "event: workflow" not in after[after.index("event: unauthorized") :]
