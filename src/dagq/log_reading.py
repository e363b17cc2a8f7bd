"""An attempt's output read by byte offset: ``dagq logs --follow`` and the API's logs.

While an attempt runs, its output is the chunks the worker sends live
(:mod:`dagq.live_logs`); once it ended with nothing sent live, its kept log (the tail
the worker stored, :meth:`dagq.client.Client.logs`) is the output. A reader asks for
what follows byte ``offset`` and gets the bytes, the offset to ask from next, and
whether the attempt has ended — in which case nothing more will come.

The attempt's state is read *before* its chunks: a worker sends every chunk before it
reports the attempt ended, so a reader that saw it ended finds every chunk.

Chunks never change once written, so their sizes are remembered (:class:`ChunkSizes`):
a poll from the end of what was read fetches only the chunks that are new.
"""

from __future__ import annotations

from collections import OrderedDict

import msgspec

from dagq.client import Client

#: How many attempts' chunk sizes one :class:`ChunkSizes` remembers.
REMEMBERED = 256
#: The most bytes one read returns (a client asks again from ``next_offset``).
READ_BYTES = 1024 * 1024


class LogSlice(msgspec.Struct, frozen=True, kw_only=True):
    """What an attempt wrote from byte ``offset`` on (up to ``next_offset``)."""

    task: str
    #: The attempt read (0: the task has not run yet).
    attempt: int
    offset: int
    next_offset: int
    data: bytes
    #: None while the attempt may still write; else how it ended.
    ended: str | None
    #: The attempt ended and ``next_offset`` is the end of its output.
    complete: bool
    #: The output is the kept log (nothing was sent live), not the live chunks.
    kept: bool = False


class ChunkSizes:
    """The sizes of the live chunks read so far, per attempt (least recently used go)."""

    def __init__(self, remembered: int = REMEMBERED) -> None:
        self._known: OrderedDict[str, list[tuple[str, int]]] = OrderedDict()
        self._remembered = remembered

    def of(self, prefix: str) -> list[tuple[str, int]]:
        """(key, size) of each chunk under ``prefix`` known so far, in order."""
        found = self._known.setdefault(prefix, [])
        self._known.move_to_end(prefix)
        while len(self._known) > self._remembered:
            self._known.popitem(last=False)
        return found


async def read_log(
    client: Client,
    workflow_id: str,
    task: str,
    *,
    attempt: int | None = None,
    offset: int = 0,
    item: int = -1,
    undo: bool = False,
    sizes: ChunkSizes | None = None,
) -> LogSlice:
    """The output of an attempt (the latest by default) from byte ``offset``."""
    state = await client.attempt_state(workflow_id, task, attempt=attempt, item=item, undo=undo)
    ended = state.ended
    if state.attempt == 0:
        return LogSlice(
            task=task,
            attempt=0,
            offset=offset,
            next_offset=offset,
            data=b"",
            ended=ended,
            complete=ended is not None,
        )
    chunks = (sizes or ChunkSizes()).of(state.live_prefix)
    fetched = await _new_chunks(client, state.live_prefix, chunks)
    if chunks:
        data = await _bytes_from(client, chunks, fetched, offset)
    elif ended is not None:  # nothing was sent live: the kept log is the output
        text = await client.logs(workflow_id, task, attempt=state.attempt, item=item, undo=undo)
        data = text.encode()[offset : offset + READ_BYTES]
    else:
        data = b""
    total = sum(size for _, size in chunks)
    whole = ended is not None and (not chunks or offset + len(data) >= total)
    if not whole:
        data = _whole_characters(data)
    return LogSlice(
        task=task,
        attempt=state.attempt,
        offset=offset,
        next_offset=offset + len(data),
        data=data,
        ended=ended,
        complete=whole,
        kept=not chunks and ended is not None,
    )


async def _new_chunks(
    client: Client, prefix: str, chunks: list[tuple[str, int]]
) -> dict[str, bytes]:
    """Fetch the chunks sent since the last one in ``chunks`` (appending their sizes)."""
    after = chunks[-1][0] if chunks else None
    fetched = {}
    for key, data in await client.live_output(prefix, after=after):
        chunks.append((key, len(data)))
        fetched[key] = data
    return fetched


async def _bytes_from(
    client: Client, chunks: list[tuple[str, int]], fetched: dict[str, bytes], offset: int
) -> bytes:
    """The bytes of the chunks from ``offset`` on (at most READ_BYTES)."""
    out = bytearray()
    start = 0
    for key, size in chunks:
        end = start + size
        if end > offset and len(out) < READ_BYTES:
            data = fetched.get(key)
            if data is None:
                doc = await client.store.documents.get(key)
                data = b"" if doc is None else doc.data
            out += data[max(0, offset - start) :]
        start = end
    return bytes(out[:READ_BYTES])


def _whole_characters(data: bytes) -> bytes:
    """``data`` without a UTF-8 character cut at its end (the rest comes next time)."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:  # a continuation byte: look further back
            continue
        if byte & 0x80 and back < _length(byte):
            return data[:-back]
        return data
    return data


def _length(lead: int) -> int:
    """The length of the UTF-8 sequence that ``lead`` starts."""
    if lead >= 0xF0:
        return 4
    if lead >= 0xE0:
        return 3
    return 2 if lead >= 0xC0 else 1
