"""How dagq messages travel through Azure Queue Storage.

* **Queue names**: ``{prefix}-q-{name}`` for a dagq queue name of only lowercase
  letters and digits (``cpu``, ``default``); any other (``_completions``, ``GPU.big``)
  becomes ``{prefix}-q-{sanitized}-{hash}``. Plain names hold no hyphen after ``-q-``
  and hashed ones always do, so the two forms never meet; the hash covers the prefix
  and the exact name, so two names that sanitize alike stay apart. Azure's rules hold:
  3-63 characters, lowercase letters, digits and single hyphens.
* **Envelope**: Azure assigns its own message ids, so the dagq id and the send time
  travel in the message text with the body (msgpack). The text is base64 when that
  fits Azure's 64 KiB limit; a body near MAX_MESSAGE_BYTES (48 KiB, whose base64 alone
  is 64 KiB) is sent as base85 (5 characters per 4 bytes) with an alphabet free of
  XML's special characters.
* **Receipts**: the Azure message id and its pop receipt, in one opaque string.
"""

from __future__ import annotations

import base64
import hashlib
import math
import re
from collections import OrderedDict
from dataclasses import dataclass

import msgspec

from dagq.errors import MessageTooLarge

#: Azure's cap on a message's text, in characters (bytes: the text is ASCII).
TEXT_LIMIT = 64 * 1024
#: Azure's cap on the messages one receive or peek returns.
PAGE = 32

_NAME_LIMIT = 63
_HASH_CHARS = 10
_PLAIN = re.compile(r"^[a-z0-9]+\Z")
_BASE64 = "0"
_BASE85 = "1"
# base85 uses '&', '<' and '>'; swap them for characters it leaves out.
_TO_XML_SAFE = bytes.maketrans(b"&<>", b".[]")
_FROM_XML_SAFE = bytes.maketrans(b".[]", b"&<>")
_RECEIPT_SEPARATOR = " "
_envelope = msgspec.msgpack.Decoder(tuple[str, float, bytes])


def queue_name(prefix: str, queue: str) -> str:
    """The Azure queue that holds dagq queue ``queue`` of store ``prefix``."""
    head = f"{prefix}-q-"
    if _PLAIN.match(queue) and len(head) + len(queue) <= _NAME_LIMIT:
        return head + queue
    digest = hashlib.sha256(f"{prefix}\0{queue}".encode()).hexdigest()[:_HASH_CHARS]
    room = _NAME_LIMIT - len(head) - len(digest) - 1
    sanitized = re.sub(r"[^a-z0-9]+", "-", queue.lower()).strip("-")[:room].strip("-")
    return f"{head}{sanitized}-{digest}" if sanitized else head + digest


def whole_seconds(seconds: float) -> int:
    """Azure counts visibility in whole seconds: round up (a float's noise aside)."""
    return max(0, math.ceil(round(seconds, 6)))


def encode(message_id: str, enqueued_at: float, body: bytes) -> str:
    """The message text for Azure: the envelope, base64 if that fits, else base85."""
    packed = msgspec.msgpack.encode((message_id, enqueued_at, body))
    if (len(packed) + 2) // 3 * 4 < TEXT_LIMIT:
        return _BASE64 + base64.b64encode(packed).decode("ascii")
    text = _BASE85 + base64.b85encode(packed).translate(_TO_XML_SAFE).decode("ascii")
    if len(text) > TEXT_LIMIT:
        raise MessageTooLarge(
            f"message {message_id!r} does not fit an Azure queue message even as base85 "
            f"({len(text)} characters, limit {TEXT_LIMIT}); shorten its id"
        )
    return text


def decode(text: str) -> tuple[str, float, bytes]:
    """(id, enqueued_at, body) from a message's text; ValueError if it is not dagq's."""
    try:
        if text.startswith(_BASE64):
            packed = base64.b64decode(text[1:], validate=True)
        elif text.startswith(_BASE85):
            packed = base64.b85decode(text[1:].encode("ascii").translate(_FROM_XML_SAFE))
        else:
            raise ValueError("unknown encoding")
        return _envelope.decode(packed)
    except (ValueError, msgspec.MsgspecError) as exc:  # binascii.Error is a ValueError
        raise ValueError(f"not a dagq message: {exc}") from exc


def make_receipt(azure_id: str, pop_receipt: str) -> str:
    """The opaque receipt of a received message."""
    return f"{azure_id}{_RECEIPT_SEPARATOR}{pop_receipt}"


def parse_receipt(receipt: str) -> tuple[str, str] | None:
    """(Azure message id, pop receipt), or None for a string no receive ever returned."""
    azure_id, separator, pop_receipt = receipt.partition(_RECEIPT_SEPARATOR)
    if not separator or not azure_id or not pop_receipt:
        return None
    return azure_id, pop_receipt


@dataclass(frozen=True, slots=True)
class Held:
    """What this process knows of a message it received (Azure cannot look one up)."""

    id: str
    body: bytes
    dequeue_count: int
    enqueued_at: float


class HeldMessages:
    """Received messages by receipt, so ``dead_letter`` can keep their body.

    Bounded: messages received but never deleted here (they timed out and went to
    another receiver) would otherwise pile up; the oldest are forgotten first.
    """

    def __init__(self, *, max_messages: int = 50_000, max_bytes: int = 128 * 1024 * 1024) -> None:
        self._held: OrderedDict[str, Held] = OrderedDict()
        self._bytes = 0
        self._max_messages = max_messages
        self._max_bytes = max_bytes

    def __len__(self) -> int:
        return len(self._held)

    def add(self, receipt: str, held: Held) -> None:
        """Remember a received message under its receipt."""
        self._held[receipt] = held
        self._bytes += len(held.body)
        while self._held and (
            len(self._held) > self._max_messages or self._bytes > self._max_bytes
        ):
            _, oldest = self._held.popitem(last=False)
            self._bytes -= len(oldest.body)

    def get(self, receipt: str) -> Held | None:
        """The message a receipt was given for, if still remembered."""
        return self._held.get(receipt)

    def pop(self, receipt: str) -> Held | None:
        """Forget a message (deleted, dead-lettered or given a new receipt)."""
        held = self._held.pop(receipt, None)
        if held is not None:
            self._bytes -= len(held.body)
        return held
