"""Queues in Azure Queue Storage (naming, envelope and receipts: :mod:`.azure_messages`).

What Azure does differently, and how the contract is kept:

* Visibility timeouts are whole seconds: they are rounded up, and a receive hides a
  message for at least one second (Azure's minimum).
* A receive returns at most 32 messages: larger receives take several pages, a few
  at a time once the queue proves full.
* Messages of one ``send`` go out concurrently, so their order among themselves is
  not kept (messages of successive sends are received in order).
* There is no deduplication by id (``deduplicates`` is False): a second message with
  the id of one still queued is a second message. dagq's consumers are idempotent.
* A message received more than ``max_deliveries`` times is moved to the dead letters
  (:mod:`.azure_dead_letters`) by the receive that finds it, never returned.
* ``depth``: Azure counts messages only approximately and shows (peeks) only the
  oldest 32 visible ones: with 32 or more visible, all are counted as visible, and
  the age is that of the oldest visible message.
* Queues are created on first send; receiving from one never sent to finds nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from azure.core.exceptions import HttpResponseError, ResourceExistsError, ResourceNotFoundError
from azure.storage.queue import QueueMessage

from dagq.errors import MessageLost
from dagq.stores.azure_dead_letters import DeadLetterBlobs
from dagq.stores.azure_messages import (
    PAGE,
    Held,
    HeldMessages,
    decode,
    encode,
    make_receipt,
    parse_receipt,
    queue_name,
    whole_seconds,
)
from dagq.stores.azure_service import AzureService, Clients, error_code
from dagq.stores.base import Clock, DeadLetter, Message, OutgoingMessage, QueueDepth
from dagq.stores.common import (
    Wakeups,
    check_limit,
    check_outgoing,
    check_receive,
    check_visibility,
    new_message_id,
    stale_receipt,
    too_many_deliveries,
)

#: Messages that never expire (Azure's default is seven days).
_NEVER = -1
#: How many receive pages may be in flight at once for one large receive.
_MAX_WAVE = 8
#: After its delay, how much later a delayed message is announced (it is visible then).
_VISIBLE_MARGIN_S = 0.05
#: How long ``dead_letter`` keeps the message hidden while it stores the dead letter.
_DEAD_LETTER_HOLD_S = 30
# A stale pop receipt: 404 MessageNotFound or 400 PopReceiptMismatch; a missing queue: 404.
_STALE = (HttpResponseError,)
_STALE_CODES = {"PopReceiptMismatch", "MessageNotFound", "QueueNotFound"}


class AzureQueues:
    """At-least-once queues on Azure Queue Storage."""

    deduplicates = False
    #: Task messages per queue message (dagq.dispatching.bundle): a request each.
    bundle_size = 32
    #: A delayed message sent by this process is announced to its waiters when it
    #: becomes visible (:func:`dagq.local.local_poll_interval`).
    announces_delayed = True

    def __init__(
        self,
        service: AzureService,
        dead_letters: DeadLetterBlobs,
        wakeups: Wakeups,
        clock: Clock,
        max_deliveries: int,
    ) -> None:
        self._service = service
        self._dead = dead_letters
        self._wakeups = wakeups
        self._clock = clock
        self._max_deliveries = max_deliveries
        self._held = HeldMessages()
        self._seen: dict[str, int] = {}
        self._created: set[str] = set()
        self._create_lock = asyncio.Lock()

    def azure_name(self, queue: str) -> str:
        """The Azure queue behind dagq queue ``queue``."""
        return queue_name(self._service.target.prefix, queue)

    # --- sending -------------------------------------------------------------------

    async def send(self, queue: str, messages: Sequence[OutgoingMessage]) -> None:
        check_outgoing(queue, messages)
        now = self._clock()
        texts: dict[str, tuple[str, int]] = {}
        for message in messages:  # the same id twice in one call: the first one wins
            message_id = message.id or new_message_id()
            if message_id not in texts:
                delay = whole_seconds(message.delay_s)
                texts[message_id] = (encode(message_id, now, bytes(message.body)), delay)
        if not texts:
            return
        name = self.azure_name(queue)
        pending = list(texts.values())
        if name not in self._created:
            # The first send decides whether the queue exists; the rest follow at once.
            await self._send_creating(name, *pending[0])
            pending = pending[1:]
        await asyncio.gather(*(self._send_one(name, text, delay) for text, delay in pending))
        self._wakeups.notify(queue)
        # A delayed message is announced when it becomes visible, as a send then would
        # be: this process's receivers need no quick polls for its delayed retries.
        loop = asyncio.get_running_loop()
        for delay in {delay for _, delay in texts.values() if delay > 0}:
            loop.call_later(delay + _VISIBLE_MARGIN_S, self._wakeups.notify, queue)

    async def _send_one(self, name: str, text: str, delay: int) -> None:
        async def put(c: Clients) -> None:
            client = self._service.queue_client(c, name)
            await client.send_message(text, visibility_timeout=delay, time_to_live=_NEVER)

        await self._service.call("queue.send", put)

    async def _send_creating(self, name: str, text: str, delay: int) -> None:
        try:
            await self._service.call(
                "queue.send",
                lambda c: self._service.queue_client(c, name).send_message(
                    text, visibility_timeout=delay, time_to_live=_NEVER
                ),
                expect=(ResourceNotFoundError,),
            )
        except ResourceNotFoundError:
            await self._create(name)
            await self._send_one(name, text, delay)
        self._created.add(name)

    async def _create(self, name: str) -> None:
        async with self._create_lock:
            if name in self._created:
                return
            with contextlib.suppress(ResourceExistsError):
                await self._service.call(
                    "queue.create",
                    lambda c: self._service.queue_client(c, name).create_queue(),
                    expect=(ResourceExistsError,),
                )
            self._created.add(name)

    # --- receiving -----------------------------------------------------------------

    async def receive(
        self, queue: str, *, max_messages: int, visibility_timeout_s: float
    ) -> list[Message]:
        check_receive(max_messages, visibility_timeout_s)
        self._seen[queue] = self._wakeups.sends(queue)
        name = self.azure_name(queue)
        visibility = max(1, whole_seconds(visibility_timeout_s))
        taken: list[Message] = []
        wave = 1
        while len(taken) < max_messages:
            wants = _split(max_messages - len(taken), wave)
            pages = await asyncio.gather(*(self._page(name, want, visibility) for want in wants))
            for page in pages:
                taken.extend(await self._accept(queue, name, page))
            if any(len(page) < want for page, want in zip(pages, wants, strict=True)):
                break  # the queue ran dry (of visible messages)
            wave = min(wave * 2, _MAX_WAVE)
        return taken

    async def _page(self, name: str, want: int, visibility: int) -> list[QueueMessage]:
        async def fetch(c: Clients) -> list[QueueMessage]:
            pager = self._service.queue_client(c, name).receive_messages(
                messages_per_page=want, max_messages=want, visibility_timeout=visibility
            )
            try:
                page = await anext(pager.by_page())
            except StopAsyncIteration:
                return []
            return [message async for message in page]

        try:
            return await self._service.call("queue.receive", fetch, expect=(ResourceNotFoundError,))
        except ResourceNotFoundError:  # never sent to: nothing to receive
            return []

    async def _accept(self, queue: str, name: str, page: list[QueueMessage]) -> list[Message]:
        """Messages to hand out; the undeliverable ones go to the dead letters."""
        accepted: list[Message] = []
        burials = []
        now = self._clock()
        for raw in page:
            receipt = make_receipt(str(raw.id), str(raw.pop_receipt))
            count = int(raw.dequeue_count or 1)
            try:
                message_id, enqueued_at, body = decode(str(raw.content or ""))
            except ValueError as exc:
                dead = DeadLetter(
                    queue, str(raw.id), str(raw.content).encode(), count, str(exc), now
                )
                burials.append(self._bury(name, receipt, dead))
                continue
            if count > self._max_deliveries:
                reason = too_many_deliveries(count - 1)
                dead = DeadLetter(queue, message_id, body, count - 1, reason, now)
                burials.append(self._bury(name, receipt, dead))
                continue
            self._held.add(receipt, Held(message_id, body, count, enqueued_at))
            accepted.append(Message(queue, message_id, body, receipt, count, enqueued_at))
        await asyncio.gather(*burials)
        return accepted

    async def _bury(self, name: str, receipt: str, dead: DeadLetter) -> None:
        """Store the dead letter, then delete the message (a crash between: stored twice)."""
        await self._dead.add(name, dead)
        await self._delete_one(name, receipt)

    # --- after receiving -----------------------------------------------------------

    async def delete(self, queue: str, receipts: Sequence[str]) -> int:
        name = self.azure_name(queue)
        deleted = await asyncio.gather(*(self._delete_one(name, r) for r in receipts))
        return sum(deleted)

    async def _delete_one(self, name: str, receipt: str) -> bool:
        parsed = parse_receipt(receipt)
        if parsed is None:
            return False
        azure_id, pop_receipt = parsed
        try:
            await self._service.call(
                "queue.delete",
                lambda c: self._service.queue_client(c, name).delete_message(azure_id, pop_receipt),
                expect=_STALE,
            )
        except _STALE as exc:
            if not _is_stale(exc):
                raise self._service.unavailable("queue.delete", exc) from exc
            self._held.pop(receipt)
            return False
        self._held.pop(receipt)
        return True

    async def extend(self, queue: str, receipt: str, visibility_timeout_s: float) -> str:
        check_visibility(visibility_timeout_s)
        return await self._update(queue, receipt, whole_seconds(visibility_timeout_s))

    async def _update(self, queue: str, receipt: str, visibility: int) -> str:
        """Hide a received message for ``visibility`` s more; its new receipt."""
        parsed = parse_receipt(receipt)
        if parsed is None:
            raise stale_receipt(queue, receipt)
        azure_id, pop_receipt = parsed
        name = self.azure_name(queue)

        async def update(c: Clients) -> str:
            client = self._service.queue_client(c, name)
            updated = await client.update_message(
                azure_id, pop_receipt=pop_receipt, visibility_timeout=visibility
            )
            return str(updated.pop_receipt)

        try:
            new_pop_receipt = await self._service.call("queue.update", update, expect=_STALE)
        except _STALE as exc:
            self._held.pop(receipt)
            if not _is_stale(exc):
                raise self._service.unavailable("queue.update", exc) from exc
            raise stale_receipt(queue, receipt) from exc
        new_receipt = make_receipt(azure_id, new_pop_receipt)
        held = self._held.pop(receipt)
        if held is not None:
            self._held.add(new_receipt, held)
        return new_receipt

    async def dead_letter(self, queue: str, receipt: str, reason: str) -> None:
        held = self._held.get(receipt)
        try:
            # Proves the receipt current and keeps the message ours while we store it.
            current = await self._update(queue, receipt, _DEAD_LETTER_HOLD_S)
        except MessageLost:
            return  # a stale receipt is ignored, as by delete
        if held is None:  # received by another store object: Azure cannot tell the body
            held = Held(current.partition(" ")[0], b"", 0, 0.0)
            reason += " (its body is lost: the message was received by another process)"
        dead = DeadLetter(queue, held.id, held.body, held.dequeue_count, reason, self._clock())
        await self._bury(self.azure_name(queue), current, dead)

    async def dead_letters(self, queue: str | None, *, limit: int = 100) -> list[DeadLetter]:
        check_limit(limit)
        azure_queue = None if queue is None else self.azure_name(queue)
        return await self._dead.list(queue, azure_queue, limit)

    async def dead_letter_of(self, key: str) -> DeadLetter | None:
        return await self._dead.one(key)

    async def remove_dead_letters(self, keys: Sequence[str]) -> int:
        return await self._dead.remove(keys)

    async def depth(self, queue: str) -> QueueDepth:
        name = self.azure_name(queue)

        async def count(c: Clients) -> int:
            properties = await self._service.queue_client(c, name).get_queue_properties()
            return int(properties.approximate_message_count or 0)

        async def peek(c: Clients) -> list[QueueMessage]:
            return await self._service.queue_client(c, name).peek_messages(max_messages=PAGE)

        try:
            total, peeked = await asyncio.gather(
                self._service.call("queue.properties", count, expect=(ResourceNotFoundError,)),
                self._service.call("queue.peek", peek, expect=(ResourceNotFoundError,)),
            )
        except ResourceNotFoundError:
            return QueueDepth(0, 0, 0.0)
        visible = len(peeked) if len(peeked) < PAGE else max(total, PAGE)
        age = 0.0
        for raw in peeked[:1]:
            with contextlib.suppress(ValueError):
                age = max(0.0, self._clock() - decode(str(raw.content or ""))[1])
        return QueueDepth(visible, max(0, total - visible), age)

    async def wait(self, queue: str, timeout_s: float) -> None:
        await self._wakeups.wait(queue, timeout_s, seen=self._seen.get(queue))


def _split(count: int, wave: int) -> list[int]:
    """Up to ``wave`` pages of at most 32 that together ask for ``count`` messages."""
    pages: list[int] = []
    while count > 0 and len(pages) < wave:
        pages.append(min(PAGE, count))
        count -= pages[-1]
    return pages


def _is_stale(exc: HttpResponseError) -> bool:
    """Does a failed delete or update mean the receipt (or queue) is no longer valid?"""
    if isinstance(exc, ResourceNotFoundError):
        return True
    return error_code(exc) in {
        "PopReceiptMismatch",
        "MessageNotFound",
        "QueueNotFound",
        "InvalidQueryParameterValue",
    }
