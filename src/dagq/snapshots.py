"""How a runtime state becomes bytes, and back: a header, task columns, and deltas.

The state document (the commit point, written under compare-and-swap) is a *header*:
the workflow's own fields, plus either

* the task columns themselves (``inline``) — small workflows; or
* the key of a *base* snapshot of the task columns and the keys of the *deltas*
  written since, each holding only the tasks a flush changed.

So a flush of a 100,000-task workflow writes a delta proportional to what changed,
not megabytes; every so often the deltas are folded into a new base. Everything here
is pure: :mod:`dagq.persistence` does the reading and writing.
"""

import operator
import sys
import zlib
from array import array
from collections.abc import Iterable
from typing import Any, TypeVar

import msgspec

from dagq.group import (
    apply_items,
    decode_group,
    encode_group,
    encode_items,
    is_chunked,
    precompressed,
    set_or_drop,
)
from dagq.plan import Plan
from dagq.state import RunState, dispatch_key, dispatch_parts

#: The format of the states written: 3, or 4 when a foreach group is stored by chunks
#: (:data:`dagq.group.CHUNK`), which code that reads only 3 cannot read (it says so).
FORMAT_VERSION = 3
CHUNKED_VERSION = 4
READABLE_VERSIONS = (FORMAT_VERSION, CHUNKED_VERSION)
T = TypeVar("T")


class Unconfirmed(msgspec.Struct, array_like=True):
    """Dispatches whose sends were not yet confirmed: task indexes, foreach instances
    (item indexes by task) and undos, as compressed arrays of indexes."""

    tasks: bytes = b""
    items: dict[int, bytes] = msgspec.field(default_factory=dict)
    undos: list[int] = msgspec.field(default_factory=list)


class Header(msgspec.Struct, array_like=True, kw_only=True):
    """The state document: the workflow's fields and where its task columns are."""

    version: int
    workflow_id: str
    n_tasks: int
    status: str
    created_at: float
    updated_at: float
    finished_at: float
    error: str | None
    cancel_reason: str | None
    cancelled_at: float
    final_on_cancel: str
    history_seq: int
    epoch: int = 0
    #: Only read, from documents written before ``signal_queue``; written empty.
    signals: dict[str, Any] = msgspec.field(default_factory=dict)
    undo_order: list[int] = msgspec.field(default_factory=list)
    compensate_after: str = ""
    inline: bytes | None = None
    base: str | None = None
    deltas: list[str] = msgspec.field(default_factory=list)
    base_bytes: int = 0
    delta_bytes: int = 0
    unconfirmed: Unconfirmed | None = None
    #: Ids of the requests applied last (``RunState.requests``).
    requests: list[str] = msgspec.field(default_factory=list)
    #: Signals no wait has taken yet, by name, oldest first. (Documents written before
    #: this field keep one signal per name in ``signals`` instead.)
    signal_queue: dict[str, list[Any]] = msgspec.field(default_factory=dict)
    #: The last history chunks (``RunState.history_tail``), not in documents of their
    #: own. (Documents written before this field have every chunk in its own.)
    history_tail: list[bytes] = msgspec.field(default_factory=list)


class _Sparse(msgspec.Struct, array_like=True):
    """The per-task columns most tasks leave empty."""

    outputs: dict[int, Any]
    output_refs: dict[int, str]
    errors: dict[int, str]
    retry_base: dict[int, int]
    wake_at: dict[int, float]
    iteration: dict[int, int]
    round_started: dict[int, float]
    delay_spent: dict[int, float]
    stop_requests: dict[int, int]
    undo_status: dict[int, int]
    undo_attempt: dict[int, int]


_SPARSE = _Sparse.__struct_fields__


class _Tasks(msgspec.Struct, array_like=True):
    task_status: bytes
    attempt: list[int]
    dispatched_at: bytes
    started_at: bytes
    task_finished_at: bytes
    sparse: _Sparse
    groups: dict[int, bytes] = msgspec.field(default_factory=dict)


class _Delta(msgspec.Struct, array_like=True):
    """The complete per-task record of every task a flush changed (absent = none)."""

    tasks: list[int]
    task_status: bytes
    attempt: list[int]
    times: bytes
    sparse: _Sparse
    groups: dict[int, bytes] = msgspec.field(default_factory=dict)
    items: dict[int, bytes] = msgspec.field(default_factory=dict)


