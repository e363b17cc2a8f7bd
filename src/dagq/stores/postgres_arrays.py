"""Array parameters of the PostgreSQL store, encoded here in PostgreSQL's binary format.

A batch's statement passes its messages, documents and index rows as arrays
(``unnest``); psycopg's own list dumper inspects a list's elements and picks a dumper
for them in Python at every call, some 10-20 us an array, and a commit passes up to a
dozen. :func:`text_array`, :func:`bytea_array` and :func:`float8_array` build the
binary form directly (``struct``), and the dumpers of :data:`ADAPTERS`, the adapters
of every connection of the store, pass it on as it is. Use them with ``%b``.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg.adapt import AdaptersMap, Dumper
from psycopg.pq import Format

#: Type OIDs of the element types and of their arrays.
_TEXT, _TEXT_ARRAY = 25, 1009
_BYTEA, _BYTEA_ARRAY = 17, 1001
_FLOAT8, _FLOAT8_ARRAY = 701, 1022

#: Dimensions, has-nulls flag, element type; then for the one dimension its length and
#: lower bound (1).
_HEAD = struct.Struct("!iiiii")
_EMPTY = struct.Struct("!iii")
_LENGTH = struct.Struct("!i")
_NULL = _LENGTH.pack(-1)
_FLOAT8_ITEM = struct.Struct("!id")
#: The head of a one-element array of each element type (most arrays of a chain's step).
_ONE = {oid: _HEAD.pack(1, 0, oid, 1, 1) for oid in (_TEXT, _BYTEA)}


class EncodedArray:
    """An array parameter in PostgreSQL's binary format."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


class TextArray(EncodedArray):
    """A ``text[]`` parameter."""

    __slots__ = ()


class ByteaArray(EncodedArray):
    """A ``bytea[]`` parameter."""

    __slots__ = ()


class Float8Array(EncodedArray):
    """A ``float8[]`` parameter."""

    __slots__ = ()


def _encode(oid: int, items: Sequence[bytes | None]) -> bytes:
    if not items:
        return _EMPTY.pack(0, 0, oid)
    nulls = any(item is None for item in items)
    parts = [_HEAD.pack(1, int(nulls), oid, len(items), 1)]
    pack = _LENGTH.pack
    for item in items:
        if item is None:
            parts.append(_NULL)
        else:
            parts.append(pack(len(item)))
            parts.append(item)
    return b"".join(parts)


def text_array(items: Sequence[str | None]) -> TextArray:
    """``items`` as a ``text[]`` parameter (None: NULL)."""
    if len(items) == 1 and items[0] is not None:
        item = items[0].encode()
        return TextArray(_ONE[_TEXT] + _LENGTH.pack(len(item)) + item)
    return TextArray(_encode(_TEXT, [None if s is None else s.encode() for s in items]))


def bytea_array(items: Sequence[bytes | bytearray | memoryview]) -> ByteaArray:
    """``items`` as a ``bytea[]`` parameter."""
    if len(items) == 1:
        item = bytes(items[0])
        return ByteaArray(_ONE[_BYTEA] + _LENGTH.pack(len(item)) + item)
    return ByteaArray(_encode(_BYTEA, [bytes(b) for b in items]))


def float8_array(items: Sequence[float]) -> Float8Array:
    """``items`` as a ``float8[]`` parameter."""
    if not items:
        return Float8Array(_EMPTY.pack(0, 0, _FLOAT8))
    pack = _FLOAT8_ITEM.pack
    head = _HEAD.pack(1, 0, _FLOAT8, len(items), 1)
    return Float8Array(head + b"".join(pack(8, float(x)) for x in items))


class _EncodedDumper(Dumper):
    format = Format.BINARY

    def dump(self, obj: Any) -> bytes:
        data: bytes = obj.data
        return data


class _TextArrayDumper(_EncodedDumper):
    oid = _TEXT_ARRAY


class _ByteaArrayDumper(_EncodedDumper):
    oid = _BYTEA_ARRAY


class _Float8ArrayDumper(_EncodedDumper):
    oid = _FLOAT8_ARRAY


#: The adapters of the store's connections: psycopg's, and the arrays above.
ADAPTERS = AdaptersMap(psycopg.adapters)
ADAPTERS.register_dumper(TextArray, _TextArrayDumper)
ADAPTERS.register_dumper(ByteaArray, _ByteaArrayDumper)
ADAPTERS.register_dumper(Float8Array, _Float8ArrayDumper)
