"""Messages handed to a waiting receiver of another process in its wake-up datagram.

A receiver on a sqlite store that waits on a queue says so on its wake-up socket
(:mod:`dagq.stores.sqlite_wakeups`): the socket's name carries the visibility timeout
its receives ask for (``…-v60000``, in milliseconds), and its file has the sticky bit
set while a wait is under way. A commit that sends to the queue, and leaves it
holding one visible message alone, takes that message inside its transaction for one
such waiter, exactly as the waiter's receive would (overdue messages dead-lettered, a
new receipt, one more delivery, hidden for the waiter's visibility timeout), and after
``COMMIT`` sends it the message in its datagram (:class:`Handed`) and rings nobody
else. The woken receiver keeps it (:class:`~dagq.stores.sqlite_claims.Claims`) and its
next receive returns it without a transaction of its own: a chain step across
processes saves the receive of each side (the coordinator's of the completion, the
worker's of the next task). Several messages are left in the queue and every listener
rung, as before: receivers woken at once for one message each would take a burst a few
at a time, and their commits (reports, steps) would carry fewer events each.

Nothing is weakened. A handed message is a received message: if the datagram cannot
be sent (the receiver died, its buffer is full) the sender makes it visible again at
once and rings every listener; a receiver that cannot use it (it asks for fewer
messages by then, or for another visibility timeout) or does not take it within
:data:`~dagq.stores.sqlite_claims.KEEP_S` gives it back the same way; at worst (a
receiver killed with the datagram unread) it comes back after its visibility timeout,
as when a receiver dies holding a message. A message over :data:`MAX_HANDED_BYTES`
is not handed (it stays visible; the waiter is rung for it as before).
"""

from __future__ import annotations

import re
from pathlib import Path

import msgspec

#: The first byte of a datagram that hands a message over (a plain ring is ``\\x01``).
HANDED = b"\x02"
#: The largest message body handed over in a datagram.
MAX_HANDED_BYTES = 16_384
#: What a receiver reads at once: a handed message with room for its fields.
DATAGRAM_BYTES = MAX_HANDED_BYTES + 1_024

_VT = re.compile(r"-v([0-9]{1,12})$")


class Handed(msgspec.Struct, array_like=True, frozen=True):
    """A message as a receive returns it, and how it was taken."""

    id: str
    body: bytes
    receipt: str
    dequeue_count: int
    enqueued_at: float
    #: The visibility timeout it was taken with, in milliseconds.
    vt_ms: int
    #: Visible messages were left in the queue (the receiver should receive again).
    more: bool


class Target(msgspec.Struct, frozen=True):
    """A waiting receiver's socket, and the visibility timeout it takes messages with."""

    path: Path
    vt_ms: int

    @property
    def vt_s(self) -> float:
        return self.vt_ms / 1000


class Delivery(msgspec.Struct, frozen=True):
    """A message taken for a target by a committing transaction, to send it once committed."""

    target: Target
    queue: str
    handed: Handed


def vt_suffix(vt_s: float | None) -> str:
    """The end of a socket's name that says it takes messages hidden for ``vt_s``."""
    return "" if vt_s is None else f"-v{round(vt_s * 1000)}"


def vt_ms_of(name: str) -> int | None:
    """The visibility timeout a socket's name says it takes messages with (None: it
    takes none: a process of an earlier version, or one that listened before it asked)."""
    found = _VT.search(name)
    return None if found is None else int(found.group(1))


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Handed)


def encode(handed: Handed) -> bytes:
    return HANDED + _encoder.encode(handed)


def decode(datagram: bytes) -> Handed | None:
    """The message a datagram hands over (None: a plain ring, or unreadable)."""
    if not datagram.startswith(HANDED):
        return None
    try:
        return _decoder.decode(datagram[1:])
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
