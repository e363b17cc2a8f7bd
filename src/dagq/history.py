"""The append-only event history of a workflow.

The coordinator writes one chunk per state flush (``history/{id}/{seq}``), with the
sequence number taken from the state it is flushing. A flush that loses its race is
re-applied and rewrites the same chunk, so the history never holds events the state
does not.
"""

from __future__ import annotations

import msgspec

from dagq import keys
from dagq.stores.base import Store


class HistoryEntry(msgspec.Struct, frozen=True, array_like=True):
    """One thing that happened: when, what, to which task and attempt, and why."""

    at: float
    kind: str
    task: str | None = None
    attempt: int = 0
    detail: str | None = None


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(list[HistoryEntry])


def encode_chunk(entries: list[HistoryEntry]) -> bytes:
    """Serialize one chunk."""
    return _encoder.encode(entries)


async def read_history(store: Store, workflow_id: str) -> list[HistoryEntry]:
    """Every entry of a workflow's history, oldest first."""
    entries: list[HistoryEntry] = []
    prefix = keys.history_prefix(workflow_id)
    start: str | None = None
    while True:
        names = await store.documents.list(prefix, start_after=start, limit=1000)
        for name in names:
            doc = await store.documents.get(name)
            if doc is not None:
                entries.extend(_decoder.decode(doc.data))
        if len(names) < 1000:
            return entries
        start = names[-1]
