"""Dead letters of the azure backend, as blobs beside the store's documents.

Azure Queue Storage has no dead-letter queue, and a second queue would not do: its
peek shows at most 32 messages and no reasons. Each dead letter is one blob,
``dead-letters/{azure queue}/{time in ms}-{random}``, holding the id, body, delivery
count, reason and time; names sort oldest first, so listing is one ``list_blobs``.
A dead letter's key is its blob name without the ``dead-letters/`` folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Sequence

import msgspec
from azure.core.exceptions import ResourceNotFoundError

from dagq.stores.azure_service import AzureService, Clients
from dagq.stores.base import DeadLetter
from dagq.stores.common import new_token

DEAD_LETTERS = "dead-letters/"
#: What a key looks like: nothing else is ever deleted by ``remove``.
_KEY = re.compile(r"[a-z0-9-]{3,63}/[0-9]{15}-[0-9a-f]{16}")


class _Record(msgspec.Struct, array_like=True):
    id: str
    body: bytes
    dequeue_count: int
    reason: str
    dead_at: float
    queue: str = ""  # the dagq name (absent in records written before it was kept)


class DeadLetterBlobs:
    """Writes and lists the dead letters of every queue of one store."""

    def __init__(self, service: AzureService) -> None:
        self._service = service

    async def add(self, azure_queue: str, dead: DeadLetter) -> None:
        """Store one dead letter (its ``queue`` is the dagq name; the blob path uses
        the Azure name, which is unique and safe in a path)."""
        name = f"{DEAD_LETTERS}{azure_queue}/{round(dead.dead_at * 1000):015d}-{new_token()}"
        record = _Record(
            dead.id, dead.body, dead.dequeue_count, dead.reason, dead.dead_at, dead.queue
        )
        data = msgspec.msgpack.encode(record)

        async def upload(c: Clients) -> None:
            await c.container.upload_blob(name, data, overwrite=True)

        await self._service.call("blob.put", upload)

    async def list(
        self, queue: str | None, azure_queue: str | None, limit: int
    ) -> list[DeadLetter]:
        """The oldest ``limit`` dead letters of a queue (None: of every queue)."""
        names: list[str] = []
        if limit == 0:
            return []
        folder = DEAD_LETTERS if azure_queue is None else f"{DEAD_LETTERS}{azure_queue}/"
        pages = self._service.pages(
            "blob.list",
            lambda c: c.container.list_blobs(
                name_starts_with=folder, results_per_page=min(limit, 5000)
            ),
        )
        async with contextlib.aclosing(pages):
            async for page in pages:
                names.extend(str(blob.name) for blob in page)
                if azure_queue is not None and len(names) >= limit:
                    break  # one queue's names come oldest first; all queues' do not
        names = sorted(names, key=lambda name: name.rsplit("/", 1)[-1])[:limit]
        records = await asyncio.gather(*(self._read(name) for name in names))
        return [
            DeadLetter(
                queue or r.queue or self._dagq_name(name[len(DEAD_LETTERS) :].split("/")[0]),
                r.id,
                r.body,
                r.dequeue_count,
                r.reason,
                r.dead_at,
                key=name[len(DEAD_LETTERS) :],
            )
            for name, r in zip(names, records, strict=True)
            if r is not None
        ]

    async def one(self, key: str) -> DeadLetter | None:
        """The dead letter with this key (one download), if there is one."""
        if not _KEY.fullmatch(key):
            return None
        record = await self._read(DEAD_LETTERS + key)
        if record is None:
            return None
        queue = record.queue or self._dagq_name(key.split("/", maxsplit=1)[0])
        return DeadLetter(
            queue,
            record.id,
            record.body,
            record.dequeue_count,
            record.reason,
            record.dead_at,
            key=key,
        )

    def _dagq_name(self, azure_queue: str) -> str:
        """The dagq queue of an Azure queue name, for records that did not keep it
        (a hashed name cannot be mapped back: it is kept as it is)."""
        head = f"{self._service.target.prefix}-q-"
        plain = azure_queue.removeprefix(head)
        return plain if plain != azure_queue and plain.isalnum() else azure_queue

    async def remove(self, keys: Sequence[str]) -> int:
        """Delete dead letters by key; how many were there."""

        async def remove_one(key: str) -> bool:
            if not _KEY.fullmatch(key):
                return False
            try:
                await self._service.call(
                    "blob.delete",
                    lambda c: c.container.delete_blob(DEAD_LETTERS + key),
                    expect=(ResourceNotFoundError,),
                )
            except ResourceNotFoundError:
                return False
            return True

        return sum(await asyncio.gather(*(remove_one(k) for k in dict.fromkeys(keys))))

    async def _read(self, name: str) -> _Record | None:
        async def download(c: Clients) -> bytes:
            stream = await c.container.download_blob(name)
            return bytes(await stream.readall())

        try:
            data = await self._service.call("blob.get", download, expect=(ResourceNotFoundError,))
        except ResourceNotFoundError:  # removed since the listing
            return None
        return msgspec.msgpack.decode(data, type=_Record)
