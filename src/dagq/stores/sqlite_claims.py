"""Receives served by the commit that sends: a waiting receiver skips its own round trip.

A receiver that found a queue empty waits for a send (``queues.wait``). When the send
is committed by the same store object — in ``dagq run``, or a ``Client`` with its
runner, where the coordinator and the worker share one — the committing transaction
also claims the messages for that receiver, exactly as its receive would have (the
same statements: overdue messages dead-lettered, the oldest visible ones taken, a new
receipt, the visibility timeout the receiver asked for), and keeps them here. The
receiver, woken as before, finds them here instead of handing a receive of its own to
the writer thread: a chain step saves a thread round trip on each side.

Nothing is weakened: the claim is part of the sender's transaction (rolled back with
it), and claimed messages are held like received ones — if nobody takes them from
here (the receiver stopped), they are released when the store closes, and at worst
come back after their visibility timeout, as when a receiver dies. A claim is made
only for a receiver waiting at the time of the commit, for at most as many messages
as its last receive asked for; those its next receive does not take (it asks for
fewer), or that wait for it longer than :data:`KEEP_S`, are made visible again, their
delivery not counted. See
docs/architecture.md, "Wake-ups across processes".
"""

from __future__ import annotations

import threading
import time
from collections import deque

import msgspec

from dagq.stores.base import Message


class Ask(msgspec.Struct, frozen=True, eq=False):
    """What a waiting receiver's next receive would ask for."""

    max_messages: int
    visibility_timeout_s: float


class _Claimed(msgspec.Struct):
    message: Message
    #: The receiver's sends count once the claiming commit has announced its send.
    seen: int
    #: When to let it go (it is visible again in the store at ``visible_at``).
    stale_at: float
    #: The claim took all the receiver asked for: more may be waiting in the store.
    capped: bool


#: How long a claim waits for its receiver at most (less when half the visibility
#: timeout is shorter). A receiver woken for it takes it at once; one that does not (a
#: worker that took from another of its queues first, and whose slots are now full)
#: may not receive there again for as long as its tasks run: the next commit or
#: receive of this store then makes the messages visible to every receiver again.
KEEP_S = 1.0


class Claims:
    """The waiting receivers of one store object, and the messages claimed for them.

    Used from the event loop (receivers) and from the writer thread (the commits
    that claim), under one lock.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._asks: dict[str, list[Ask]] = {}
        self._kept: dict[str, deque[_Claimed]] = {}

    def ask(self, queue: str, ask: Ask) -> None:
        """A receiver waits on ``queue``: a commit that sends there may claim for it."""
        with self._lock:
            self._asks.setdefault(queue, []).append(ask)

    def withdraw(self, queue: str, ask: Ask) -> None:
        """Its wait ended: no claim for it any more (one made already is kept)."""
        with self._lock:
            asks = self._asks.get(queue)
            if asks is not None and ask in asks:
                asks.remove(ask)
                if not asks:
                    del self._asks[queue]

    def waiting(self, queues: set[str]) -> dict[str, list[Ask]]:
        """Take the asks waiting on these queues (a commit is about to claim for them)."""
        with self._lock:
            return {q: self._asks.pop(q) for q in queues if q in self._asks}

    def holding(self) -> bool:
        """Are any claimed messages kept here (some may be due to go back)?"""
        return bool(self._kept)

    def keep(
        self, queue: str, messages: list[Message], *, seen: int, capped: bool, vt: float
    ) -> None:
        """Messages claimed by a committed transaction, until a receive takes them."""
        if not messages:
            return
        stale_at = time.monotonic() + min(vt / 2, KEEP_S)
        with self._lock:
            kept = self._kept.setdefault(queue, deque())
            kept.extend(_Claimed(m, seen, stale_at, capped) for m in messages)

    def take(self, queue: str, most: int) -> tuple[list[Message], int, bool, list[Message]] | None:
        """Up to ``most`` claimed messages of ``queue`` (None: none kept), the sends
        count the receiver may wait from, whether it should receive again at once
        (more may be waiting in the store), and the claimed messages it does not take:
        those beyond ``most`` (the receiver wants fewer than its last receive asked
        for, and may not receive again for long) and those whose visibility runs out
        soon. All are forgotten here; the caller makes the ones not taken visible again.
        """
        with self._lock:
            kept = self._kept.pop(queue, None)
        if not kept:
            return None
        now = time.monotonic()
        taken: list[_Claimed] = []
        left: list[Message] = []
        for claimed in kept:
            if len(taken) < most and claimed.stale_at > now:
                taken.append(claimed)
            else:
                left.append(claimed.message)
        again = bool(left) or any(c.capped for c in taken)
        if not taken:
            return [], -1, True, left
        return [c.message for c in taken], max(c.seen for c in taken), again, left

    def expired(self) -> list[tuple[str, str]]:
        """The claims no receive took in time (:data:`KEEP_S`), as (queue, receipt),
        forgotten here: the caller makes them visible again."""
        with self._lock:
            if not self._kept:
                return []
            now = time.monotonic()
            out: list[tuple[str, str]] = []
            for queue in list(self._kept):
                kept = self._kept[queue]
                out.extend((queue, c.message.receipt) for c in kept if c.stale_at <= now)
                fresh = deque(c for c in kept if c.stale_at > now)
                if fresh:
                    self._kept[queue] = fresh
                else:
                    del self._kept[queue]
            return out

    def release(self) -> list[tuple[str, str]]:
        """Every kept message as (queue, receipt), forgotten here (the store closes)."""
        with self._lock:
            kept = [(q, c.message.receipt) for q, cs in self._kept.items() for c in cs]
            self._kept.clear()
            self._asks.clear()
        return kept
