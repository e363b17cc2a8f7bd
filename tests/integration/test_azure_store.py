"""What the azure backend does beyond the shared contract: URLs, sign-in, queue names,
message sizes, dead letters, the sharded index, transaction counts and lease limits.

Tests marked ``emulator`` run against Azurite (the ``azurite`` fixture starts it);
the others need no network.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
from azure.data.tables import TableTransactionError, UpdateMode

from dagq.errors import ConflictError, StoreUnavailable, ValidationError
from dagq.stores import azure_batch, open_store
from dagq.stores.azure import open_azure_store
from dagq.stores.azure_auth import AZURITE_KEY, parse_azure_url, resolve_auth
from dagq.stores.azure_index import SHARDS, AzureIndex, partition, shard
from dagq.stores.azure_messages import queue_name
from dagq.stores.base import MAX_MESSAGE_BYTES, IndexRow, OutgoingMessage, Store
from dagq.submission import submit
from tests.azurite import find_azurite
from tests.conftest import azure_prefix
from tests.helpers import definition

ACCOUNT_KEY = "a2V5"  # any base64 will do: nothing signs in


def azurite_url() -> str:
    return f"azure://devstoreaccount1/{azure_prefix()}"


@pytest.fixture
async def store(azurite: object) -> AsyncIterator[Store]:
    opened = open_azure_store(azurite_url(), max_deliveries=2, environ={})
    yield opened
    await opened.close()


# --- the emulator's launcher ---------------------------------------------------------


def test_without_azurite_installed_the_launcher_finds_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert find_azurite(tmp_path) is None


# --- URLs ---------------------------------------------------------------------------


def test_a_url_names_the_account_and_the_prefix() -> None:
    target = parse_azure_url("azure://myaccount/team-a")
    assert (target.account, target.prefix, target.url) == (
        "myaccount",
        "team-a",
        "azure://myaccount/team-a",
    )


def test_a_prefix_is_case_insensitive_as_azure_names_are() -> None:
    target = parse_azure_url("azure://devstoreaccount1/Tutorial")
    assert (target.prefix, target.url) == ("tutorial", "azure://devstoreaccount1/tutorial")


@pytest.mark.parametrize(
    ("url", "complaint"),
    [
        ("azure://devstoreaccount1/ab", "prefix 'ab'"),
        ("azure://devstoreaccount1/" + "a" * 25, "3-24"),
        ("azure://devstoreaccount1/Da.gq", "prefix 'Da.gq'"),
        ("azure://devstoreaccount1/da_gq", "prefix 'da_gq'"),
        ("azure://devstoreaccount1/-dagq", "starting and ending"),
        ("azure://devstoreaccount1/da--gq", "single hyphens"),
        ("azure://devstoreaccount1/dagq/more", "azure://ACCOUNT/PREFIX"),
        ("azure://devstoreaccount1", "prefix ''"),
        ("azure://My_Account/dagq", "account 'My_Account'"),
    ],
)
def test_a_bad_url_is_refused_naming_it_and_the_fault(url: str, complaint: str) -> None:
    with pytest.raises(ValidationError) as raised:
        open_store(url)
    assert repr(url) in str(raised.value)
    assert complaint in str(raised.value)


# --- signing in ---------------------------------------------------------------------


def test_a_connection_string_for_the_account_is_used() -> None:
    text = f"DefaultEndpointsProtocol=https;AccountName=prod;AccountKey={ACCOUNT_KEY};"
    auth = resolve_auth("prod", {"AZURE_STORAGE_CONNECTION_STRING": text})
    assert (auth.source, auth.key) == ("connection-string", ACCOUNT_KEY)
    assert auth.endpoints.queue == "https://prod.queue.core.windows.net"


def test_a_connection_string_may_name_its_endpoints_and_a_sas() -> None:
    text = (
        "BlobEndpoint=https://prod.blob.example.net;QueueEndpoint=https://prod.queue.example.net;"
        "TableEndpoint=https://prod.table.example.net;SharedAccessSignature=sv=2024&sig=x"
    )
    auth = resolve_auth("prod", {"AZURE_STORAGE_CONNECTION_STRING": text})
    assert (auth.source, auth.key, auth.sas) == ("connection-string", None, "sv=2024&sig=x")
    assert auth.endpoints.table == "https://prod.table.example.net"


def test_a_connection_string_for_another_account_is_ignored() -> None:
    text = f"AccountName=other;AccountKey={ACCOUNT_KEY}"
    auth = resolve_auth("prod", {"AZURE_STORAGE_CONNECTION_STRING": text})
    assert (auth.source, auth.key) == ("credential", None)


def test_the_emulator_account_uses_azurite_and_its_well_known_key() -> None:
    auth = resolve_auth("devstoreaccount1", {})
    assert (auth.source, auth.key) == ("azurite", AZURITE_KEY)
    assert auth.endpoints.blob == "http://127.0.0.1:10000/devstoreaccount1"
    assert auth.endpoints.queue == "http://127.0.0.1:10001/devstoreaccount1"
    assert auth.endpoints.table == "http://127.0.0.1:10002/devstoreaccount1"


def test_the_emulator_host_can_be_moved() -> None:
    auth = resolve_auth("devstoreaccount1", {"DAGQ_AZURITE_HOST": "azurite"})
    assert auth.endpoints.table == "http://azurite:10002/devstoreaccount1"


def test_an_emulator_connection_string_names_the_emulator_account() -> None:
    environ = {"AZURE_STORAGE_CONNECTION_STRING": "UseDevelopmentStorage=true"}
    assert resolve_auth("devstoreaccount1", environ).source == "connection-string"
    assert resolve_auth("prod", environ).source == "credential"


def test_any_other_account_signs_in_with_the_default_credential() -> None:
    auth = resolve_auth("prod", {})
    assert (auth.source, auth.key, auth.sas) == ("credential", None, None)
    assert auth.endpoints.blob == "https://prod.blob.core.windows.net"


async def test_opening_a_store_touches_no_network() -> None:
    store = open_azure_store("azure://prod/dagq", environ={})
    assert store.url == "azure://prod/dagq"
    assert store.transactions == {}
    await store.close()


def test_a_connection_string_without_a_key_or_sas_is_refused() -> None:
    with pytest.raises(ValidationError, match="neither AccountKey nor SharedAccessSignature"):
        resolve_auth("prod", {"AZURE_STORAGE_CONNECTION_STRING": "AccountName=prod"})


# --- queue names --------------------------------------------------------------------

AZURE_QUEUE_NAME = re.compile(r"^(?=.{3,63}$)[a-z0-9]+(?:-[a-z0-9]+)*$")


def test_queue_names_follow_azure_rules_and_never_collide() -> None:
    names = [
        "cpu",
        "gpu",
        "default",
        "_completions",
        "completions",
        "a_b",
        "a.b",
        "a-b",
        "A_B",
        "ab",
        "q",
        "Q",
        "__",
        "x" * 80,
        "x" * 81,
        "gpu.big",
        "gpu-big",
        "gpu_big",
        "GPU.BIG",
        "ünïcode",
    ]
    for prefix in ("dagq", "team-a", "a" * 24):
        mapped = [queue_name(prefix, name) for name in names]
        assert len(set(mapped)) == len(names)
        assert all(AZURE_QUEUE_NAME.match(m) for m in mapped), mapped
    assert queue_name("dagq", "cpu") == "dagq-q-cpu"
    assert queue_name("dagq", "_completions").startswith("dagq-q-completions-")


# --- queues on the emulator ---------------------------------------------------------


async def test_a_prefix_with_capitals_names_the_same_store_as_in_lowercase(
    azurite: object,
) -> None:
    prefix = azure_prefix()
    upper = open_azure_store(f"azure://devstoreaccount1/T{prefix}", environ={})
    lower = open_azure_store(f"azure://devstoreaccount1/t{prefix}", environ={})
    try:
        await upper.documents.put("definitions/x", b"data")
        await upper.queues.send("cpu", [OutgoingMessage(b"task", id="m1")])
        document = await lower.documents.get("definitions/x")
        assert document is not None and document.data == b"data"
        (message,) = await lower.queues.receive("cpu", max_messages=1, visibility_timeout_s=30)
        assert message.body == b"task"
    finally:
        await upper.close()
        await lower.close()


async def test_a_message_of_the_size_limit_with_a_long_id_round_trips(store: Store) -> None:
    body = random.Random(1).randbytes(MAX_MESSAGE_BYTES)  # incompressible, any byte
    message_id = "workflow-" + "x" * 200 + "/task/1"
    await store.queues.send("q", [OutgoingMessage(body, id=message_id)])
    [message] = await store.queues.receive("q", max_messages=1, visibility_timeout_s=30)
    assert (message.id, message.body) == (message_id, body)


async def test_a_delayed_message_is_announced_when_it_becomes_visible(store: Store) -> None:
    await store.queues.send("q", [OutgoingMessage(b"later", delay_s=1)])
    assert await store.queues.receive("q", max_messages=1, visibility_timeout_s=30) == []
    loop = asyncio.get_running_loop()
    began = loop.time()
    await store.queues.wait("q", 30)  # no poll: this process announces it when visible
    assert loop.time() - began < 10
    [message] = await store.queues.receive("q", max_messages=1, visibility_timeout_s=30)
    assert message.body == b"later"


async def test_a_receive_of_more_than_32_takes_several_pages(store: Store) -> None:
    await store.queues.send("q", [OutgoingMessage(str(i).encode()) for i in range(70)])
    messages = await store.queues.receive("q", max_messages=100, visibility_timeout_s=30)
    assert sorted(int(m.body) for m in messages) == list(range(70))
    assert store.transactions is not None and store.transactions["queue.receive"] >= 3


async def test_dead_letters_keep_their_reason_body_count_and_time(store: Store) -> None:
    await store.queues.send("work", [OutgoingMessage(b"poison", id="p")])
    await store.queues.send("work", [OutgoingMessage(b"garbage", id="g")])
    for message in await store.queues.receive("work", max_messages=2, visibility_timeout_s=1):
        if message.id == "g":
            await store.queues.dead_letter("work", message.receipt, "cannot be parsed")
    for _ in range(2):  # max_deliveries is 2: the third receive buries it
        await store.queues.receive("work", max_messages=2, visibility_timeout_s=1)
        await asyncio.sleep(1.5)
    assert await store.queues.receive("work", max_messages=2, visibility_timeout_s=1) == []
    dead = await store.queues.dead_letters("work")
    assert [(d.id, d.body, d.dequeue_count, d.reason) for d in dead] == [
        ("g", b"garbage", 1, "cannot be parsed"),
        ("p", b"poison", 2, "delivered 2 times without being deleted"),
    ]
    assert dead[0].dead_at < dead[1].dead_at
    assert await store.documents.list("") == []  # dead letters are not documents


async def test_a_message_that_is_not_dagqs_is_dead_lettered(store: Store) -> None:
    await store.queues.send("q", [OutgoingMessage(b"x")])  # creates the queue
    await store.queues.delete(
        "q",
        [
            m.receipt
            for m in await store.queues.receive("q", max_messages=1, visibility_timeout_s=30)
        ],
    )
    queues = store.queues
    name = queues.azure_name("q")  # type: ignore[attr-defined]
    service = queues._service  # type: ignore[attr-defined]
    await service.call(
        "queue.send", lambda c: service.queue_client(c, name).send_message("hello, world")
    )
    assert await store.queues.receive("q", max_messages=5, visibility_timeout_s=30) == []
    [dead] = await store.queues.dead_letters("q")
    assert dead.body == b"hello, world" and "not a dagq message" in dead.reason


# --- the index on the emulator ------------------------------------------------------


async def test_listing_by_status_pages_newest_first_across_every_shard(store: Store) -> None:
    rng = random.Random(7)
    rows = [
        IndexRow(
            id=f"wf-{i:04d}",
            name=rng.choice(["etl", "report"]),
            status=rng.choice(["running", "completed", "failed"]),
            created_at=float(rng.randrange(60)),  # many ties: ordered by id
            updated_at=0.0,
        )
        for i in range(300)
    ]
    assert {shard(row.id) for row in rows} == set(range(SHARDS))
    for start in range(0, len(rows), 50):
        batch = store.batch()
        for row in rows[start : start + 50]:
            batch.upsert(row)
        await batch.commit()

    def newest_first(selected: list[IndexRow]) -> list[str]:
        return [r.id for r in sorted(selected, key=lambda r: (r.created_at, r.id), reverse=True)]

    async def every_page(**filters: object) -> list[str]:
        seen: list[str] = []
        cursor: str | None = None
        while True:
            page = await store.index.query(limit=40, cursor=cursor, **filters)  # type: ignore[arg-type]
            assert len(page.rows) <= 40
            seen.extend(r.id for r in page.rows)
            if page.cursor is None:
                return seen
            cursor = page.cursor

    active = [r for r in rows if r.status in ("running", "failed")]
    assert await every_page(status=["running", "failed"]) == newest_first(active)
    assert await every_page() == newest_first(rows)
    etl = [r for r in rows if r.name == "etl" and r.status == "completed"]
    assert await every_page(status=["completed"], name="etl") == newest_first(etl)


async def test_a_status_change_moves_the_row(store: Store) -> None:
    row = IndexRow(id="w", name="n", status="running", created_at=1.0, updated_at=1.0)
    await store.index.upsert(row)
    moved = IndexRow(id="w", name="n", status="completed", created_at=1.0, updated_at=2.0)
    await store.index.upsert(moved)
    assert (await store.index.query(status=["running"])).rows == []
    assert (await store.index.query(status=["completed"])).rows == [moved]
    # Another process, with no cache, sees the same and moves it on.
    other = open_azure_store(store.url, environ={})
    try:
        assert await other.index.get("w") == moved
        back = IndexRow(id="w", name="n", status="running", created_at=1.0, updated_at=3.0)
        await other.index.upsert(back)
        assert (await other.index.query()).rows == [back]
    finally:
        await other.close()


async def test_a_steady_upsert_is_one_transaction(store: Store) -> None:
    row = IndexRow(id="w", name="n", status="running", created_at=1.0, updated_at=1.0)
    await store.index.upsert(row)
    assert store.transactions is not None
    before = store.transactions.copy()
    await store.index.upsert(
        IndexRow(id="w", name="n", status="running", created_at=1.0, updated_at=2.0)
    )
    assert store.transactions - before == {"table.upsert": 1}


async def test_a_new_workflows_submit_writes_its_row_without_reading_where_it_is(
    store: Store,
) -> None:
    assert store.transactions is not None
    await submit(store, definition([{"name": "a"}]), workflow_id="w")  # opens the store
    before = store.transactions.copy()
    await submit(store, definition([{"name": "a"}]), workflow_id="v")
    spent = store.transactions - before
    # definition, row and pointer (one transaction), state, wake-up: no pointer read
    assert spent == {"blob.put": 2, "table.batch": 1, "queue.send": 1}
    row = await store.index.get("v")
    assert row is not None and row.status == "pending"
    before = store.transactions.copy()
    await submit(store, definition([{"name": "a"}]), workflow_id="v")  # again: a no-op
    assert (store.transactions - before)["table.get"] >= 1  # looked, wrote no row
    assert "table.batch" not in store.transactions - before


async def test_a_status_move_is_one_transaction(store: Store) -> None:
    await store.index.upsert(
        IndexRow(id="v", name="n", status="completed", created_at=1.0, updated_at=1.0)
    )
    row = IndexRow(id="w", name="n", status="running", created_at=1.0, updated_at=1.0)
    await store.index.upsert(row)
    assert store.transactions is not None
    before = store.transactions.copy()
    moved = IndexRow(id="w", name="n", status="completed", created_at=1.0, updated_at=2.0)
    await store.index.upsert(moved)
    assert store.transactions - before == {"table.batch": 1}  # row, pointer, old row's delete
    assert (await store.index.query(status=["running"])).rows == []
    assert await store.index.get("w") == moved


async def test_a_batch_moves_the_rows_of_one_shard_in_one_transaction(store: Store) -> None:
    ids = [f"wf-{i}" for i in range(400) if shard(f"wf-{i}") == 3][:12]
    await store.index.upsert(
        IndexRow(id="v", name="n", status="completed", created_at=-1.0, updated_at=1.0)
    )
    batch = store.batch()
    for n, workflow_id in enumerate(ids):
        batch.upsert(
            IndexRow(
                id=workflow_id, name="n", status="running", created_at=float(n), updated_at=1.0
            )
        )
    await batch.commit()
    assert store.transactions is not None
    before = store.transactions.copy()
    batch = store.batch()
    for n, workflow_id in enumerate(ids):
        batch.upsert(
            IndexRow(
                id=workflow_id, name="n", status="completed", created_at=float(n), updated_at=1.0
            )
        )
    await batch.commit()
    assert store.transactions - before == {"table.batch": 1}
    assert (await store.index.query(status=["running"])).rows == []
    listed = [row.id for row in (await store.index.query(status=["completed"])).rows]
    assert listed == [*reversed(ids), "v"]  # newest first


async def moved_by_another_process(store: Store) -> None:
    """Row "w" moved to "cancelling" by another process's store."""
    other = open_azure_store(store.url, environ={})
    try:
        await other.index.upsert(
            IndexRow(id="w", name="n", status="cancelling", created_at=1.0, updated_at=1.0)
        )
    finally:
        await other.close()


