"""What the storage backends share: tokens, argument checks, error messages, the
index row codec and cursor, and the in-process wakeups behind ``Queues.wait``.

Every backend uses these, so each one accepts and rejects the same arguments, words its
errors the same way and stores index rows in the same form.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import os
import threading
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgspec

from dagq.errors import ConflictError, LeaseLost, MessageLost, MessageTooLarge, ValidationError
from dagq.stores.base import (
    MAX_MESSAGE_BYTES,
    BatchOp,
    IndexRow,
    Lease,
    OutgoingMessage,
    PutOp,
    SendOp,
)


def new_token() -> str:
    """A random 16-hex-digit token for etags, receipts and lease tokens.

    Random rather than a counter, so a version can never come back after a delete
    and re-create (no ABA). What ``secrets.token_hex(8)`` returns, without importing
    ``secrets`` (and with it ``random`` and ``hmac``) into every command that opens a store.
    """
    return os.urandom(8).hex()


def new_message_id() -> str:
    """The id of a message sent without one."""
    return uuid.uuid4().hex


def check_max_deliveries(max_deliveries: int) -> None:
    """Reject a store configuration that could never deliver a message."""
    if max_deliveries < 1:
        raise ValidationError(f"max_deliveries must be at least 1, not {max_deliveries}")


def check_outgoing(queue: str, messages: Sequence[OutgoingMessage]) -> None:
    """Reject the whole batch if any message is too large or has a negative delay."""
    for message in messages:
        if len(message.body) > MAX_MESSAGE_BYTES:
            raise MessageTooLarge(
                f"a message for queue {queue!r} is {len(message.body)} bytes, over the "
                f"{MAX_MESSAGE_BYTES}-byte limit; store the payload as a document and "
                "send its key instead"
            )
        if message.delay_s < 0:
            raise ValidationError(
                f"a message for queue {queue!r} has delay_s={message.delay_s}; use 0 or more"
            )


def check_receive(max_messages: int, visibility_timeout_s: float) -> None:
    """Reject receive arguments that cannot mean anything useful."""
    if max_messages < 1:
        raise ValidationError(f"max_messages must be at least 1, not {max_messages}")
    check_visibility(visibility_timeout_s)


def check_visibility(visibility_timeout_s: float) -> None:
    """A message cannot be hidden for a negative time."""
    if visibility_timeout_s < 0:
        raise ValidationError(f"visibility_timeout_s must be 0 or more, not {visibility_timeout_s}")


def check_put(if_match: str | None, if_none_match: bool) -> None:
    """``if_match`` and ``if_none_match`` together could never succeed."""
    if if_match is not None and if_none_match:
        raise ValidationError("put takes if_match or if_none_match, not both")


def check_batch(ops: Sequence[BatchOp]) -> None:
    """Reject a whole batch up front, as the primitives would reject its operations:
    a native committer must not write part of a batch it would refuse."""
    for op in ops:
        if isinstance(op, PutOp):
            check_put(op.if_match, op.if_none_match)
        elif isinstance(op, SendOp):
            check_outgoing(op.queue, op.messages)


def check_limit(limit: int | None) -> None:
    """A page size must not be negative."""
    if limit is not None and limit < 0:
        raise ValidationError(f"limit must be 0 or more, not {limit}")


def check_page_size(limit: int) -> None:
    """An index page holds at least one row."""
    if limit < 1:
        raise ValidationError(f"limit must be at least 1, not {limit}")


def check_statuses(status: Sequence[str] | None) -> None:
    """A single string is a sequence of letters, not a list of statuses."""
    if isinstance(status, str):
        raise ValidationError(f"status must be a list of statuses, like [{status!r}]")


def check_ttl(name: str, ttl_s: float) -> None:
    """A lease must last some time."""
    if ttl_s <= 0:
        raise ValidationError(f"lease {name!r}: ttl_s must be positive, not {ttl_s}")


def conflict(key: str, if_match: str | None) -> ConflictError:
    """The error for a conditional write that lost."""
    if if_match is None:
        return ConflictError(f"document {key!r} exists already (if_none_match)")
    return ConflictError(
        f"document {key!r} changed or was deleted since version {if_match!r}; "
        "read it again and retry"
    )


def lease_lost(lease: Lease) -> LeaseLost:
    """The error for renewing a lease that is no longer ours."""
    return LeaseLost(
        f"lease {lease.name!r} held by {lease.owner} was lost (it expired and was taken "
        "over, or was broken); stop writing"
    )


def stale_receipt(queue: str, receipt: str) -> MessageLost:
    """The error for using a receipt that was deleted or redelivered."""
    return MessageLost(
        f"receipt {receipt!r} of queue {queue!r} is stale: the message was deleted or "
        "handed to another receiver"
    )


def too_many_deliveries(dequeue_count: int) -> str:
    """The dead-letter reason for a message nobody managed to process."""
    return f"delivered {dequeue_count} times without being deleted"


def encode_row(row: IndexRow) -> bytes:
    """An index row as stored."""
    return msgspec.msgpack.encode(row)


def decode_row(data: bytes) -> IndexRow:
    """An index row from its stored form."""
    return msgspec.msgpack.decode(data, type=IndexRow)


def encode_cursor(row: IndexRow) -> str:
    """The opaque cursor of the page that follows ``row`` (newest first)."""
    return base64.urlsafe_b64encode(msgspec.json.encode([row.created_at, row.id])).decode()


def decode_cursor(cursor: str) -> tuple[float, str]:
    """The (created_at, id) position a cursor points after."""
    try:
        created_at, row_id = msgspec.json.decode(
            base64.urlsafe_b64decode(cursor), type=tuple[float, str]
        )
    except (binascii.Error, ValueError, msgspec.DecodeError) as exc:
        raise ValidationError(
            f"index cursor {cursor!r} is not valid; pass a cursor from a previous page"
        ) from exc
    return created_at, row_id


class Wakeups:
    """Wakes the ``wait`` calls of a queue when this process sends to it.

    Each wait parks a future of its own event loop, so one instance serves any
    number of loops and threads.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}
        self._sends: dict[str, int] = {}

    def sends(self, queue: str) -> int:
        """How many sends to ``queue`` were announced so far (a receiver notes it)."""
        return self._sends.get(queue, 0)

    async def wait(self, queue: str, timeout_s: float, *, seen: int | None = None) -> None:
        """Return at the next ``notify(queue)``, or after ``timeout_s``.

        With ``seen`` (the ``sends`` count noted before the caller's last receive), a send
        that came in between returns at once: no wakeup is lost to that race.
        """
        if timeout_s <= 0:
            await asyncio.sleep(0)
            return
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._lock:
            if seen is not None and self._sends.get(queue, 0) != seen:
                return
            self._waiters.setdefault(queue, set()).add(future)
        # The future itself, with a timer: ``wait_for`` would add a turn of the loop
        # (its own waiter) between the send and the waiter running again.
        timer = loop.call_later(timeout_s, _wake, future)
        try:
            await future
        finally:
            timer.cancel()
            with self._lock:
                waiters = self._waiters.get(queue, set())
                waiters.discard(future)
                if not waiters:
                    self._waiters.pop(queue, None)

    def waiting(self, queue: str) -> bool:
        """Does a ``wait`` for ``queue`` wait now (in any loop of this process)?"""
        with self._lock:
            return bool(self._waiters.get(queue))

    def notify_all(self) -> None:
        """Wake every waiter of every queue, as if each had been sent to (after sends
        may have gone unseen, such as while a listening connection was down)."""
        with self._lock:
            queues = set(self._sends) | set(self._waiters)
        for queue in queues:
            self.notify(queue)

    def notify(self, queue: str) -> None:
        """Wake every current waiter of ``queue``."""
        with self._lock:
            self._sends[queue] = self._sends.get(queue, 0) + 1
            waiters = self._waiters.pop(queue, set())
        try:
            here: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        for future in waiters:
            if future.get_loop() is here:  # same loop: no need to wake it through its pipe
                _wake(future)
                continue
            # The loop may be closed by now (a finished test); its waiter is gone too.
            with contextlib.suppress(RuntimeError):
                future.get_loop().call_soon_threadsafe(_wake, future)


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def has_labels(row: IndexRow, labels: Mapping[str, str] | None) -> bool:
    """Whether every one of ``labels`` is on the row (``data["labels"]``)."""
    if not labels:
        return True
    found = row.data.get("labels") or {}
    return isinstance(found, dict) and all(found.get(k) == v for k, v in labels.items())


