"""A worker's hold on received task messages, and bundles taken apart.

A task-queue message carries one task or, from a store that bills per request, a
bundle of several (:func:`dagq.dispatching.bundle`). The worker holds each message
(invisible, by heartbeats) until every task it kept from it has reported; the last
report deletes it. A worker keeps as many tasks as it has free slots plus a small
backlog (started as slots free up); the rest of a bundle goes back to the queue at once
as a new message (:func:`give_back`), and so does a backlog that waits too long. A bundle
delivered a second time is split into one message per task (:func:`split`), so a
task that keeps killing its worker reaches the dead letters alone, not with its
siblings.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import msgspec

from dagq.dispatching import attempt_id, bundle
from dagq.messages import TaskMessage, encode_task
from dagq.stores.base import Message, OutgoingMessage, Store

log = logging.getLogger("dagq.worker")


class Held(msgspec.Struct, eq=False):
    """A received message and the tasks kept from it that have not reported yet."""

    message: Message
    receipt: str
    extended_at: float
    #: How many tasks were kept from it, and how many of those are still to report
    #: (the message is deleted with the last report).
    kept: int
    open: int
    #: Another receiver has it now (a heartbeat found the receipt stale).
    lost: bool = False
    #: A kept task could not report: the message must come back, so it is never deleted.
    failed: bool = False
    #: Held while the receipt is renewed, and while it is used to delete the message:
    #: a delete never uses a receipt that a renewal under way is replacing (a store
    #: ignores a stale receipt, and the finished task would run again).
    lock: asyncio.Lock = msgspec.field(default_factory=asyncio.Lock)
    #: Deleted (every kept task reported): nothing is left to renew.
    deleted: bool = False

    @property
    def queue(self) -> str:
        """The queue the message came from."""
        return self.message.queue

    def reported(self, n: int = 1) -> Held | None:
        """One kept task has reported: this, if the message may go with that report."""
        self.open -= n
        if self.open > 0 or self.lost or self.failed:
            return None
        return self

    def given_back(self, n: int) -> Held | None:
        """``n`` kept tasks went back to the queue: this, if the message may go now
        (after the reports already posted: it is deleted through the outbox)."""
        return self.reported(n)

    @property
    def untouched(self) -> bool:
        """Nothing kept from it has reported or gone back: it may be released whole."""
        return self.open == self.kept and not self.failed

    def report_failed(self) -> None:
        """One kept task could not report: keep the message, so it is redelivered."""
        self.open -= 1
        self.failed = True


def message_of(task: TaskMessage) -> OutgoingMessage:
    """A task's own message, with the id the coordinator gave that attempt."""
    return OutgoingMessage(encode_task(task), id=attempt_id(task))


async def give_back(
    store: Store, queue: str, tasks: Sequence[TaskMessage], size: int, *, delay_s: float = 0.0
) -> None:
    """Put tasks this worker will not start back on the queue (bundled again), visible
    again after ``delay_s``.

    The new messages get fresh ids: theirs may be that of the message still held,
    which a store that deduplicates by id would take for a duplicate and drop.
    """
    if tasks:
        messages = bundle([message_of(t) for t in tasks], size)
        await store.queues.send(queue, [OutgoingMessage(m.body, delay_s=delay_s) for m in messages])


async def split(store: Store, message: Message, tasks: Sequence[TaskMessage]) -> None:
    """Replace a redelivered bundle by one message per task (send, then delete)."""
    await store.queues.send(message.queue, [message_of(t) for t in tasks])
    await delete(store, message, "split into one message per task")


async def delete(store: Store, message: Message, why: str) -> bool:
    """Delete a message just received (no heartbeat renews its receipt yet); whether it
    went. One that did not was no longer held: it is logged, never ignored."""
    if await store.queues.delete(message.queue, [message.receipt]):
        return True
    log.warning(
        "message %s (%s) was no longer held when deleted: it will be delivered again",
        message.id,
        why,
    )
    return False