async def test_a_row_another_process_moved_is_moved_on_from_where_it_is(store: Store) -> None:
    await store.index.upsert(
        IndexRow(id="w", name="n", status="running", created_at=1.0, updated_at=1.0)
    )
    await moved_by_another_process(store)  # this store still thinks the row is "running"
    failed = IndexRow(id="w", name="n", status="failed", created_at=1.0, updated_at=3.0)
    await store.index.upsert(failed)
    assert (await store.index.query()).rows == [failed]
    assert await store.index.count() == {"failed": 1}


async def test_a_transaction_is_sent_once_and_one_that_fails_is_read_by_the_sdk(
    store: Store,
) -> None:
    """A row another process moved: the transaction (its delete fails) writes nothing
    and is sent again through the SDK's ``submit_transaction``, whose
    TableTransactionError makes the index look where the row is."""
    assert isinstance(store.index, AzureIndex) and store.transactions is not None
    service = store.index._service
    await store.index.upsert(
        IndexRow(id="w", name="n", status="running", created_at=1.0, updated_at=1.0)
    )
    clients = await service.clients()
    replace = {"mode": UpdateMode.REPLACE}
    pk = partition(0)
    written = [
        ("upsert", {"PartitionKey": pk, "RowKey": f"t{i}", "v": i}, replace) for i in range(3)
    ]
    assert await azure_batch.submit(clients.table, written)  # one request, all three
    failing = [
        ("upsert", {"PartitionKey": pk, "RowKey": "t9", "v": 9}, replace),
        ("delete", {"PartitionKey": pk, "RowKey": "t8"}, {}),
    ]
    assert not await azure_batch.submit(clients.table, failing)
    found = {
        e["RowKey"]
        async for e in clients.table.query_entities("PartitionKey eq @pk", parameters={"pk": pk})
    }
    assert {"t0", "t1", "t2"} <= found and "t9" not in found  # nothing of the failed one
    with pytest.raises(TableTransactionError):
        await clients.table.submit_transaction(failing)

    await moved_by_another_process(store)  # this store still thinks the row is "running"
    before = store.transactions.copy()
    failed = IndexRow(id="w", name="n", status="failed", created_at=1.0, updated_at=3.0)
    await store.index.upsert(failed)
    # the move sent (its delete failed), sent again by the SDK, the pointer read, moved
    # (and the new status's entity written)
    assert store.transactions - before == {"table.batch": 3, "table.get": 1, "table.upsert": 1}
    assert (await store.index.query()).rows == [failed]


