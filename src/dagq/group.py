"""The instances of a ``foreach`` task: one per item of a list known only at run time.

A foreach task expands, when its turn comes, into ``n`` instances (``name[0]``,
``name[1]``, ...). Their runtime state lives here, column-wise like the tasks' own,
beside the task in :class:`~dagq.state.RunState` (``state.groups``). Instances are
dispatched by the group (at most ``max_parallel`` at once), retried like their task,
and the task finishes when every instance has: completed with the list of their
outputs in index order, unless more failed than ``allow_failures`` lets pass.
"""

from __future__ import annotations

import functools
from array import array
from collections import deque
from itertools import compress
from typing import Any, TypeVar

import msgspec

from dagq.state import TERMINAL, UNSET, TaskStatus, counters

T = TypeVar("T")

_PENDING = int(TaskStatus.PENDING)
#: Items up to this size (encoded) ride in the group (and their messages); larger
#: lists are stored once as a document and instances fetch their item from it.
INLINE_ITEMS_LIMIT = 16 * 1024


class Group:
    """The instances of one expanded foreach task."""

    __slots__ = (
        "attempt",
        "dispatched_at",
        "errors",
        "finished_at",
        "items",
        "items_ref",
        "n",
        "output_refs",
        "outputs",
        "retry_base",
        "sent",
        "settled",
        "started_at",
        "status",
        "unsent",
    )

    def __init__(self, n: int, items: list[Any] | None, items_ref: str | None) -> None:
        self.n = n
        self.items = items
        self.items_ref = items_ref
        self.status = bytearray(n)
        self.attempt = counters(n)  # an array: not walked by the collector
        self.dispatched_at = array("d", [UNSET]) * n
        self.started_at = array("d", [UNSET]) * n
        self.finished_at = array("d", [UNSET]) * n
        self.outputs: dict[int, Any] = {}
        self.output_refs: dict[int, str] = {}
        self.errors: dict[int, str] = {}
        self.retry_base: dict[int, int] = {}
        # --- derived (``recount``), never stored
        self.sent = 0
        self.settled = 0
        self.unsent: deque[int] = deque(range(n))

    def recount(self) -> None:
        """Rebuild the derived counters from the stored columns (C loops: a group may
        have a million instances, and each delta replayed recounts)."""
        self.sent = self.in_flight()
        self.settled = sum(self.status.count(s) for s in TERMINAL)
        self.unsent = deque(self.pending())

    def in_flight(self) -> int:
        """Instances sent and not finished."""
        return self.status.count(TaskStatus.READY) + self.status.count(TaskStatus.RUNNING)

    def pending(self) -> list[int]:
        """Instances not sent yet, in index order."""
        return list(compress(range(self.n), map(_PENDING.__eq__, self.status)))

    def done(self) -> bool:
        """Has every instance finished for good?"""
        return self.settled == self.n

    def settle(self, k: int, status: TaskStatus) -> None:
        """Instance ``k`` finished for good with ``status``."""
        if self.status[k] not in TERMINAL:
            self.settled += 1
        self.status[k] = status

    def failed(self) -> list[int]:
        """The indexes of failed instances."""
        return [k for k, s in enumerate(self.status) if s == TaskStatus.FAILED]

    def counts(self) -> dict[str, int]:
        """Instances per status label."""
        found: dict[str, int] = {}
        for s in self.status:
            label = TaskStatus(s).label
            found[label] = found.get(label, 0) + 1
        return found


class _GroupDoc(msgspec.Struct, array_like=True):
    n: int
    items: list[Any] | None
    items_ref: str | None
    status: bytes
    attempt: list[int]
    dispatched_at: bytes
    started_at: bytes
    finished_at: bytes
    outputs: dict[int, Any]
    output_refs: dict[int, str]
    errors: dict[int, str]
    retry_base: dict[int, int]


_encoder = msgspec.msgpack.Encoder()