_encoder = msgspec.msgpack.Encoder()
_header = msgspec.msgpack.Decoder(Header)
_tasks = msgspec.msgpack.Decoder(_Tasks)
_delta = msgspec.msgpack.Decoder(_Delta)


#: Up to this size, data is compressed with a window and hash table sized to it.
SMALL_BYTES = 16 * 1024


def _compress(data: bytes) -> bytes:
    """Level 1: as small as 6 on these columns, twice as fast.

    Small data (a small workflow's columns, every flush) gets a window no larger than
    itself and a hash table to match: zlib's defaults allocate ~256 KiB a call, which
    the C library maps fresh from the kernel each time — ~100 us of CPU in page faults
    to compress 200 bytes, ten times the work itself. Any zlib reader reads either.
    """
    if len(data) > SMALL_BYTES:
        return zlib.compress(data, 1)
    wbits = min(14, max(9, (len(data) - 1).bit_length()))
    packer = zlib.compressobj(1, zlib.DEFLATED, wbits, max(1, wbits - 8))
    return packer.compress(data) + packer.flush()


#: Task columns and deltas encoded in at most this many bytes are stored as they are:
#: compressing them saved ~120 bytes a flush (a 5-task workflow's columns) for ~20 us
#: of CPU, and zlib lets go of the GIL, so a flush on the event loop could wait for
#: another thread's switch interval (ms) to get it back.
RAW_BYTES = 512


def _packed(raw: bytes, compress: bool = True) -> bytes:
    """Msgpack bytes of columns or a delta as stored: as they are when small or when
    ``compress`` is False (they begin with a msgpack array header, never with a zlib
    stream's), else compressed."""
    return _compress(raw) if compress and len(raw) > RAW_BYTES else raw


def _unpacked(data: bytes) -> bytes:
    """The msgpack bytes of :func:`_packed` data (zlib's first byte says ``deflate``
    in its low four bits; a msgpack array header of these structs never does)."""
    return zlib.decompress(data) if data[:1] and data[0] & 0x0F == 8 else data


def _pack(values: "array[float]") -> bytes:
    """Little-endian doubles, whatever this machine's byte order."""
    if sys.byteorder == "big":  # pragma: no cover - every supported platform is little-endian
        values = array("d", values)
        values.byteswap()
    return values.tobytes()


def _unpack(data: bytes, n: int) -> "array[float]":
    values = array("d")
    values.frombytes(data)
    if sys.byteorder == "big":  # pragma: no cover
        values.byteswap()
    if len(values) != n:
        raise ValueError(f"state document is damaged: {len(values)} times for {n} tasks")
    return values


# --- the header ----------------------------------------------------------------------


def header(state: RunState, **where: Any) -> Header:
    """The header of ``state``; ``where`` says where its task columns are."""
    chunked = any(is_chunked(g) for g in state.groups.values()) if state.groups else False
    return Header(
        version=CHUNKED_VERSION if chunked else FORMAT_VERSION,
        workflow_id=state.workflow_id,
        n_tasks=state.n_tasks,
        status=state.status,
        created_at=state.created_at,
        updated_at=state.updated_at,
        finished_at=state.finished_at,
        error=state.error,
        cancel_reason=state.cancel_reason,
        cancelled_at=state.cancelled_at,
        final_on_cancel=state.final_on_cancel,
        history_seq=state.history_seq,
        epoch=state.epoch,
        undo_order=state.undo_order,
        compensate_after=state.compensate_after,
        unconfirmed=_encode_unconfirmed(state.unconfirmed),
        requests=state.requests,
        signal_queue=state.signals,
        history_tail=state.history_tail,
        **where,
    )


def _encode_unconfirmed(keys: set[int] | None) -> Unconfirmed | None:
    if keys is None:
        return None
    tasks: list[int] = []
    items: dict[int, list[int]] = {}
    undos: list[int] = []
    for i, item, undo in map(dispatch_parts, keys):
        if undo:
            undos.append(i)
        elif item >= 0:
            items.setdefault(i, []).append(item)
        else:
            tasks.append(i)
    return Unconfirmed(
        tasks=_indexes(sorted(tasks)),
        items={i: _indexes(sorted(k)) for i, k in items.items()},
        undos=sorted(undos),
    )


