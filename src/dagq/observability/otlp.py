"""dagq's span records as an OTLP/HTTP request, encoded directly (docs/architecture.md §7).

The span-exporting helper (:mod:`dagq.observability.exporting`) receives finished spans
as plain tuples (:data:`tracing.Record`). Making each an SDK span and having the
standard exporter encode it cost ~80 µs of CPU a span, three spans an attempt. This
module writes the protobuf ``ExportTraceServiceRequest`` of the same spans straight
from the tuples: the same message the SDK's encoder makes for them (the tests decode
both with the ``opentelemetry-proto`` classes and compare), in a few microseconds a
span. What repeats is encoded once and kept: the resource and scope (by the generated
messages), trace ids, span names, and each attribute's key and value.

The wire format (protobuf): a field is a tag (field number << 3 | wire type) and its
value; wire type 0 a varint, 1 eight bytes little-endian, 2 a length-delimited value
(a string, bytes, or a nested message), 5 four bytes little-endian. The field numbers
are those of ``opentelemetry/proto/trace/v1/trace.proto`` and its imports.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dagq.observability.tracing import (
    RAN_FIELDS,
    Emitted,
    Kind,
    Ran,
    Record,
    Sends,
    Shape,
    Shaped,
    wait_span_id,
)

_Q = struct.Struct("<Q").pack  # fixed64
_D = struct.Struct("<d").pack  # double
_I = struct.Struct("<I").pack  # fixed32
_SHORT = [bytes((n,)) for n in range(128)]  # a varint below 128 is one byte
#: Span.span_id (2), alone or with Span.parent_span_id (4); a link's span id.
_SPAN = struct.Struct(">HQ").pack
_SPAN_PARENT = struct.Struct(">HQHQ").pack
#: Span.start_time_unix_nano (7) and end_time_unix_nano (8), fixed64 each.
_TIMES = struct.Struct("<BQBQ").pack

#: Span.SpanKind
KINDS: dict[Kind, bytes] = {
    "internal": b"\x30\x01",
    "server": b"\x30\x02",
    "client": b"\x30\x03",
    "producer": b"\x30\x04",
    "consumer": b"\x30\x05",
}
#: SpanFlags: whether the parent's (or a link's) context is remote is known (0x100),
#: and it is (0x200); dagq's parents and links are contexts made from ids, remote.
_FLAGS_ROOT = b"\x85\x01" + _I(0x100)  # Span.flags (16, fixed32)
_FLAGS_REMOTE_PARENT = b"\x85\x01" + _I(0x300)
_LINK_FLAGS = b"\x35" + _I(0x300)  # Span.Link.flags (6, fixed32)
#: Span.status (15): unset (an empty Status), or code ERROR (Status.code, 3).
_STATUS_UNSET = b"\x7a\x00"
_STATUS_ERROR = b"\x7a\x02\x18\x02"
#: Entries a cache keeps before it starts again (ids and values of finished runs).
_CACHE_LIMIT = 65536


def varint(n: int) -> bytes:
    """``n`` (below 2**64) as a protobuf varint."""
    if n < 128:
        return _SHORT[n]
    out = bytearray()
    while n >= 128:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def field(tag: int, body: bytes) -> bytes:
    """A length-delimited field: its tag byte (field number << 3 | 2), length, body."""
    size = len(body)
    return bytes((tag,)) + (_SHORT[size] if size < 128 else varint(size)) + body


def any_value(value: object) -> bytes:
    """An ``AnyValue``'s bytes, as the SDK's encoder makes them from a span attribute."""
    if isinstance(value, bool):  # before int: a bool is one
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, str):
        return field(0x0A, value.encode())
    if isinstance(value, int):
        return b"\x18" + varint(value & 0xFFFFFFFFFFFFFFFF)  # int64: two's complement
    if isinstance(value, float):
        return b"\x21" + _D(value)
    return _generated_value(value)


def _generated_value(value: object) -> bytes:
    # Anything else (bytes, a sequence, a mapping): dagq's own spans have none, so the
    # generated messages make it, as the SDK does.
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValueList

    def message(v: Any) -> AnyValue:
        if v is None:
            return AnyValue()
        if isinstance(v, bool):
            return AnyValue(bool_value=v)
        if isinstance(v, str):
            return AnyValue(string_value=v)
        if isinstance(v, int):
            return AnyValue(int_value=v)
        if isinstance(v, float):
            return AnyValue(double_value=v)
        if isinstance(v, bytes):
            return AnyValue(bytes_value=v)
        if isinstance(v, Mapping):
            return AnyValue(kvlist_value=KeyValueList(values=[_pair(k, x) for k, x in v.items()]))
        if isinstance(v, Sequence):
            return AnyValue(array_value=ArrayValue(values=[message(x) for x in v]))
        raise TypeError(f"an attribute value of type {type(v).__name__} cannot be encoded")

    def _pair(key: str, v: Any) -> Any:
        from opentelemetry.proto.common.v1.common_pb2 import KeyValue

        return KeyValue(key=key, value=message(v))

    return bytes(message(value).SerializeToString())


def key_value(key: str, value: object) -> bytes:
    """A ``KeyValue`` message's bytes."""
    return field(0x0A, key.encode()) + field(0x12, any_value(value))


