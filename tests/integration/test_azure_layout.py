"""The azure index's layout marker and ``dagq store migrate`` for azure stores, on a
real Azurite: a store of layout-1 rows (written here with the table client, as the
dagq before the one-partition moves wrote them) is refused in one line, migrated by
the CLI, then listed and finished by a coordinator; a new store is marked; a store of
a newer layout is refused; a migration cut short is finished by running it again."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from azure.data.tables import UpdateMode

from dagq.errors import StoreUnavailable
from dagq.stores.azure import open_azure_store
from dagq.stores.azure_auth import parse_azure_url, resolve_auth
from dagq.stores.azure_index import AzureIndex, key_text, row_key, shard
from dagq.stores.azure_layout import LAYOUT, migrate_azure_store, read_layout
from dagq.stores.azure_service import AzureService, Clients
from dagq.stores.base import IndexRow
from dagq.stores.common import encode_row
from tests.azurite import Azurite
from tests.conftest import azure_prefix
from tests.integration.cli_harness import DagqCli

pytestmark = pytest.mark.timeout(180)

TASKS = """
def noop(**_):
    return {"ok": True}
"""


def _url() -> str:
    return f"azure://devstoreaccount1/{azure_prefix()}"


def _service(url: str) -> AzureService:
    """A connection to the store's table without the layout check (as the test's own
    table client)."""
    target = parse_azure_url(url)
    return AzureService(target, resolve_auth(target.account, {}), create=True)


async def _entities(service: AzureService, query: str) -> list[dict[str, Any]]:
    clients = await service.clients()
    return [dict(e) async for e in clients.table.query_entities(query)]


async def _upsert(clients: Clients, entity: dict[str, Any]) -> None:
    await clients.table.upsert_entity(entity, mode=UpdateMode.REPLACE)


async def _write_old(
    service: AzureService, row: IndexRow, *, pointer: IndexRow | None = None
) -> None:
    """``row`` as layout 1 stored it: a row entity in ``s:{status}:{shard}``, a pointer
    in ``w:{id}`` (with ``pointer``'s data, the row's by default: a steady upsert
    rewrote the row entity alone), the status in ``statuses``."""
    clients = await service.clients()
    properties = {
        "id": row.id,
        "name": row.name,
        "tenant": row.tenant,
        "updated_at": float(row.updated_at),
    }
    old = pointer or row
    await _upsert(
        clients,
        {
            "PartitionKey": f"s:{key_text(row.status)}:{shard(row.id):02x}",
            "RowKey": row_key(row.created_at, row.id),
            **properties,
            "r0": encode_row(row),
        },
    )
    await _upsert(
        clients,
        {
            "PartitionKey": f"w:{key_text(row.id)}",
            "RowKey": "w",
            "status": row.status,
            "created_at": row.created_at,
            **properties,
            "updated_at": float(old.updated_at),
            "r0": encode_row(old),
        },
    )
    entity = {"PartitionKey": "statuses", "RowKey": key_text(row.status), "status": row.status}
    await _upsert(clients, entity)


async def _to_old_layout(url: str) -> list[IndexRow]:
    """Rewrite a store's index in layout 1 and drop its marker; the rows."""
    service = _service(url)
    try:
        clients = await service.clients()
        entities = await _entities(service, "PartitionKey ge 'x:' and PartitionKey lt 'x;'")
        index = AzureIndex(service)
        rows = [
            r
            for r in [await index.get(e["id"]) for e in entities if e["RowKey"].startswith("w|")]
            if r
        ]
        for row in rows:
            await _write_old(service, row)
        for entity in entities:
            await clients.table.delete_entity(entity["PartitionKey"], entity["RowKey"])
        await clients.table.delete_entity("meta", "layout")
        return rows
    finally:
        await service.close()


def _row(workflow_id: str, status: str, created_at: float, updated_at: float) -> IndexRow:
    return IndexRow(
        id=workflow_id,
        name="flow",
        status=status,
        created_at=created_at,
        updated_at=updated_at,
    )


# --- end to end, through the CLI -------------------------------------------------------


@pytest.fixture
def cli(tmp_path: Path, azurite: Azurite) -> Iterator[DagqCli]:
    with DagqCli(tmp_path) as cli:
        cli.store_url = _url()
        (tmp_path / "layout_tasks.py").write_text(TASKS)
        yield cli


