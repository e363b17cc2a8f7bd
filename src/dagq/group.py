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
import zlib
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
#: A group of more instances than this is encoded in chunks of this many, each
#: compressed on its own and kept in memory until one of its instances changes
#: (:func:`encode_group`): a new base of a million-instance group, made again and again
#: while it runs, re-encodes the few chunks changed since the last one, not every
#: instance (~0.25 s of CPU at half done, some 60 us a completed instance).
CHUNK = 16384


class Group:
    """The instances of one expanded foreach task."""

    __slots__ = (
        "attempt",
        "chunk",
        "dispatched_at",
        "encoded",
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
        #: Instances a chunk (see :data:`CHUNK`); the bytes of each chunk encoded since
        #: its instances last changed (:meth:`stale` drops them), by chunk number.
        self.chunk = CHUNK
        self.encoded: dict[int, bytes] = {}

    def stale(self, k: int) -> None:
        """Instance ``k`` changed: its chunk's bytes are no longer its record.

        Whatever changes an instance says so (``RunState.touch_item``, a replayed delta),
        as a delta needs it to: so a chunk kept here is what encoding it again would give.
        """
        if self.encoded:
            self.encoded.pop(k // self.chunk, None)

    def stale_all(self) -> None:
        """The group changed as a whole (cancelled, retried): no chunk is kept."""
        self.encoded.clear()

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


class _ChunkedDoc(msgspec.Struct, array_like=True):
    """A group of more than ``size`` instances: its records by chunks of ``size``, each
    compressed (a :class:`_ChunkDoc`)."""

    n: int
    items: list[Any] | None
    items_ref: str | None
    size: int
    chunks: list[bytes]


class _ChunkDoc(msgspec.Struct, array_like=True):
    """The records of one chunk of instances (their outputs, errors... by instance)."""

    status: bytes
    attempt: bytes
    dispatched_at: bytes
    started_at: bytes
    finished_at: bytes
    outputs: dict[int, Any]
    output_refs: dict[int, str]
    errors: dict[int, str]
    retry_base: dict[int, int]


#: The first byte of an encoded :class:`_ChunkedDoc` (a msgpack array of its fields; a
#: :class:`_GroupDoc` has more).
_CHUNKED = bytes([0x90 | len(_ChunkedDoc.__struct_fields__)])


@functools.cache
def _chunk_decoders() -> tuple[
    msgspec.msgpack.Decoder[_ChunkedDoc], msgspec.msgpack.Decoder[_ChunkDoc]
]:
    return msgspec.msgpack.Decoder(_ChunkedDoc), msgspec.msgpack.Decoder(_ChunkDoc)


def is_chunked(group: Group) -> bool:
    """Is this group encoded in chunks, compressed one by one?"""
    return group.n > group.chunk


def precompressed(data: bytes) -> int:
    """How many of :func:`encode_group` bytes are compressed already (by chunks)."""
    return len(data) if data[:1] == _CHUNKED else 0


def encode_group(group: Group) -> bytes:
    """A group as bytes: compressed with the rest of the state it travels in, or, for a
    large one, by chunks compressed here (:data:`CHUNK`), reusing those unchanged since
    they were last encoded."""
    if is_chunked(group):
        return _encode_chunked(group)
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


def _encode_chunked(group: Group) -> bytes:
    size, kept = group.chunk, group.encoded
    chunks = []
    for c in range(-(-group.n // size)):
        data = kept.get(c)
        if data is None:
            data = kept[c] = _encode_chunk(group, c * size, min(group.n, (c + 1) * size))
        chunks.append(data)
    return _encoder.encode(_ChunkedDoc(group.n, group.items, group.items_ref, size, chunks))


def _encode_chunk(group: Group, lo: int, hi: int) -> bytes:
    chunk = _ChunkDoc(
        status=bytes(group.status[lo:hi]),
        attempt=group.attempt[lo:hi].tobytes(),
        dispatched_at=group.dispatched_at[lo:hi].tobytes(),
        started_at=group.started_at[lo:hi].tobytes(),
        finished_at=group.finished_at[lo:hi].tobytes(),
        outputs=_within(group.outputs, lo, hi),
        output_refs=_within(group.output_refs, lo, hi),
        errors=_within(group.errors, lo, hi),
        retry_base=_within(group.retry_base, lo, hi),
    )
    return zlib.compress(_encoder.encode(chunk), 1)


def _within(column: dict[int, T], lo: int, hi: int) -> dict[int, T]:
    """The entries of a sparse column for instances ``lo`` to ``hi`` (walking whichever
    is shorter: the column, or the range)."""
    if len(column) < hi - lo:
        return {k: v for k, v in column.items() if lo <= k < hi}
    return {k: column[k] for k in range(lo, hi) if k in column}


def decode_group(data: bytes) -> Group:
    """A group from :func:`encode_group` bytes."""
    if data[:1] == _CHUNKED:
        return _decode_chunked(data)
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


def _decode_chunked(data: bytes) -> Group:
    outer, inner = _chunk_decoders()
    doc = outer.decode(data)
    if doc.size < 1 or len(doc.chunks) != -(-doc.n // doc.size):
        raise ValueError(f"a foreach group is damaged: {len(doc.chunks)} chunks for {doc.n}")
    group = Group(0, doc.items, doc.items_ref)
    group.n, group.chunk = doc.n, doc.size
    for c, packed in enumerate(doc.chunks):
        chunk = inner.decode(zlib.decompress(packed))
        group.status += chunk.status
        group.attempt.frombytes(chunk.attempt)
        group.dispatched_at.frombytes(chunk.dispatched_at)
        group.started_at.frombytes(chunk.started_at)
        group.finished_at.frombytes(chunk.finished_at)
        group.outputs.update(chunk.outputs)
        group.output_refs.update(chunk.output_refs)
        group.errors.update(chunk.errors)
        group.retry_base.update(chunk.retry_base)
        group.encoded[c] = packed  # what encoding it again would give
    columns = (group.status, group.attempt, group.dispatched_at, group.started_at)
    if any(len(column) != doc.n for column in (*columns, group.finished_at)):
        raise ValueError(f"a foreach group is damaged: its chunks do not hold {doc.n} records")
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
        group.stale(k)
    if recount:
        group.recount()


def set_or_drop(column: dict[int, T], values: dict[int, T], key: int) -> None:
    """Take a sparse column's entry from a record: set it, or drop it when absent there."""
    if key in values:
        column[key] = values[key]
    else:
        column.pop(key, None)