@functools.cache
def _decoder() -> msgspec.msgpack.Decoder[_GroupDoc]:
    """Built on first use (see :mod:`dagq.messages`)."""
    return msgspec.msgpack.Decoder(_GroupDoc)


def encode_group(group: Group) -> bytes:
    """A group as bytes (compressed with the rest of the state it travels in)."""
    return _encoder.encode(
        _GroupDoc(
            n=group.n,
            items=group.items,
            items_ref=group.items_ref,
            status=bytes(group.status),
            attempt=group.attempt.tolist(),
            dispatched_at=group.dispatched_at.tobytes(),
            started_at=group.started_at.tobytes(),
            finished_at=group.finished_at.tobytes(),
            outputs=group.outputs,
            output_refs=group.output_refs,
            errors=group.errors,
            retry_base=group.retry_base,
        )
    )


def decode_group(data: bytes) -> Group:
    """A group from :func:`encode_group` bytes."""
    doc = _decoder().decode(data)
    group = Group(doc.n, doc.items, doc.items_ref)
    group.status = bytearray(doc.status)
    group.attempt = array("q", doc.attempt)
    for name in ("dispatched_at", "started_at", "finished_at"):
        column = array("d")
        column.frombytes(getattr(doc, name))
        if len(column) != doc.n:
            raise ValueError(f"a foreach group is damaged: {len(column)} times for {doc.n}")
        setattr(group, name, column)
    group.outputs = doc.outputs
    group.output_refs = doc.output_refs
    group.errors = doc.errors
    group.retry_base = doc.retry_base
    group.recount()
    return group


class _ItemsDoc(msgspec.Struct, array_like=True):
    """The full records of some instances of a group (what a delta carries)."""

    items: list[int]
    status: bytes
    attempt: list[int]
    times: bytes
    outputs: dict[int, Any]
    output_refs: dict[int, str]
    errors: dict[int, str]
    retry_base: dict[int, int]


@functools.cache
def _items_decoder() -> msgspec.msgpack.Decoder[_ItemsDoc]:
    """Built on first use (see :mod:`dagq.messages`)."""
    return msgspec.msgpack.Decoder(_ItemsDoc)


def encode_items(group: Group, items: set[int]) -> bytes:
    """The records of the instances ``items`` of a group."""
    order = sorted(items)
    times = array("d")
    for k in order:
        times.extend((group.dispatched_at[k], group.started_at[k], group.finished_at[k]))
    return _encoder.encode(
        _ItemsDoc(
            items=order,
            status=bytes(group.status[k] for k in order),
            attempt=[group.attempt[k] for k in order],
            times=times.tobytes(),
            outputs={k: group.outputs[k] for k in order if k in group.outputs},
            output_refs={k: group.output_refs[k] for k in order if k in group.output_refs},
            errors={k: group.errors[k] for k in order if k in group.errors},
            retry_base={k: group.retry_base[k] for k in order if k in group.retry_base},
        )
    )


def apply_items(group: Group, data: bytes, *, recount: bool = True) -> None:
    """Replay instance records onto a group (a later record wins); ``recount=False``
    leaves its derived counters to the caller (one :meth:`Group.recount` after many
    deltas, not one a delta: each walks every instance)."""
    doc = _items_decoder().decode(data)
    times = array("d")
    times.frombytes(doc.times)
    for n, k in enumerate(doc.items):
        group.status[k] = doc.status[n]
        group.attempt[k] = doc.attempt[n]
        group.dispatched_at[k], group.started_at[k], group.finished_at[k] = times[3 * n : 3 * n + 3]
        set_or_drop(group.outputs, doc.outputs, k)
        set_or_drop(group.output_refs, doc.output_refs, k)
        set_or_drop(group.errors, doc.errors, k)
        set_or_drop(group.retry_base, doc.retry_base, k)
    if recount:
        group.recount()


def set_or_drop(column: dict[int, T], values: dict[int, T], key: int) -> None:
    """Take a sparse column's entry from a record: set it, or drop it when absent there."""
    if key in values:
        column[key] = values[key]
    else:
        column.pop(key, None)
