"""The append-only event history of a workflow.

The coordinator writes one chunk per state flush (``history/{id}/{seq}``), with the
sequence number taken from the state it is flushing. A flush that loses its race is
re-applied and rewrites the same chunk, so the history never holds events the state
does not.

A chunk that cannot be decoded (a damaged document) does not hide the rest: it is
read as one entry of kind :data:`DAMAGED` naming the chunk, and reading goes on. The
history is a record for people; the run's state does not depend on it.
"""

from __future__ import annotations

import msgspec

from dagq import keys
from dagq.payloads import cut
from dagq.stores.base import Store


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

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(list[HistoryEntry])


def encode_chunk(entries: list[HistoryEntry]) -> bytes:
    """Serialize one chunk."""
    return _encoder.encode(entries)


async def read_history(store: Store, workflow_id: str) -> list[HistoryEntry]:
    """Every entry of a workflow's history, oldest first."""
    chunks = await read_chunks(store, workflow_id)
    return _dated([entry for _, entries in chunks for entry in entries])


async def read_chunks(
    store: Store, workflow_id: str, *, after: int | None = None
) -> list[tuple[int, list[HistoryEntry]]]:
    """The history chunks of a workflow after sequence number ``after`` (every chunk
    if None), oldest first, each with its sequence number: the position of an entry,
    (sequence, index in its chunk), never changes, so a reader can resume from it."""
    chunks: list[tuple[int, list[HistoryEntry]]] = []
    prefix = keys.history_prefix(workflow_id)
    start = None if after is None else keys.history(workflow_id, after)
    last_at: float | None = None
    while True:
        names = await store.documents.list(prefix, start_after=start, limit=1000)
        for name in names:
            doc = await store.documents.get(name)
            if doc is not None and name[len(prefix) :].isdigit():
                entries = _decode_chunk(name, doc.data, last_at)
                chunks.append((int(name[len(prefix) :]), entries))
                last_at = entries[-1].at if entries else last_at
        if len(names) < 1000:
            return chunks
        start = names[-1]


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
