"""The payload layer: the bounds every value dagq carries must respect.

Every payload — task outputs, error texts and tracebacks, params, signal data,
foreach items, inputs, compensation specs, log tails — passes through here on its
way into a message or a document. Each kind has a documented inline limit; above it
the value is stored as a document and travels by reference, or (error texts, log
tails) is truncated with the full text kept by reference. Hard bounds (nesting depth,
total size) are checked the same way by ``validate``, ``run``, ``submit``, the client
and the worker, and refused with one line naming the value and the bound.

The limits, and what happens above them (README.md, "Limits", says the same):

==========================  ==============================  ================================
payload                     inline (above: by reference)    hard bound (above: refused)
==========================  ==============================  ================================
task output                 OUTPUT_INLINE_BYTES             MAX_OUTPUT_BYTES, MAX_DEPTH
                                                            (the attempt fails)
upstream inputs             INPUTS_INLINE_BYTES             —
a loop's previous output    PREVIOUS_INLINE_BYTES           —
foreach items               ``group.INLINE_ITEMS_LIMIT``    MAX_DEPTH (as an output)
task message (spec, cmd)    TASK_MESSAGE_INLINE_BYTES       —
params                      (in the task spec)              MAX_PARAMS_BYTES, MAX_DEPTH
signal data                 REQUEST_INLINE_BYTES            MAX_SIGNAL_BYTES, MAX_DEPTH
retry request's task names  REQUEST_INLINE_BYTES            —
definition                  (a document)                    MAX_DEFINITION_BYTES, MAX_DEPTH
error text                  ERROR_INLINE_CHARS (cut)        — (whole text kept as a document)
==========================  ==============================  ================================

No message dagq builds can then exceed ``stores.base.MAX_MESSAGE_BYTES``.

This module is pure: it measures, encodes and cuts; storing is the caller's business.
"""

from __future__ import annotations

from typing import Any

import msgspec

from dagq.errors import DamagedData, PayloadTooLarge, ValidationError

#: Deepest nesting of lists and mappings accepted in any JSON or YAML value
#: (definitions, params, signal data, outputs, items). Real data is rarely deeper
#: than 20; a value nested a thousand deep exists only to crash a parser.
MAX_DEPTH = 100
#: An output larger than this (encoded as JSON) is stored as a document and passed
#: by reference.
OUTPUT_INLINE_BYTES = 32 * 1024
#: The most a task's output may weigh (as JSON; for a shell task, the file
#: ``$DAGQ_OUTPUT``). Above it the attempt fails for good, with one line naming the
#: bound, and no more than the bound is ever read: a task cannot exhaust a worker's
#: memory by writing (or linking ``$DAGQ_OUTPUT`` to) something endless. Outputs this
#: large belong in files or object storage; the output should say where they are.
MAX_OUTPUT_BYTES = 64 * 1024 * 1024
#: Upstream outputs above this total travel as a document instead of in the message.
INPUTS_INLINE_BYTES = 24 * 1024
#: A loop's previous output rides in the task message up to this size, else by reference.
PREVIOUS_INLINE_BYTES = 8 * 1024
#: A task message above this (a large param rendered into a command, a long
#: compensation command, many upstream references) travels by reference: first its
#: spec, then, if that is not enough, the whole message. Leaves room under the
#: queue limit (48 KiB) for framing.
TASK_MESSAGE_INLINE_BYTES = 40 * 1024
#: Signal data, or the task names of a retry request, above this (encoded as JSON)
#: are stored as a document by the client; the request carries its key.
REQUEST_INLINE_BYTES = 16 * 1024
#: The most signal data a signal may carry (encoded as JSON).
MAX_SIGNAL_BYTES = 1024 * 1024
#: The most the params of one workflow may total (encoded as JSON).
MAX_PARAMS_BYTES = 1024 * 1024
#: The most a workflow definition may weigh (encoded as JSON, YAML aliases expanded).
MAX_DEFINITION_BYTES = 32 * 1024 * 1024
#: An error text longer than this is cut (its head and tail kept) in events, states
#: and listings; the whole text is kept as a document.
ERROR_INLINE_CHARS = 2000
#: How much of a name (a task, a workflow, a queue) an error message repeats.
NAME_ECHO_CHARS = 80


