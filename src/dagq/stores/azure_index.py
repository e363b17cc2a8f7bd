"""The index in Azure Table Storage: one table per store prefix.

Listing by status must stay fast with 100,000 workflows, so rows are kept where a
listing reads them in order. Every workflow's entities live in one of 16 shard
partitions ``x:{shard}`` (by a hash of the id, so no partition runs hot):

* a **row entity** per workflow, RowKey ``r|{status}|`` then the inverted
  ``created_at`` and inverted id: a status reads newest first within a shard, as
  ``query`` answers (created_at DESC, id DESC, like sqlite). A page is a k-way merge
  of the shards (of every status asked for), each read a small page at a time only as
  far as the merge needs; the cursor is the last row's (created_at, id), as on every
  backend.
* a **pointer entity** per workflow (RowKey ``w|{id}``, same partition) naming its
  status and created_at, written only when they change. A move (the new row entity,
  the pointer, the old row entity's delete) is one entity group transaction, since
  the three share a partition. An in-process cache of where each row is saves reading
  the pointer before every upsert, so a steady upsert is one transaction.
* a **status entity** per status ever used (partition ``statuses``), so a query
  without a status filter knows which statuses to read.

The rows of one batch are written together: one entity group transaction per shard
partition (up to 100 entities), moves and steady rows alike, so a coordinator batch
touching many workflows pays per shard, not per row (:meth:`AzureIndex.upsert_many`).

Row entities carry ``updated_at`` as a property, so ``changed`` (what changed since a
moment, for the server's stream) is one filtered query over the row entities.
"""

from __future__ import annotations

import asyncio
import hashlib
import heapq
import re
import struct
from collections import defaultdict, deque
from collections.abc import Mapping, Sequence
from typing import Any

from azure.core.exceptions import ResourceNotFoundError, ServiceRequestError
from azure.data.tables import TableTransactionError, UpdateMode

from dagq.errors import ValidationError
from dagq.stores import azure_batch
from dagq.stores.azure_service import AzureService, Clients
from dagq.stores.base import IndexPage, IndexRow
from dagq.stores.changes import INDEX_TOPIC, ChangeFeed
from dagq.stores.common import (
    check_page_size,
    check_statuses,
    decode_cursor,
    decode_row,
    encode_cursor,
    encode_row,
    has_labels,
)

SHARDS = 16
_STATUSES = "statuses"
_CHUNK = 60_000  # bytes per binary property (Azure's limit is 64 KiB)
_MAX_CHUNKS = 15
#: An entity group transaction holds at most 100 entities and 4 MiB.
_GROUP_ROWS = 100
_GROUP_BYTES = 3 * 1024 * 1024
#: Tries of an entity group transaction whose connection failed (not sent or reset).
_SEND_ATTEMPTS = 4
_SAFE = re.compile(r"^[A-Za-z0-9_.\-]+\Z")
_Where = tuple[str, float]  # (status, created_at): where a row entity is
#: RowKeys of row entities start "r|", of pointers "w|"; "}" sorts right after "|".
_ROWS_LOW, _ROWS_HIGH = "r|", "r}"
_SHARDS_LOW, _SHARDS_HIGH = "x:", "x;"
#: One operation of an entity group transaction: (kind, entity, options).
_Operation = tuple[str, dict[str, Any], dict[str, Any]]


def key_text(text: str) -> str:
    """``text`` as allowed in a PartitionKey or RowKey (no / \\ # ? or controls)."""
    return text if _SAFE.match(text) else "~" + text.encode().hex()


def shard(workflow_id: str) -> int:
    """The shard of a workflow's entities (stable across processes)."""
    return hashlib.blake2b(workflow_id.encode(), digest_size=2).digest()[0] % SHARDS


def partition(shard_number: int) -> str:
    """The partition of one shard's row and pointer entities."""
    return f"x:{shard_number:02x}"


def status_prefix(status: str) -> str:
    """The start of the RowKeys of the row entities with ``status``."""
    return f"r|{key_text(status)}|"