class Encoder:
    """Writes ``ExportTraceServiceRequest`` messages for span records of one resource
    and one instrumentation scope (dagq's)."""

    def __init__(
        self,
        resource: Mapping[str, object],
        *,
        resource_schema_url: str = "",
        scope_name: str = "dagq",
        scope_version: str = "",
    ) -> None:
        self.resource = field(
            0x0A, b"".join(field(0x0A, key_value(k, v)) for k, v in resource.items())
        )
        self.resource_schema_url = (
            field(0x1A, resource_schema_url.encode()) if resource_schema_url else b""
        )
        scope = field(0x0A, scope_name.encode()) + (
            field(0x12, scope_version.encode()) if scope_version else b""
        )
        self.scope = field(0x0A, scope)
        self._traces: dict[int, bytes] = {}
        self._names: dict[str, bytes] = {}
        self._attributes: dict[tuple[str, object, type], bytes] = {}
        self._shapes: dict[Shape, _ShapeBlocks] = {}
        self._tasks: dict[str, bytes] = {}

    def request(self, records: Iterable[Emitted]) -> bytes:
        """The serialized request carrying ``records`` (one resource, one scope), the
        spans of a record that holds several (:func:`tracing.spans_of`) one after the
        other."""
        span = self.span
        # Each shape's blocks, by the shape's identity within this request (the records
        # hold the shapes meanwhile): one dict lookup a span, no tuple hashed.
        seen: dict[int, _ShapeBlocks] = {}
        pieces = [self.scope]
        add = pieces.append
        heads = _SPAN_HEADS
        for record in records:
            if type(record[0]) is str:
                bodies: Sequence[bytes] = (span(record),)
            else:
                size = len(record)
                if size == 9:
                    bodies = (self.shaped(record, seen),)  # type: ignore[arg-type]
                elif size == 4:
                    bodies = self.ran(record, seen)  # type: ignore[arg-type]
                else:
                    bodies = self.sends(record, seen)  # type: ignore[arg-type]
            for body in bodies:
                size = len(body)
                add(heads[size] if size < len(heads) else b"\x12" + varint(size))
                add(body)
        scope_spans = b"".join(pieces)
        resource_spans = self.resource + field(0x12, scope_spans) + self.resource_schema_url
        return field(0x0A, resource_spans)

    def _blocks(self, shape: Shape, seen: dict[int, _ShapeBlocks] | None) -> _ShapeBlocks:
        """A shape's blocks (``seen``: those of this request, by the shape's identity)."""
        blocks = None if seen is None else seen.get(id(shape))
        if blocks is None:
            # Kept by value across requests, unless a value is a float: 0.0 and -0.0
            # are equal, not the same double (dagq's shapes hold strings).
            kept = not any(type(value) is float for _, value in shape[3])
            blocks = self._shapes.get(shape) if kept else None
            if blocks is None:
                blocks = _ShapeBlocks.of(shape)
                if kept:
                    if len(self._shapes) >= _CACHE_LIMIT:
                        self._shapes.clear()
                    self._shapes[shape] = blocks
            if seen is not None:
                seen[id(shape)] = blocks
        return blocks

    def _task(self, task: str) -> bytes:
        """A ``dagq.task.name`` attribute's field (kept: names repeat across attempts)."""
        task_field = self._tasks.get(task)
        if task_field is None:
            if len(self._tasks) >= _CACHE_LIMIT:
                self._tasks.clear()
            task_field = self._tasks[task] = _task_field(task)
        return task_field

    def shaped(self, record: Shaped, seen: dict[int, _ShapeBlocks] | None = None) -> bytes:
        """One ``Span`` message's bytes, of a :data:`Shaped` span: the bytes of
        :meth:`span` for the :data:`Record` it stands for, from blocks made once a shape
        (``seen``: those of this request, by the shape's identity)."""
        shape, span_id, parent, start_s, end_s, task, attempt, linked, error = record
        return _shaped(
            self._blocks(shape, seen),
            span_id,
            parent,
            start_s,
            end_s,
            task_field=self._task(task),
            attempt_field=(
                _ATTEMPTS[attempt] if 0 <= attempt < len(_ATTEMPTS) else _attempt_field(attempt)
            ),
            linked=linked,
            error=error,
        )

    def ran(self, record: Ran, seen: dict[int, _ShapeBlocks] | None = None) -> list[bytes]:
        """The spans' bytes of a :data:`Ran` record (as :meth:`shaped` writes each of
        :func:`tracing.ran`), each attempt's task and attempt attributes made once for
        both its spans."""
        process, wait, parent, flat = record
        process_blocks, wait_blocks = self._blocks(process, seen), self._blocks(wait, seen)
        out: list[bytes] = []
        for i in range(0, len(flat), RAN_FIELDS):
            span_id, sent, start_s, end_s, task, attempt, error, due_s, received_s = flat[
                i : i + RAN_FIELDS
            ]
            task_field = self._task(task)
            attempt_field = (
                _ATTEMPTS[attempt] if 0 <= attempt < len(_ATTEMPTS) else _attempt_field(attempt)
            )
            if sent and due_s:
                out.append(
                    _shaped(
                        wait_blocks,
                        wait_span_id(span_id),
                        sent,
                        due_s,
                        received_s,
                        task_field=task_field,
                        attempt_field=attempt_field,
                        linked=0,
                        error=None,
                    )
                )
            out.append(
                _shaped(
                    process_blocks,
                    span_id,
                    parent,
                    start_s,
                    end_s,
                    task_field=task_field,
                    attempt_field=attempt_field,
                    linked=sent,
                    error=error,
                )
            )
        return out

    def sends(self, record: Sends, seen: dict[int, _ShapeBlocks] | None = None) -> list[bytes]:
        """The ``send`` spans' bytes of a :data:`Sends` record (as :meth:`shaped` writes
        each of :func:`tracing.sends`): what they share — all but their ids, names and
        attempts — written once."""
        shape, parent, start_s, end_s, flat = record
        blocks = self._blocks(shape, seen)
        start_ns = int(start_s * 1e9)
        end_ns = int(end_s * 1e9)
        # Between a span's ids and its task name; after its attempt.
        middle = (
            blocks.name_kind
            + _TIMES(0x39, start_ns, 0x41, end_ns if end_ns > start_ns else start_ns)
            + blocks.common
        )
        tail = _STATUS_UNSET + _FLAGS_REMOTE_PARENT
        trace, task_of, attempts = blocks.trace, self._task, _ATTEMPTS
        out = []
        for i in range(0, len(flat), 3):
            attempt: int = flat[i + 2]  # type: ignore[assignment]
            out.append(
                b"".join(
                    (
                        trace,
                        _SPAN_PARENT(0x1208, flat[i], 0x2208, parent),
                        middle,
                        task_of(flat[i + 1]),  # type: ignore[arg-type]
                        attempts[attempt]
                        if 0 <= attempt < len(attempts)
                        else _attempt_field(attempt),
                        tail,
                    )
                )
            )
        return out

    def span(self, record: Record) -> bytes:
        """One ``Span`` message's bytes."""
        name, trace, span_id, parent, kind, attributes, links, start_ns, end_ns, error = record
        trace_field = self._traces.get(trace)
        if trace_field is None:
            if len(self._traces) >= _CACHE_LIMIT:
                self._traces.clear()
            trace_field = self._traces[trace] = b"\x0a\x10" + trace.to_bytes(16, "big")
        name_field = self._names.get(name)
        if name_field is None:
            if len(self._names) >= _CACHE_LIMIT:
                self._names.clear()
            name_field = self._names[name] = field(0x2A, name.encode())
        parts = [trace_field, b"\x12\x08", span_id.to_bytes(8, "big")]
        if parent is not None:
            parts += (b"\x22\x08", parent.to_bytes(8, "big"))
        parts += (name_field, KINDS[kind], b"\x39", _Q(start_ns), b"\x41", _Q(end_ns))
        if error is not None:
            attributes = {**(attributes or {}), "error.type": error}
        if attributes:
            cache = self._attributes
            for key, value in attributes.items():
                # A float by its bits: 0.0 and -0.0 are equal, not the same double.
                entry = (key, _D(value) if type(value) is float else value, type(value))
                try:
                    encoded = cache.get(entry)
                except TypeError:  # an unhashable value: not kept
                    parts.append(field(0x4A, key_value(key, value)))
                    continue
                if encoded is None:
                    if len(cache) >= _CACHE_LIMIT:
                        cache.clear()
                    encoded = cache[entry] = field(0x4A, key_value(key, value))
                parts.append(encoded)
        for trace_id, linked in links:
            link = (
                b"\x0a\x10" + trace_id.to_bytes(16, "big") + b"\x12\x08" + linked.to_bytes(8, "big")
            )
            parts.append(field(0x6A, link + _LINK_FLAGS))
        parts.append(_STATUS_UNSET if error is None else _STATUS_ERROR)
        parts.append(_FLAGS_ROOT if parent is None else _FLAGS_REMOTE_PARENT)
        return b"".join(parts)


