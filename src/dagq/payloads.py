"""The payload layer: the bounds every value dagq carries must respect.

Every payload — task outputs, error texts and tracebacks, params, signal data,
foreach items, inputs, compensation specs, log tails — passes through here on its
way into a message or a document. Each kind has a documented inline limit; above it
the value is stored as a document and travels by reference, or (error texts, log
tails) is truncated with the full text kept by reference. Hard bounds (nesting depth,
total size) are checked the same way by ``validate``, ``run``, ``submit``, the client
and the worker, and refused with one line naming the value and the bound.

This module is pure: it measures and cuts; storing is the caller's business.
"""

from __future__ import annotations

from typing import Any

from dagq.errors import PayloadTooLarge

#: Deepest nesting of lists and mappings accepted in any JSON or YAML value
#: (definitions, params, signal data, outputs, items). Real data is rarely deeper
#: than 20; a value nested a thousand deep exists only to crash a parser.
MAX_DEPTH = 100
#: An output larger than this (encoded as JSON) is stored as a document and passed
#: by reference.
OUTPUT_INLINE_BYTES = 32 * 1024
#: Upstream outputs above this total travel as a document instead of in the message.
INPUTS_INLINE_BYTES = 24 * 1024
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


def cut(text: str, limit: int = ERROR_INLINE_CHARS) -> str:
    """``text`` at most ``limit`` characters: its head and its tail, with the number of
    characters left out between them."""
    if len(text) <= limit:
        return text
    keep = max(limit - 40, 2)
    head = keep // 2
    tail = keep - head
    omitted = len(text) - head - tail
    return f"{text[:head]}… [{omitted} characters cut] …{text[-tail:]}"


def echo(name: str, limit: int = NAME_ECHO_CHARS) -> str:
    """A name as an error message may repeat it: whole if short, else its start."""
    return name if len(name) <= limit else f"{name[:limit]}… ({len(name)} characters)"