def too_deep(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Is ``value`` nested more than ``limit`` lists/mappings deep? (No recursion: a
    hostile value cannot exhaust the stack while it is being measured.)"""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def check_depth(value: Any, what: str, limit: int = MAX_DEPTH) -> None:
    """Refuse a value nested deeper than ``limit``: PayloadTooLarge naming ``what``."""
    if too_deep(value, limit):
        raise PayloadTooLarge(f"{what} is nested more than {limit} levels deep")


def encode_json(value: Any, what: str, *, max_bytes: int | None = None) -> bytes:
    """``value`` as JSON, within the hard bounds: PayloadTooLarge naming ``what`` if it
    is nested more than MAX_DEPTH deep or (given ``max_bytes``) too large,
    ValidationError if it is not JSON at all.

    Encoding comes first (it is fast); only a value whose encoding holds more brackets
    than MAX_DEPTH can be too deep, so only those are walked.
    """
    try:
        encoded = msgspec.json.encode(value)
    except RecursionError:
        raise PayloadTooLarge(f"{what} is nested more than {MAX_DEPTH} levels deep") from None
    except (TypeError, ValueError, OverflowError, msgspec.EncodeError) as exc:
        raise ValidationError(f"{what} is not JSON-serialisable: {exc}") from None
    if encoded.count(b"[") + encoded.count(b"{") > MAX_DEPTH:
        check_depth(value, what)
    if max_bytes is not None and len(encoded) > max_bytes:
        raise PayloadTooLarge(
            f"{what} is {len(encoded)} bytes as JSON, over the limit of {max_bytes} bytes"
        )
    return encoded


def output_too_large(size: int, limit: int, what: str = "the output (as JSON)") -> str:
    """The error of an attempt whose output weighs ``size`` bytes, over ``limit`` (the
    bound the caller checked: ``MAX_OUTPUT_BYTES``)."""
    mib = f" ({limit // 2**20} MiB)" if limit % 2**20 == 0 else ""
    return f"{what} is {size} bytes, over the limit of {limit} bytes{mib} for a task's output"


def decode_json(data: bytes, what: str) -> Any:
    """A stored JSON document, decoded; DamagedData naming ``what`` if it cannot be
    (malformed, or nested so deep that decoding would exhaust the stack)."""
    try:
        return msgspec.json.decode(data)
    except RecursionError:
        raise DamagedData(f"{what} is nested too deep to decode") from None
    except msgspec.DecodeError as exc:
        raise DamagedData(f"{what} cannot be decoded: {exc}") from None


def cut(text: str, limit: int = ERROR_INLINE_CHARS, *, note: str = "") -> str:
    """``text`` at most ``limit`` characters: its head and its tail, with the number of
    characters left out between them (and ``note``, e.g. where the whole text is, if
    there is room for it)."""
    if len(text) <= limit:
        return text
    for extra in (f"; {note}" if note else "", ""):
        # The count shown has at most as many digits as len(text): this bounds the marker.
        marker = len(f"… [{len(text)} characters cut{extra}] …")
        if marker + 2 <= limit:
            keep = limit - marker
            head, tail = keep // 2, keep - keep // 2
            omitted = len(text) - keep
            return f"{text[:head]}… [{omitted} characters cut{extra}] …{text[-tail:]}"
    return text[:limit]


def echo(name: str, limit: int = NAME_ECHO_CHARS) -> str:
    """A name as an error message may repeat it: whole if short, else its start, with
    control and other unprintable characters escaped (``\\n``, ``\\x1b``, ``\\u202e``) so
    the message stays one line and cannot steer a terminal."""
    shown = name if len(name) <= limit else name[:limit]
    if not shown.isprintable():
        shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in shown)
    return shown if len(name) <= limit else f"{shown}… ({len(name)} characters)"