def row_key(created_at: float, workflow_id: str) -> str:
    """The part of a row entity's RowKey that sorts newest first, then by id descending."""
    (bits,) = struct.unpack(">Q", struct.pack(">d", created_at))
    ordered = bits ^ 0xFFFFFFFFFFFFFFFF if bits >> 63 else bits | 1 << 63  # floats → uints
    inverted_id = bytes(255 - b for b in workflow_id.encode()).hex()
    # '~' sorts after every hex digit: an id that is a prefix of another comes later.
    return f"{ordered ^ 0xFFFFFFFFFFFFFFFF:016x}-{inverted_id}~"


def _row_at(where: _Where, workflow_id: str) -> tuple[str, str]:
    """(PartitionKey, RowKey) of a workflow's row entity with this status and created_at."""
    return partition(shard(workflow_id)), status_prefix(where[0]) + row_key(where[1], workflow_id)


def _pointer(workflow_id: str) -> tuple[str, str]:
    return partition(shard(workflow_id)), f"w|{key_text(workflow_id)}"


def _row_properties(row: IndexRow) -> dict[str, Any]:
    data = encode_row(row)
    chunks = [data[i : i + _CHUNK] for i in range(0, len(data), _CHUNK)] or [b""]
    if len(chunks) > _MAX_CHUNKS:
        raise ValidationError(
            f"index row {row.id!r} is {len(data)} bytes encoded, over the "
            f"{_CHUNK * _MAX_CHUNKS}-byte limit of an Azure table entity; keep its data small"
        )
    properties: dict[str, Any] = {
        "id": row.id,
        "name": row.name,
        "tenant": row.tenant,
        "updated_at": float(row.updated_at),
    }
    properties.update({f"r{i}": chunk for i, chunk in enumerate(chunks)})
    return properties


def row_of(entity: Any) -> IndexRow:
    chunks = []
    for i in range(_MAX_CHUNKS):
        chunk = entity.get(f"r{i}")
        if chunk is None:
            break
        chunks.append(bytes(chunk))
    return decode_row(b"".join(chunks))


def _writes(row: IndexRow, where: _Where | None) -> list[_Operation]:
    """The operations that put ``row`` where it belongs, its row entity having been at
    ``where``: the row entity alone if it stays; else also the pointer and the old
    row entity's delete (all in the workflow's shard partition)."""
    pk, rk = _row_at((row.status, row.created_at), row.id)
    properties = _row_properties(row)
    replace = {"mode": UpdateMode.REPLACE}
    operations: list[_Operation] = [
        ("upsert", {"PartitionKey": pk, "RowKey": rk, **properties}, replace)
    ]
    if where == (row.status, row.created_at):
        return operations
    _, pointer = _pointer(row.id)
    entity = {"PartitionKey": pk, "RowKey": pointer, "status": row.status}
    operations.append(("upsert", {**entity, "created_at": row.created_at, **properties}, replace))
    if where is not None:
        _, old = _row_at(where, row.id)
        operations.append(("delete", {"PartitionKey": pk, "RowKey": old}, {}))
    return operations


def _size(operations: list[_Operation]) -> int:
    return sum(
        sum(len(v) for v in entity.values() if isinstance(v, bytes | str)) + 512
        for _, entity, _ in operations
    )


class _ShardReader:
    """The matching rows of one partition, in RowKey order, fetched a page at a time
    (each keyed by its RowKey without the status prefix, to merge across statuses)."""

    def __init__(
        self, service: AzureService, query: str, parameters: dict[str, Any], page_size: int
    ) -> None:
        self.rows: deque[tuple[str, IndexRow]] = deque()
        self._pages = service.pages(
            "table.query",
            lambda c: c.table.query_entities(
                query, parameters=parameters, results_per_page=page_size
            ),
        )
        self._done = False

    async def fill(self) -> None:
        """Fetch pages until a row is buffered or the partition has no more."""
        while not self.rows and not self._done:
            try:
                page = await anext(self._pages)
            except StopAsyncIteration:
                self._done = True
                return
            self.rows.extend((str(e["RowKey"]).rsplit("|", 1)[1], row_of(e)) for e in page)

    async def close(self) -> None:
        """Stop the listing (its generator holds an open pager)."""
        await self._pages.aclose()