def _shaped(
    blocks: _ShapeBlocks,
    span_id: int,
    parent: int | None,
    start_s: float,
    end_s: float,
    *,
    task_field: bytes,
    attempt_field: bytes,
    linked: int,
    error: str | None,
) -> bytes:
    """A shaped span's bytes (:meth:`Encoder.shaped`)."""
    start_ns = int(start_s * 1e9)
    end_ns = int(end_s * 1e9)
    parts = [
        blocks.trace,
        _SPAN(0x1208, span_id) if parent is None else _SPAN_PARENT(0x1208, span_id, 0x2208, parent),
        blocks.name_kind,
        _TIMES(0x39, start_ns, 0x41, end_ns if end_ns > start_ns else start_ns),
        blocks.common,
        task_field,
        attempt_field,
    ]
    if error is not None:
        parts.append(field(0x4A, key_value("error.type", error)))
    if linked:
        parts += (blocks.link, _SPAN(0x1208, linked), _LINK_FLAGS)
    parts.append(_STATUS_UNSET if error is None else _STATUS_ERROR)
    parts.append(_FLAGS_ROOT if parent is None else _FLAGS_REMOTE_PARENT)
    return b"".join(parts)


def _task_field(task: str) -> bytes:
    """A ``dagq.task.name`` attribute (as :func:`key_value` writes it, without its
    checks: one is made for each task)."""
    value = task.encode()
    any_value = b"\x0a" + varint(len(value)) + value
    pair = _TASK_KEY + varint(len(any_value)) + any_value
    return b"\x4a" + varint(len(pair)) + pair