# --- batches, counts, leases, existence ---------------------------------------------


async def test_a_stale_condition_stops_a_batch_before_its_documents(store: Store) -> None:
    stale = await store.documents.put("states/a", b"1")
    await store.documents.put("states/a", b"2")
    batch = store.batch()
    batch.put("history/a/1", b"h")
    batch.put("states/a", b"3", if_match=stale)
    batch.put("history/b/1", b"h")  # would be written in the first phase
    batch.put("states/b", b"1", if_none_match=True)
    with pytest.raises(ConflictError, match="states/a"):
        await batch.commit()
    assert await store.documents.list("history/") == []


async def test_a_condition_this_process_wrote_is_not_checked_again(store: Store) -> None:
    etag = await store.documents.put("states/a", b"1")
    assert store.transactions is not None
    before = store.transactions.copy()
    batch = store.batch()
    batch.put("states/a", b"2", if_match=etag)
    batch.put("history/b/1", b"h")
    await batch.commit()
    assert store.transactions - before == {"blob.put": 2}  # no HEAD


async def test_a_condition_another_process_made_stale_still_fails_the_put(
    store: Store,
) -> None:
    etag = await store.documents.put("states/a", b"1")
    other = open_azure_store(store.url, environ={})
    try:
        await other.documents.put("states/a", b"elsewhere")
    finally:
        await other.close()
    batch = store.batch()
    batch.put("states/a", b"2", if_match=etag)
    batch.put("history/b/1", b"h")
    with pytest.raises(ConflictError, match="states/a"):
        await batch.commit()
    assert (await store.documents.get("states/a")).data == b"elsewhere"  # type: ignore[union-attr]
    before = store.transactions.copy() if store.transactions is not None else None
    batch.put("states/a", b"3", if_match=etag)  # known stale now: checked, nothing written
    batch.put("history/c/1", b"h")
    with pytest.raises(ConflictError):
        await batch.commit()
    assert await store.documents.get("history/c/1") is None
    assert before is not None and store.transactions is not None
    assert (store.transactions - before)["blob.head"] == 1