async def _merge(readers: list[_ShardReader], count: int) -> list[IndexRow]:
    """The first ``count`` rows of all readers in RowKey order (a lazy k-way merge)."""
    await asyncio.gather(*(reader.fill() for reader in readers))
    heap = [(reader.rows[0][0], i) for i, reader in enumerate(readers) if reader.rows]
    heapq.heapify(heap)
    merged: list[IndexRow] = []
    while heap and len(merged) < count:
        _, i = heapq.heappop(heap)
        reader = readers[i]
        merged.append(reader.rows.popleft()[1])
        if not reader.rows:
            await reader.fill()  # this shard's next page, only when its rows are used up
        if reader.rows:
            heapq.heappush(heap, (reader.rows[0][0], i))
    return merged


class AzureIndex:
    """Index rows in Table Storage, sharded for fast listing by status."""

    def __init__(self, service: AzureService, changes: ChangeFeed | None = None) -> None:
        self._service = service
        self._where: dict[str, _Where | None] = {}
        self._statuses: set[str] = set()
        self._changes = changes

    async def upsert(self, row: IndexRow) -> None:
        await self.upsert_many([row])

    async def create(self, row: IndexRow) -> None:
        """Write the row of a workflow known to have none (a submit that created its
        definition): its row and pointer in one transaction, no pointer read first."""
        self._where[row.id] = None
        await self.upsert_many([row])

    async def upsert_many(self, rows: Sequence[IndexRow]) -> None:
        """Upsert rows of distinct workflows: one entity group transaction per shard
        partition (and per 100 entities), a move's three operations always together."""
        unknown = [row.id for row in rows if row.id not in self._where]
        await asyncio.gather(*(self._locate(workflow_id) for workflow_id in unknown))
        await asyncio.gather(*(self._register(s) for s in {row.status for row in rows}))
        groups: dict[str, list[list[IndexRow]]] = defaultdict(lambda: [[]])
        planned: dict[str, list[_Operation]] = {}
        counts: dict[str, int] = defaultdict(int)
        sizes: dict[str, int] = defaultdict(int)
        for row in rows:
            operations = planned[row.id] = _writes(row, self._where[row.id])
            pk = partition(shard(row.id))
            size = _size(operations)
            full = counts[pk] + len(operations) > _GROUP_ROWS or sizes[pk] + size > _GROUP_BYTES
            if full and groups[pk][-1]:
                groups[pk].append([])
                counts[pk] = sizes[pk] = 0
            groups[pk][-1].append(row)
            counts[pk] += len(operations)
            sizes[pk] += size
        await asyncio.gather(
            *(
                self._write_group(group, planned)
                for chunks in groups.values()
                for group in chunks
                if group
            )
        )
        if self._changes is not None:  # this process's streams only: the feed polls
            self._changes.notify([INDEX_TOPIC])

    async def _write_group(
        self, rows: list[IndexRow], planned: Mapping[str, list[_Operation]]
    ) -> None:
        operations = [operation for row in rows for operation in planned[row.id]]
        try:
            await self._submit(operations)
        except TableTransactionError:
            # A row entity was not where this process thought (another process moved
            # it): nothing was written; each row again, from its pointer.
            for row in rows:
                await self._locate(row.id)
                try:
                    await self._submit(_writes(row, self._where[row.id]))
                except TableTransactionError as exc:  # moved again meanwhile
                    raise self._service.unavailable("table.batch", exc) from exc
                self._where[row.id] = (row.status, row.created_at)
            return
        for row in rows:
            self._where[row.id] = (row.status, row.created_at)

    async def get(self, workflow_id: str) -> IndexRow | None:
        pk, pointer_key = _pointer(workflow_id)
        for _ in range(2):  # a move may happen between the two reads: look again
            pointer = await self._read(pk, pointer_key)
            if pointer is None:
                self._where[workflow_id] = None
                return None
            where = (str(pointer["status"]), float(pointer["created_at"]))
            self._where[workflow_id] = where
            entity = await self._read(*_row_at(where, workflow_id))
            if entity is not None:
                return row_of(entity)
        return row_of(pointer)

    async def query(
        self,
        *,
        status: Sequence[str] | None = None,
        name: str | None = None,
        tenant: str | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> IndexPage:
        check_page_size(limit)
        check_statuses(status)
        after = decode_cursor(cursor) if cursor is not None else None
        statuses = list(dict.fromkeys(status)) if status is not None else await self._known()
        conditions = ["PartitionKey eq @pk", "RowKey gt @low", "RowKey lt @high"]
        parameters: dict[str, Any] = {}
        for field, value in (("name", name), ("tenant", tenant)):
            if value is not None:
                conditions.append(f"{field} eq @{field}")
                parameters[field] = value
        query = " and ".join(conditions)

        def bounds(s: str) -> dict[str, str]:
            prefix = status_prefix(s)
            low = prefix + row_key(*after) if after is not None else prefix
            return {"low": low, "high": prefix[:-1] + "}"}

        # Each shard is read newest first, a page at a time, only as far as the merge
        # needs: about limit/SHARDS rows each, not limit rows from every shard.
        page_size = min(1000, max(8, (limit + 1) * 3 // (2 * SHARDS) + 1))
        readers = [
            _ShardReader(
                self._service,
                query,
                {**parameters, **bounds(s), "pk": partition(n)},
                page_size,
            )
            for s in statuses
            for n in range(SHARDS)
        ]
        try:
            rows = await _merge(readers, limit + 1)
        finally:
            for reader in readers:
                await reader.close()
        if len(rows) > limit:
            return IndexPage(rows[:limit], encode_cursor(rows[limit - 1]))
        return IndexPage(rows)

    async def changed(self, after: float, *, limit: int = 100) -> list[IndexRow]:
        check_page_size(limit)
        # Row entities only (RowKeys "r|..."; pointers are "w|...").
        query = (
            "PartitionKey ge @pk_low and PartitionKey lt @pk_high and RowKey ge @low "
            "and RowKey lt @high and updated_at gt @after"
        )
        parameters = {
            "pk_low": _SHARDS_LOW,
            "pk_high": _SHARDS_HIGH,
            "low": _ROWS_LOW,
            "high": _ROWS_HIGH,
            "after": float(after),
        }
        pages = self._service.pages(
            "table.query",
            lambda c: c.table.query_entities(query, parameters=parameters),
        )
        found: dict[str, IndexRow] = {}
        async for page in pages:
            for entity in page:
                row = row_of(entity)
                if row.id not in found or found[row.id].updated_at < row.updated_at:
                    found[row.id] = row
        return sorted(found.values(), key=lambda row: (row.updated_at, row.id))[:limit]

    async def count(
        self,
        *,
        name: str | None = None,
        tenant: str | None = None,
        labels: Mapping[str, str] | None = None,
        created_after: float | None = None,
        created_before: float | None = None,
    ) -> dict[str, int]:
        # One query per status over the shard partitions; the created range is a
        # RowKey range (after the status, RowKeys go on with the inverted created_at).
        # Without labels the entities come back as their RowKey alone (a projection).
        conditions = [
            "PartitionKey ge @pk_low",
            "PartitionKey lt @pk_high",
            "RowKey gt @low",
            "RowKey lt @high",
        ]
        parameters: dict[str, Any] = {"pk_low": _SHARDS_LOW, "pk_high": _SHARDS_HIGH}
        for field, value in (("name", name), ("tenant", tenant)):
            if value is not None:
                conditions.append(f"{field} eq @{field}")
                parameters[field] = value
        select = [f"r{i}" for i in range(_MAX_CHUNKS)] if labels else ["RowKey"]
        counts: dict[str, int] = {}
        for status in await self._known():
            prefix = status_prefix(status)
            low, high = prefix, prefix[:-1] + "}"
            if created_before is not None:  # older: a greater RowKey
                low = prefix + row_key(created_before, "")[:16] + "~"
            if created_after is not None:
                high = prefix + row_key(created_after, "")[:16] + "~"
            found = await self._count(
                " and ".join(conditions), {**parameters, "low": low, "high": high}, select, labels
            )
            if found:
                counts[status] = found
        return counts

    async def _count(
        self,
        query: str,
        parameters: dict[str, Any],
        select: list[str],
        labels: Mapping[str, str] | None,
    ) -> int:
        pages = self._service.pages(
            "table.query",
            lambda c: c.table.query_entities(query, parameters=parameters, select=select),
        )
        count = 0
        async for page in pages:
            for entity in page:
                count += 1 if not labels or has_labels(row_of(entity), labels) else 0
        return count

    async def delete(self, workflow_id: str) -> bool:
        where = self._where.get(workflow_id) or await self._locate(workflow_id)
        self._where.pop(workflow_id, None)
        if where is None:
            return False
        await self._remove(*_row_at(where, workflow_id))
        await self._remove(*_pointer(workflow_id))
        return True

    # --- storage calls -------------------------------------------------------------

    async def _locate(self, workflow_id: str) -> _Where | None:
        pointer = await self._read(*_pointer(workflow_id), select=["status", "created_at"])
        where = None if pointer is None else (str(pointer["status"]), float(pointer["created_at"]))
        self._where[workflow_id] = where
        return where

    async def _known(self) -> list[str]:
        """Every status a row was ever written with (for queries without a status)."""
        statuses: list[str] = []
        pages = self._service.pages(
            "table.query",
            lambda c: c.table.query_entities(
                "PartitionKey eq @pk", parameters={"pk": _STATUSES}, select=["status"]
            ),
        )
        async for page in pages:
            statuses.extend(str(entity["status"]) for entity in page)
        self._statuses.update(statuses)
        return statuses

    async def _register(self, status: str) -> None:
        if status not in self._statuses:
            entity = {"PartitionKey": _STATUSES, "RowKey": key_text(status), "status": status}
            await self._put(entity)
            self._statuses.add(status)

    async def _put(self, entity: dict[str, Any]) -> None:
        async def upsert(c: Clients) -> None:
            await c.table.upsert_entity(entity, mode=UpdateMode.REPLACE)

        await self._service.call("table.upsert", upsert)

    async def _submit(self, operations: list[_Operation]) -> None:
        """One entity group transaction (one entity upsert: a plain request).
        A failed delete raises TableTransactionError, nothing written."""
        if len(operations) == 1 and operations[0][0] == "upsert":
            await self._put(operations[0][1])
            return

        async def lean(c: Clients) -> bool:
            return await azure_batch.submit(c.table, operations)

        async def submit(c: Clients) -> None:
            await c.table.submit_transaction(operations)

        expected = (ServiceRequestError, TableTransactionError)
        for attempt in range(_SEND_ATTEMPTS):
            try:
                # Built and read without the email package; what that cannot read as a
                # success (nothing written then) goes again through the SDK's own call,
                # which raises what the transaction met.
                if not await self._service.call("table.batch", lean, expect=expected):
                    await self._service.call("table.batch", submit, expect=expected)
                return
            except ServiceRequestError as exc:
                # A kept-alive connection the service had closed or reset (the SDK does
                # not send a transaction's body twice): again. Applied already, the
                # upserts change nothing and a delete fails: the caller looks again.
                if attempt + 1 == _SEND_ATTEMPTS:
                    raise self._service.unavailable("table.batch", exc) from exc
                await asyncio.sleep(0.05 * 2**attempt)

    async def _read(
        self, pk: str, rk: str, *, select: list[str] | None = None
    ) -> dict[str, Any] | None:
        async def get(c: Clients) -> dict[str, Any]:
            return dict(await c.table.get_entity(pk, rk, select=select))

        try:
            return await self._service.call("table.get", get, expect=(ResourceNotFoundError,))
        except ResourceNotFoundError:
            return None

    async def _remove(self, pk: str, rk: str) -> None:
        async def remove(c: Clients) -> None:
            await c.table.delete_entity(pk, rk)  # a missing entity is not an error

        await self._service.call("table.delete", remove)