def _decode_unconfirmed(found: Unconfirmed | None) -> set[int] | None:
    if found is None:
        return None
    keys = {dispatch_key(i) for i in _unindex(found.tasks)}
    keys |= {dispatch_key(i, k) for i, data in found.items.items() for k in _unindex(data)}
    keys |= {dispatch_key(i, undo=True) for i in found.undos}
    return keys


def _indexes(values: list[int]) -> bytes:
    """Little-endian 32-bit indexes, whatever this machine's byte order: compressed, or
    a few (a flush's dispatches, most often one) as they are behind a zero byte (which
    never begins a zlib stream, see :func:`_unpacked`)."""
    if not values:
        return b""
    packed = array("I", values)
    if sys.byteorder == "big":  # pragma: no cover - every supported platform is little-endian
        packed.byteswap()
    raw = packed.tobytes()
    return b"\x00" + raw if len(raw) <= RAW_BYTES else _compress(raw)


def _unindex(data: bytes) -> list[int]:
    if not data:
        return []
    packed = array("I", zlib.decompress(data) if data[0] & 0x0F == 8 else data[1:])
    if sys.byteorder == "big":  # pragma: no cover
        packed.byteswap()
    return packed.tolist()


def encode_header(head: Header) -> bytes:
    """Bytes of a header. Never compressed as a whole: task columns inline are
    compressed already, and compressing them again (every flush of a small workflow)
    cost as much as encoding them. Headers written compressed (``z``) still read."""
    return b"r" + _encoder.encode(head)


#: What :func:`decode_header` raises for bytes that are not a header it can read.
DAMAGED_HEADER = (ValueError, zlib.error, msgspec.MsgspecError)


def decode_header(data: bytes) -> Header:
    """A header from its bytes."""
    body = zlib.decompress(data[1:]) if data[:1] == b"z" else data[1:]
    head = _header.decode(body)
    if head.version not in READABLE_VERSIONS:
        raise ValueError(f"state document format {head.version} is not supported")
    return head


def empty_state(head: Header) -> RunState:
    """A state with the header's workflow fields; task columns still to be filled."""
    state = RunState(head.workflow_id, head.n_tasks, head.created_at)
    state.status = head.status
    state.updated_at = head.updated_at
    state.finished_at = head.finished_at
    state.error = head.error
    state.cancel_reason = head.cancel_reason
    state.cancelled_at = head.cancelled_at
    state.final_on_cancel = head.final_on_cancel
    state.history_seq = head.history_seq
    state.history_tail = list(head.history_tail)
    state.epoch = head.epoch
    state.signals = {name: list(queued) for name, queued in head.signal_queue.items()}
    for name, data in head.signals.items():  # an older document: the last one of each name
        state.signals.setdefault(name, [data])
    state.requests = list(head.requests)
    state.undo_order = list(head.undo_order)
    state.compensate_after = head.compensate_after
    state.unconfirmed = _decode_unconfirmed(head.unconfirmed)
    return state


# --- task columns and deltas --------------------------------------------------------------


def encode_tasks(state: RunState, *, compress: bool = True) -> bytes:
    """Every task column (compressed unless small, see :data:`RAW_BYTES`, or unless
    ``compress`` is False)."""
    return encode_copy(_columns(state, copy=False), compress=compress)


def copy_tasks(state: RunState) -> _Tasks:
    """The task columns, copied: another thread may encode them while ``state`` moves on."""
    return _columns(state, copy=True)


#: The sparse columns of a state, as a tuple (one C call, not one ``getattr`` each).
_sparse_of = operator.attrgetter(*_SPARSE)


def _columns(state: RunState, *, copy: bool) -> _Tasks:
    """The task columns; the sparse ones copied only if ``copy`` (encoded at once, as
    every flush of a small state is, they need not be: ~12 dict copies a flush)."""
    sparse = _sparse_of(state)
    return _Tasks(
        task_status=bytes(state.task_status),
        attempt=state.attempt.tolist(),
        dispatched_at=_pack(state.dispatched_at),
        started_at=_pack(state.started_at),
        task_finished_at=_pack(state.task_finished_at),
        sparse=_Sparse(*map(dict, sparse)) if copy else _Sparse(*sparse),
        groups={i: encode_group(g) for i, g in state.groups.items()} if state.groups else {},
    )


def encode_copy(columns: _Tasks, *, compress: bool = True) -> bytes:
    """The bytes of :func:`copy_tasks` columns (compression lets go of the GIL)."""
    return _packed_around(_encoder.encode(columns), columns.groups.values(), compress)


