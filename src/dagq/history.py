"""The append-only event history of a workflow.

The coordinator adds one chunk per state flush, with the sequence number taken from
the state it is flushing. The last chunks stay in the state document itself (its
``history_tail``, written with it: no request of their own); once they would grow
past :data:`TAIL_CHUNKS` chunks or :data:`TAIL_BYTES` bytes, that flush writes them
all to documents of their own (``history/{id}/{seq}``) before the state that no longer
holds them. A flush that loses its race is re-applied and rewrites the same chunk, so
the history never holds events the state does not.

A chunk that cannot be decoded (a damaged document) does not hide the rest: it is
read as one entry of kind :data:`DAMAGED` naming the chunk, and reading goes on. The
history is a record for people; the run's state does not depend on it.
"""

import msgspec

from dagq import keys, snapshots
from dagq.payloads import cut
from dagq.state import RunState
from dagq.stores.base import Batch, Store


class HistoryEntry(msgspec.Struct, frozen=True, array_like=True):
    """One thing that happened: when, what, to which task and attempt, why, and who
    asked for it (the audit trail of submits, cancels, retries and signals)."""

    at: float
    kind: str
    task: str | None = None
    attempt: int = 0
    detail: str | None = None
    #: Who asked: ``token:NAME:ID`` (through ``dagq server``), ``cli:USER``,
    #: ``python:USER``; None for what the run did by itself. Added last: chunks
    #: written before it decode with None.
    actor: str | None = None


#: The kind of the entry that stands for a chunk that cannot be decoded.
DAMAGED = "damaged"

#: At most this many chunks of at most this many bytes together stay in the state
#: document (a small workflow's whole history); one more spills them to documents.
TAIL_CHUNKS = 16
TAIL_BYTES = 2048

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(list[HistoryEntry])


def encode_chunk(entries: list[HistoryEntry]) -> bytes:
    """Serialize one chunk."""
    return _encoder.encode(entries)


async def read_history(store: Store, workflow_id: str) -> list[HistoryEntry]:
    """Every entry of a workflow's history, oldest first."""
    chunks = await read_chunks(store, workflow_id)
    return _dated([entry for _, entries in chunks for entry in entries])


def stage_chunk(batch: Batch, state: RunState, entries: list[HistoryEntry]) -> None:
    """Add a flush's entries to ``state``'s history as chunk ``state.history_seq``: into
    the state document's tail, or (the tail full) with the tail into documents of
    their own, staged in ``batch`` ahead of the state that is staged after them."""
    chunk = encode_chunk(entries)
    tail = state.history_tail
    if len(tail) < TAIL_CHUNKS and sum(map(len, tail)) + len(chunk) <= TAIL_BYTES:
        tail.append(chunk)
    else:
        first = state.history_seq - len(tail)
        for offset, data in enumerate([*tail, chunk]):
            batch.put(keys.history(state.workflow_id, first + offset), data)
        state.history_tail = []
    state.history_seq += 1


async def read_chunks(
    store: Store, workflow_id: str, *, after: int | None = None
) -> list[tuple[int, list[HistoryEntry]]]:
    """The history chunks of a workflow after sequence number ``after`` (every chunk
    if None), oldest first, each with its sequence number: the position of an entry,
    (sequence, index in its chunk), never changes, so a reader can resume from it."""
    # The state's tail first: a chunk spilled from it after this read is a document
    # by the time the listing below runs.
    found = dict(await _tail(store, workflow_id))
    prefix = keys.history_prefix(workflow_id)
    start = None if after is None else keys.history(workflow_id, after)
    while True:
        names = await store.documents.list(prefix, start_after=start, limit=1000)
        for name in names:
            doc = await store.documents.get(name)
            if doc is not None and name[len(prefix) :].isdigit():
                # The state is the commit point: a document at a number its tail holds
                # is a copy of that chunk, or what a flush that never committed left.
                found.setdefault(int(name[len(prefix) :]), (name, doc.data))
        if len(names) < 1000:
            break
        start = names[-1]
    chunks: list[tuple[int, list[HistoryEntry]]] = []
    last_at: float | None = None
    for seq in sorted(found):
        if after is not None and seq <= after:
            continue
        name, data = found[seq]
        entries = _decode_chunk(name, data, last_at)
        chunks.append((seq, entries))
        last_at = entries[-1].at if entries else last_at
    return chunks


async def _tail(store: Store, workflow_id: str) -> list[tuple[int, tuple[str, bytes]]]:
    """The chunks kept in the state document, by sequence number (none if it is
    missing or cannot be read: the history is a record, the state's readers report)."""
    doc = await store.documents.get(keys.state(workflow_id))
    if doc is None:
        return []
    try:
        head = snapshots.decode_header(doc.data)
    except snapshots.DAMAGED_HEADER:
        return []
    first = head.history_seq - len(head.history_tail)
    name = keys.state(workflow_id)
    return [(first + i, (f"{name}#{first + i}", data)) for i, data in enumerate(head.history_tail)]


def _decode_chunk(key: str, data: bytes, at: float | None) -> list[HistoryEntry]:
    """The entries of one chunk; a damaged chunk is one :data:`DAMAGED` entry, dated
    like the entry before it (``at`` None: like the entry after it, see _dated)."""
    try:
        return _decoder.decode(data)
    except msgspec.DecodeError as exc:  # ValidationError included
        detail = f"history chunk {key} is damaged ({cut(str(exc), 200)}): its events are lost"
        return [HistoryEntry(at=-1.0 if at is None else at, kind=DAMAGED, detail=detail)]


def _dated(entries: list[HistoryEntry]) -> list[HistoryEntry]:
    """Damaged entries at the very start take the time of the first readable entry."""
    first = next((e.at for e in entries if e.at >= 0), 0.0)
    if entries and entries[0].at < 0:
        return [msgspec.structs.replace(e, at=first) if e.at < 0 else e for e in entries]
    return entries