_TASK_KEY = field(0x0A, b"dagq.task.name") + b"\x12"


def _attempt_field(attempt: int) -> bytes:
    return field(0x4A, key_value("dagq.attempt", attempt))


#: ScopeSpans.spans (2) up to a span's bytes, by their length (below 4 KiB).
_SPAN_HEADS = [b"\x12" + varint(n) for n in range(4096)]
#: ``dagq.attempt`` attributes of the first attempts, made once.
_ATTEMPTS = [_attempt_field(n) for n in range(64)]


@dataclass(frozen=True, slots=True)
class _ShapeBlocks:
    """What the spans of one :data:`tracing.Shape` share, encoded."""

    #: Span.trace_id (1).
    trace: bytes
    #: Span.name (5) and Span.kind (6).
    name_kind: bytes
    #: The shape's attributes (9, each).
    common: bytes
    #: A Span.links (13) field up to its span id: its length, the trace id.
    link: bytes

    @classmethod
    def of(cls, shape: Shape) -> _ShapeBlocks:
        name, kind, trace, common = shape
        trace_field = b"\x0a\x10" + trace.to_bytes(16, "big")
        link_size = len(trace_field) + 10 + len(_LINK_FLAGS)  # trace, span id, flags
        return cls(
            trace=trace_field,
            name_kind=field(0x2A, name.encode()) + KINDS[kind],
            common=b"".join(field(0x4A, key_value(k, v)) for k, v in common),
            link=b"\x6a" + varint(link_size) + trace_field,
        )