def test_an_old_layout_store_is_refused_then_migrated_listed_and_finished(cli: DagqCli) -> None:
    flow = cli.workflow(
        "flow.yaml",
        {"name": "flow", "tasks": [{"name": "only", "call": "layout_tasks:noop"}]},
    )
    for workflow_id in ("one", "two"):
        done = cli.run("submit", flow, "--id", workflow_id, timeout_s=60)
        assert done.code == 0, done.output
    rows = asyncio.run(_to_old_layout(cli.store_url))
    assert {row.id for row in rows} == {"one", "two"}

    refused = cli.run("list", timeout_s=60)
    assert refused.code == 2, refused.output
    [line] = refused.stderr.strip().splitlines()
    assert line.startswith(f"error: azure store {cli.store_url} ")
    assert line.endswith(f"run 'dagq store migrate --store {cli.store_url}'")
    coordinator = cli.run("coordinator", timeout_s=60)  # refused too, not retrying
    assert coordinator.code == 2, coordinator.output
    assert "dagq store migrate --store" in coordinator.stderr

    migrated = cli.run("store", "migrate", "--store", cli.store_url, timeout_s=60)
    assert migrated.code == 0, migrated.output
    assert f"migrated 2 workflow(s) from index layout 1 to {LAYOUT}" in migrated.stdout
    again = cli.run("store", "migrate", "--store", cli.store_url, timeout_s=60)
    assert again.code == 0, again.output
    assert f"index layout {LAYOUT}, up to date" in again.stdout

    listed = cli.json("list", timeout_s=60)
    assert {w["id"] for w in listed} == {"one", "two"}
    cli.start_coordinator(timeout_s=60)
    cli.start_worker("-q", "default", "--import-path", str(cli.workdir), timeout_s=60)
    assert cli.wait_for_end("one", timeout_s=90) == "completed"
    assert cli.wait_for_end("two", timeout_s=90) == "completed"


# --- the marker and the migration, through the library ---------------------------------


@pytest.fixture
async def url(azurite: Azurite) -> AsyncIterator[str]:
    yield _url()


async def _layout(url: str) -> int | None:
    service = _service(url)
    try:
        return await read_layout(service, await service.clients())
    finally:
        await service.close()


async def test_a_new_store_is_marked_at_first_use_and_read_once(url: str) -> None:
    store = open_azure_store(url, environ={})
    try:
        assert (await store.index.query()).rows == []
        await store.index.query()
        assert store.transactions is not None
        assert store.transactions["table.get"] == 1  # the marker, read once
    finally:
        await store.close()
    assert await _layout(url) == LAYOUT


async def test_a_command_that_only_looks_does_not_mark_a_store(url: str) -> None:
    created = open_azure_store(url, environ={})
    await created.documents.put("x", b"1")
    await created.close()
    service = _service(url)
    clients = await service.clients()
    await clients.table.delete_entity("meta", "layout")
    await service.close()
    looking = open_azure_store(url, create=False, environ={})
    try:
        assert (await looking.index.query()).rows == []
    finally:
        await looking.close()
    assert await _layout(url) is None


async def test_a_store_of_a_newer_layout_is_refused_and_left_alone(url: str) -> None:
    service = _service(url)
    clients = await service.clients()
    await _upsert(clients, {"PartitionKey": "meta", "RowKey": "layout", "version": LAYOUT + 1})
    await service.close()
    store = open_azure_store(url, environ={})
    try:
        with pytest.raises(StoreUnavailable, match=f"index layout {LAYOUT + 1}, newer .*upgrade"):
            await store.index.query()
    finally:
        await store.close()
    with pytest.raises(StoreUnavailable, match="upgrade dagq"):
        await migrate_azure_store(url)
    assert await _layout(url) == LAYOUT + 1


async def test_a_migration_cut_short_is_finished_by_running_it_again(url: str) -> None:
    service = _service(url)
    steady = _row("steady", "running", 10.0, 30.0)
    await _write_old(service, steady, pointer=_row("steady", "running", 10.0, 11.0))
    await _write_old(service, _row("done", "completed", 20.0, 25.0))
    # "half": converted already, its old row entity deleted, its (stale) pointer left.
    half = _row("half", "completed", 15.0, 40.0)
    await AzureIndex(service).upsert(half)
    await _write_old(service, half, pointer=_row("half", "running", 15.0, 16.0))
    clients = await service.clients()
    await clients.table.delete_entity(
        f"s:{key_text('completed')}:{shard('half'):02x}", row_key(15.0, "half")
    )
    # A stray row entity a move cut short left behind (no pointer names it).
    stray = _row("done", "running", 20.0, 21.0)
    await _upsert(
        clients,
        {
            "PartitionKey": f"s:running:{shard('done'):02x}",
            "RowKey": row_key(20.0, "done"),
            "id": "done",
            "r0": encode_row(stray),
        },
    )
    await service.close()

    store = open_azure_store(url, environ={})
    with pytest.raises(StoreUnavailable, match="dagq store migrate --store"):
        await store.index.query()
    await store.close()

    assert await migrate_azure_store(url) == (None, 2)  # "half" was done already
    assert await migrate_azure_store(url) == (LAYOUT, 0)

    store = open_azure_store(url, environ={})
    try:
        page = await store.index.query()
        assert [(r.id, r.status, r.updated_at) for r in page.rows] == [
            ("done", "completed", 25.0),
            ("half", "completed", 40.0),
            ("steady", "running", 30.0),
        ]
        assert (await store.index.get("steady")) == steady
        assert await store.index.count() == {"completed": 2, "running": 1}
    finally:
        await store.close()
    service = _service(url)
    try:
        left = await _entities(
            service,
            "(PartitionKey ge 's:' and PartitionKey lt 's;') or "
            "(PartitionKey ge 'w:' and PartitionKey lt 'w;')",
        )
        assert left == []
    finally:
        await service.close()
