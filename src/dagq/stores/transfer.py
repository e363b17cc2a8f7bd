"""Copying a whole store to another backend (``dagq store copy SRC DST``).

The path from the embedded SQLite file to a shared PostgreSQL when one machine is not
enough. Done while nothing runs: the source must have no coordinator holding its lease
and the destination must be empty. What is copied, through the four primitives:

* every document (definitions, states and their parts, history, outputs, logs,
  worker records), with its bytes unchanged;
* every index row;
* dead letters: each is sent to its queue in the destination, received and
  dead-lettered again with its reason (its delivery count starts again at 1);
* pending messages, read without receiving them where the source can
  (:class:`PendingReader`: sqlite and postgres); a message that was hidden (taken by
  a worker that is gone) is copied visible, its delivery count starting again.

Dead letters go before the pending messages, so each is received alone from a queue
that is still empty.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import msgspec

from dagq import keys
from dagq.errors import UsageError
from dagq.stores.base import OutgoingMessage, Store

#: Documents and rows per round trip.
PAGE = 500
#: Dead letters read at once (the contract lists them, oldest first, up to a limit).
MAX_DEAD_LETTERS = 1_000_000


class PendingMessage(msgspec.Struct, frozen=True):
    """A queued message as stored, read without being received."""

    queue: str
    id: str
    body: bytes


@runtime_checkable
class PendingReader(Protocol):
    """Queues that can list what they hold without receiving it."""

    async def pending(self, *, after: int, limit: int) -> list[tuple[int, PendingMessage]]:
        """Up to ``limit`` messages of every queue after position ``after``, in order."""
        ...


class CopyReport(msgspec.Struct):
    """How much was copied."""

    documents: int = 0
    index_rows: int = 0
    messages: int = 0
    dead_letters: int = 0


async def copy_store(source: Store, destination: Store) -> CopyReport:
    """Copy everything in ``source`` into the empty ``destination``."""
    await _check(source, destination)
    report = CopyReport()
    report.documents = await _copy_documents(source, destination)
    report.index_rows = await _copy_index(source, destination)
    report.dead_letters = await _copy_dead_letters(source, destination)
    report.messages = await _copy_messages(source, destination)
    return report


async def _check(source: Store, destination: Store) -> None:
    holder = await source.leases.get(keys.COORDINATOR_LEASE)
    if holder is not None:
        raise UsageError(
            f"a coordinator ({holder.owner}) is running on {source.url}; stop it (and the "
            "workers) before copying the store"
        )
    if not isinstance(source.queues, PendingReader):
        raise UsageError(
            f"{source.url}: copying from this backend is not supported (its queued "
            "messages cannot be read without receiving them); copy from sqlite or postgres"
        )
    if (
        await destination.documents.list("", limit=1)
        or (await destination.index.query(limit=1)).rows
    ):
        raise UsageError(
            f"{destination.url} is not empty; copy into a new store (a new file, or a new "
            "?schema= on PostgreSQL)"
        )


async def _copy_documents(source: Store, destination: Store) -> int:
    copied = 0
    after: str | None = None
    while page := await source.documents.list("", start_after=after, limit=PAGE):
        for key in page:
            document = await source.documents.get(key)
            if document is not None:
                await destination.documents.put(key, document.data)
                copied += 1
        after = page[-1]
    return copied


async def _copy_index(source: Store, destination: Store) -> int:
    copied = 0
    cursor: str | None = None
    while True:
        page = await source.index.query(limit=PAGE, cursor=cursor)
        batch = destination.batch()
        for row in page.rows:
            batch.upsert(row)
        await batch.commit()
        copied += len(page.rows)
        if page.cursor is None:
            return copied
        cursor = page.cursor


async def _copy_dead_letters(source: Store, destination: Store) -> int:
    letters = await source.queues.dead_letters(None, limit=MAX_DEAD_LETTERS)
    for letter in letters:
        await destination.queues.send(letter.queue, [OutgoingMessage(letter.body, id=letter.id)])
        [received] = await destination.queues.receive(
            letter.queue, max_messages=1, visibility_timeout_s=60
        )
        await destination.queues.dead_letter(letter.queue, received.receipt, letter.reason)
    return len(letters)


async def _copy_messages(source: Store, destination: Store) -> int:
    reader = source.queues
    assert isinstance(reader, PendingReader)
    copied = 0
    after = 0
    while page := await reader.pending(after=after, limit=PAGE):
        by_queue: dict[str, list[OutgoingMessage]] = {}
        for _, message in page:
            by_queue.setdefault(message.queue, []).append(
                OutgoingMessage(message.body, id=message.id)
            )
        await _send_all(destination, by_queue)
        copied += len(page)
        after = page[-1][0]
    return copied


async def _send_all(destination: Store, by_queue: dict[str, list[OutgoingMessage]]) -> None:
    batch = destination.batch()
    for queue, messages in by_queue.items():
        batch.send(queue, messages)
    await batch.commit()


__all__: Sequence[str] = ["CopyReport", "PendingMessage", "PendingReader", "copy_store"]