async def test_transactions_are_counted_by_kind(store: Store) -> None:
    counts = store.transactions
    assert counts is not None
    await store.documents.put("a", b"1")
    assert counts["container.create"] == counts["table.create"] == 1  # on first use
    await store.queues.send("q", [OutgoingMessage(b"0")])
    assert counts["queue.create"] == 1
    row = IndexRow(id="w", name="n", status="running", created_at=1, updated_at=1)
    await store.index.upsert(row)
    before = counts.copy()
    await store.documents.put("a", b"2")
    await store.documents.get("a")
    await store.queues.send("q", [OutgoingMessage(b"1"), OutgoingMessage(b"2")])
    received = await store.queues.receive("q", max_messages=5, visibility_timeout_s=30)
    await store.queues.delete("q", [m.receipt for m in received])
    await store.index.upsert(row)
    assert counts - before == {
        "blob.put": 1,
        "blob.get": 1,
        "queue.send": 2,
        "queue.receive": 1,
        "queue.delete": 3,
        "table.upsert": 1,
    }


@pytest.mark.parametrize("ttl", [5, 14.5, 61, 120])
async def test_a_lease_ttl_outside_azures_range_is_refused(store: Store, ttl: float) -> None:
    with pytest.raises(ValidationError, match="outside 15-60 seconds"):
        await store.leases.acquire("coordinator", "host-1", ttl)