def _packed_around(raw: bytes, groups: Iterable[bytes], compress: bool = True) -> bytes:
    """:func:`_packed`, but stored as they are when most of ``raw`` is foreach groups
    compressed already, chunk by chunk: compressing them again would gain nothing, and
    cost more than compressing the chunks that changed did."""
    if compress and 2 * sum(map(precompressed, groups)) > len(raw):
        compress = False
    return _packed(raw, compress)


def load_tasks(state: RunState, data: bytes) -> None:
    """Fill the task columns of ``state`` from :func:`encode_tasks` bytes."""
    columns = _tasks.decode(_unpacked(data))
    n = state.n_tasks
    if len(columns.task_status) != n:
        raise ValueError(f"state document is damaged: {len(columns.task_status)} tasks, not {n}")
    state.task_status = bytearray(columns.task_status)
    state.attempt = array("q", columns.attempt)
    state.dispatched_at = _unpack(columns.dispatched_at, n)
    state.started_at = _unpack(columns.started_at, n)
    state.task_finished_at = _unpack(columns.task_finished_at, n)
    for name in _SPARSE:
        setattr(state, name, getattr(columns.sparse, name))
    state.groups = {i: decode_group(data) for i, data in columns.groups.items()}


def encode_delta(
    state: RunState,
    tasks: Iterable[int],
    changed_groups: Iterable[int] = (),
    changed_items: dict[int, set[int]] | None = None,
) -> bytes:
    """The full records of ``tasks`` (those a flush changed), of foreach groups changed
    as a whole, and of the foreach instances changed one by one; compressed."""
    whole = set(changed_groups)
    indexes = sorted(tasks)
    times = array("d")
    for i in indexes:
        times.extend((state.dispatched_at[i], state.started_at[i], state.task_finished_at[i]))
    delta = _Delta(
        tasks=indexes,
        task_status=bytes(state.task_status[i] for i in indexes),
        attempt=[state.attempt[i] for i in indexes],
        times=_pack(times),
        sparse=_Sparse(*(_pick(getattr(state, name), indexes) for name in _SPARSE)),
        groups={i: encode_group(state.groups[i]) for i in whole if i in state.groups},
        items={
            i: encode_items(state.groups[i], ks)
            for i, ks in (changed_items or {}).items()
            if i in state.groups and i not in whole
        },
    )
    return _packed_around(_encoder.encode(delta), delta.groups.values())


def delta_tasks(data: bytes) -> list[int]:
    """Which tasks a delta carries (for diagnostics and tests)."""
    return _delta.decode(_unpacked(data)).tasks


def apply_delta(state: RunState, data: bytes, *, recount: bool = True) -> None:
    """Replay a delta onto task columns (later deltas win); ``recount=False``: the
    foreach groups' derived counters are left to the caller (see
    :func:`~dagq.group.apply_items`)."""
    delta = _delta.decode(_unpacked(data))
    times = _unpack(delta.times, 3 * len(delta.tasks))
    for n, i in enumerate(delta.tasks):
        state.task_status[i] = delta.task_status[n]
        state.attempt[i] = delta.attempt[n]
        state.dispatched_at[i] = times[3 * n]
        state.started_at[i] = times[3 * n + 1]
        state.task_finished_at[i] = times[3 * n + 2]
        for name in _SPARSE:
            set_or_drop(getattr(state, name), getattr(delta.sparse, name), i)
    for i, group in delta.groups.items():
        state.groups[i] = decode_group(group)
    for i, records in delta.items.items():
        apply_items(state.groups[i], records, recount=recount)


def _pick(column: dict[int, T], indexes: list[int]) -> dict[int, T]:
    return {i: column[i] for i in indexes if i in column}


# --- one self-contained document (small workflows, tests) ---------------------------------


def encode(state: RunState) -> bytes:
    """The whole state as one document (header with the task columns inline)."""
    return encode_header(header(state, inline=encode_tasks(state)))


def decode(data: bytes, plan: Plan) -> RunState:
    """A working state from a self-contained document (see :mod:`dagq.persistence`)."""
    head = decode_header(data)
    if head.inline is None:
        raise ValueError("this state document refers to a base and deltas; read it from the store")
    state = empty_state(head)
    load_tasks(state, head.inline)
    state.rebuild(plan)
    return state