def count_statuses(
    rows: Iterable[IndexRow],
    labels: Mapping[str, str] | None = None,
    created_after: float | None = None,
    created_before: float | None = None,
) -> dict[str, int]:
    """Rows by status, those with ``labels`` created in the range only (``Index.count``
    where the rows are at hand)."""
    counts: dict[str, int] = {}
    for row in rows:
        if created_after is not None and row.created_at < created_after:
            continue
        if created_before is not None and row.created_at >= created_before:
            continue
        if has_labels(row, labels):
            counts[row.status] = counts.get(row.status, 0) + 1
    return counts


def count_filters(
    name: str | None,
    tenant: str | None,
    created_after: float | None,
    created_before: float | None,
    mark: str,
) -> tuple[str, list[Any]]:
    """The WHERE clause (parameters marked ``mark``: ``?`` or ``%s``) and arguments of
    ``Index.count``'s column filters, for the SQL backends."""
    clauses: list[str] = []
    args: list[Any] = []
    for clause, value in (
        ("name = ", name),
        ("tenant = ", tenant),
        ("created_at >= ", created_after),
        ("created_at < ", created_before),
    ):
        if value is not None:
            clauses.append(clause + mark)
            args.append(value)
    return ("WHERE " + " AND ".join(clauses) if clauses else ""), args
