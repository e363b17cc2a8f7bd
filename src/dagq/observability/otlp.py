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
from typing import Any

from dagq.observability.tracing import Kind, Record

_Q = struct.Struct("<Q").pack  # fixed64
_D = struct.Struct("<d").pack  # double
_I = struct.Struct("<I").pack  # fixed32
_SHORT = [bytes((n,)) for n in range(128)]  # a varint below 128 is one byte

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

    def request(self, records: Iterable[Record]) -> bytes:
        """The serialized request carrying ``records`` (one resource, one scope)."""
        span = self.span
        scope_spans = self.scope + b"".join([field(0x12, span(r)) for r in records])
        resource_spans = self.resource + field(0x12, scope_spans) + self.resource_schema_url
        return field(0x0A, resource_spans)

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