async def test_a_lease_held_elsewhere_names_its_holder(store: Store) -> None:
    await store.leases.acquire("coordinator", f"host-1:{os.getpid()}:x", 30)
    other = open_azure_store(store.url, environ={})
    try:
        with pytest.raises(Exception, match=f"held by host-1:{os.getpid()}:x"):
            await other.leases.acquire("coordinator", "host-2", 30)
    finally:
        await other.close()


async def test_a_prefix_never_created_is_refused_when_only_looking(azurite: object) -> None:
    store = open_azure_store(azurite_url(), create=False, environ={})
    try:
        with pytest.raises(StoreUnavailable, match="no dagq store at azure://devstoreaccount1/"):
            await store.documents.get("a")
    finally:
        await store.close()


async def test_rows_that_stay_in_their_partition_go_in_one_transaction_per_partition(
    store: Store,
) -> None:
    ids = [f"w{i}" for i in range(40)]
    rows = [IndexRow(id=i, name="n", status="running", created_at=1.0, updated_at=1.0) for i in ids]
    batch = store.batch()
    for row in rows:
        batch.upsert(row)
    await batch.commit()  # new rows: each placed on its own
    assert store.transactions is not None
    before = store.transactions.copy()
    later = [msgspec.structs.replace(r, updated_at=2.0, data={"n": 1}) for r in rows]
    batch = store.batch()
    for row in later:
        batch.upsert(row)
    await batch.commit()
    per_shard = Counter(shard(i) for i in ids)
    assert store.transactions - before == {  # a partition of one row: a plain upsert
        "table.batch": sum(n > 1 for n in per_shard.values()),
        "table.upsert": sum(n == 1 for n in per_shard.values()),
    }
    assert (await store.index.query(status=["running"], limit=100)).rows == sorted(
        later, key=lambda r: r.id, reverse=True
    )
    assert await store.index.get("w7") == later[7]
