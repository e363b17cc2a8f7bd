"""The layout version of an azure store's index, and its migration.

The index table holds a **layout marker** (partition ``meta``, RowKey ``layout``,
property ``version``) naming how its rows are laid out (docs/architecture.md, "The
azure index"):

* layout 1 (no marker): a row entity per workflow in partition
  ``s:{status}:{shard}``, its pointer alone in partition ``w:{id}`` (RowKey ``w``);
* layout 2 (:data:`LAYOUT`): row and pointer share the shard partition ``x:{shard}``
  (:mod:`.azure_index`).

Opening a store reads the marker once (:func:`check_layout`, run by the service when
its clients are first built). A store without one is looked at more closely: one
holding layout-1 rows is refused until ``dagq store migrate`` converts them
(:func:`migrate_azure_store`); any other gets the marker. A store of a newer layout is
refused: an older dagq would not see its rows.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import Any

from azure.core.exceptions import AzureError, ResourceNotFoundError
from azure.data.tables import UpdateMode

from dagq.errors import StoreUnavailable
from dagq.stores.azure_auth import parse_azure_url, resolve_auth
from dagq.stores.azure_index import AzureIndex, key_text, row_key, row_of, shard
from dagq.stores.azure_service import AzureService, Clients
from dagq.stores.base import IndexRow

#: The index layout this dagq reads and writes.
LAYOUT = 2
_META, _MARKER = "meta", "layout"
#: Layout 1's partitions: row entities "s:{status}:{shard}", pointers "w:{id}".
_OLD_ROWS = "PartitionKey ge 's:' and PartitionKey lt 's;'"
_OLD_POINTERS = "PartitionKey ge 'w:' and PartitionKey lt 'w;'"
_POINTER_ROW = "w"
#: Old workflows converted at once (their new rows go in one upsert_many).
_CONVERT_BATCH = 100


def migrate_hint(url: str) -> str:
    return f"run 'dagq store migrate --store {url}'"


async def check_layout(service: AzureService, clients: Clients) -> None:
    """Refuse a store whose index this dagq cannot read; mark a store without rows.

    One read when the marker is there (every store this dagq has written to)."""
    version = await read_layout(service, clients)
    if version == LAYOUT:
        return
    if version is not None:
        raise _newer(service, version)
    if await _has_old_rows(service, clients):
        raise StoreUnavailable(
            f"azure store {service.url} holds index rows of an older layout that this dagq "
            f"does not read; {migrate_hint(service.url)}"
        )
    if service.create:  # a command that only looks writes nothing
        await _write_marker(service, clients)


async def read_layout(service: AzureService, clients: Clients) -> int | None:
    """The layout the marker records (None: no marker, or no table yet)."""
    service.transactions["table.get"] += 1
    try:
        entity = await clients.table.get_entity(_META, _MARKER, select=["version"])
    except ResourceNotFoundError:
        return None
    except AzureError as exc:
        raise service.unavailable("table.get", exc) from exc
    return int(entity["version"])


def _newer(service: AzureService, version: int) -> StoreUnavailable:
    return StoreUnavailable(
        f"azure store {service.url} has index layout {version}, newer than this dagq's "
        f"{LAYOUT}; upgrade dagq to use it"
    )


async def _has_old_rows(service: AzureService, clients: Clients) -> bool:
    for query in (_OLD_POINTERS, _OLD_ROWS):
        async for _ in _entities(service, clients, query, select=["PartitionKey"], per_page=1):
            return True
    return False


async def _entities(
    service: AzureService,
    clients: Clients,
    query: str,
    *,
    select: list[str] | None = None,
    per_page: int = 1000,
) -> AsyncIterator[Any]:
    """The entities matching ``query`` (a page is one counted transaction; an empty
    page with a continuation goes on, as a filtered scan may return one)."""
    pages = clients.table.query_entities(query, select=select, results_per_page=per_page)
    try:
        async for page in pages.by_page():
            service.transactions["table.query"] += 1
            async for entity in page:
                yield entity
    except ResourceNotFoundError:  # no table: no rows
        return
    except AzureError as exc:
        raise service.unavailable("table.query", exc) from exc


async def _write_marker(service: AzureService, clients: Clients) -> None:
    service.transactions["table.upsert"] += 1
    entity = {"PartitionKey": _META, "RowKey": _MARKER, "version": LAYOUT}
    try:
        await clients.table.upsert_entity(entity, mode=UpdateMode.REPLACE)
    except AzureError as exc:
        raise service.unavailable("table.upsert", exc) from exc


async def migrate_azure_store(url: str) -> tuple[int | None, int]:
    """Convert a store's layout-1 index rows to :data:`LAYOUT`, then mark it.

    The layout the marker recorded before (None: no marker) and how many workflows
    were converted.
    Idempotent and safe to interrupt: a workflow's new rows are written before its old
    ones are deleted, its old pointer last, and a workflow found converted already
    keeps its new rows. Stop every process of an older dagq first: one still running
    would go on writing old rows. A store of a newer layout is refused, unchanged.
    """
    target = parse_azure_url(url)
    service = AzureService(target, resolve_auth(target.account, os.environ), create=True)
    try:
        clients = await service.clients()
        before = await read_layout(service, clients)
        if before is not None and before > LAYOUT:
            raise _newer(service, before)
        converted = await _convert(service, clients)
        await _delete_stray_rows(service, clients)
        await _write_marker(service, clients)
        return before, converted
    finally:
        await service.close()


async def _convert(service: AzureService, clients: Clients) -> int:
    index = AzureIndex(service)
    converted = 0
    batch: list[dict[str, Any]] = []
    async for pointer in _entities(service, clients, _OLD_POINTERS):
        batch.append(dict(pointer))
        if len(batch) == _CONVERT_BATCH:
            converted += await _convert_batch(service, index, batch)
            batch = []
    if batch:
        converted += await _convert_batch(service, index, batch)
    return converted


async def _convert_batch(
    service: AzureService, index: AzureIndex, pointers: list[dict[str, Any]]
) -> int:
    rows: dict[str, IndexRow] = {}
    olds: list[tuple[str, str]] = []
    for pointer in pointers:
        workflow_id = str(pointer["id"])
        status, created_at = str(pointer["status"]), float(pointer["created_at"])
        old = (f"s:{key_text(status)}:{shard(workflow_id):02x}", row_key(created_at, workflow_id))
        olds.append(old)
        if await index.get(workflow_id) is not None:
            continue  # converted by a run that was interrupted before deleting the old rows
        # The old row entity is the freshest (a steady upsert wrote it alone); the
        # pointer, if it is gone.
        entity = await _read(service, *old)
        rows[workflow_id] = row_of(entity if entity is not None else pointer)
    if rows:
        await index.upsert_many(list(rows.values()))
    for pk, rk in olds:
        await _remove(service, pk, rk)
    for pointer in pointers:
        await _remove(service, str(pointer["PartitionKey"]), _POINTER_ROW)
    return len(rows)


async def _delete_stray_rows(service: AzureService, clients: Clients) -> None:
    """Old row entities no pointer named (left by a move a crash cut short)."""
    strays = [
        (str(e["PartitionKey"]), str(e["RowKey"]))
        async for e in _entities(service, clients, _OLD_ROWS, select=["PartitionKey", "RowKey"])
    ]
    for pk, rk in strays:
        await _remove(service, pk, rk)


async def _read(service: AzureService, pk: str, rk: str) -> dict[str, Any] | None:
    async def get(c: Clients) -> dict[str, Any]:
        return dict(await c.table.get_entity(pk, rk))

    try:
        return await service.call("table.get", get, expect=(ResourceNotFoundError,))
    except ResourceNotFoundError:
        return None


async def _remove(service: AzureService, pk: str, rk: str) -> None:
    async def remove(c: Clients) -> None:
        await c.table.delete_entity(pk, rk)  # a missing entity is not an error

    await service.call("table.delete", remove)


__all__ = ["LAYOUT", "check_layout", "migrate_azure_store", "migrate_hint", "read_layout"]
