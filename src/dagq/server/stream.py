"""Server-sent events of a run's history, resumable from any event id.

Each event is one history entry, with ``id: <chunk>-<index>``: its place in the
history, which never changes (docs/architecture.md: one chunk per state flush). A
client that reconnects with ``Last-Event-ID`` gets every entry after that one, from
whichever server it reaches. Once the run has ended (its state, the truth, says so)
and every entry has been sent, an ``end`` event carries the final status and the
stream closes. When the server shuts down, a ``shutdown`` event tells the client to
reconnect (to this server once it is back, or to another) and the stream ends cleanly.
A stream looks at the store when the run's history changes (:mod:`.pacing`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import msgspec

from dagq import keys
from dagq.client import Client
from dagq.history import read_chunks
from dagq.server.context import Settings
from dagq.server.pacing import Pace
from dagq.server.resources import detail, events
from dagq.state import WORKFLOW_TERMINAL
from dagq.stores.changes import topic_of


async def history_events(
    client: Client,
    workflow_id: str,
    after: tuple[int, int] | None,
    *,
    settings: Settings,
    stopping: anyio.Event,
) -> AsyncIterator[dict[str, str | int]]:
    """The events of ``workflow_id`` after position ``after`` (all if None), then
    ``end``; looks at the store again when its history changes (or polls, at the pace
    ``settings`` give), and says ``shutdown`` once ``stopping`` is set."""
    topic = topic_of(keys.history(workflow_id, 0))
    async with client.store.changes.watch(topic) as watcher:
        pace = settings.pace(watcher)
        async for event in _history(client, workflow_id, after, pace, stopping):
            yield event


async def _history(
    client: Client,
    workflow_id: str,
    after: tuple[int, int] | None,
    pace: Pace,
    stopping: anyio.Event,
) -> AsyncIterator[dict[str, str | int]]:
    position = after
    # The chunk holding ``after`` is read again (from its start) to find what follows.
    start = None if after is None or after[0] == 0 else after[0] - 1
    ending = False
    while True:
        chunks = await read_chunks(client.store, workflow_id, after=start)
        pace.looked(found=bool(chunks))
        for event in events(chunks, position):
            yield {"id": event.id, "data": msgspec.json.encode(event).decode()}
        if chunks:
            start = chunks[-1][0]
            position = (start, len(chunks[-1][1]) - 1)
        elif ending:
            status = await client.status(workflow_id)
            yield {"event": "end", "data": msgspec.json.encode(detail(status)).decode()}
            return
        elif await _ended(client, workflow_id):
            ending = True  # read once more: the last flush wrote its chunk before its state
            continue
        await pace.wait(stopping)
        if stopping.is_set():
            yield {"event": "shutdown", "data": "the server is stopping; reconnect", "retry": 1000}
            return


async def _ended(client: Client, workflow_id: str) -> bool:
    """Whether the run has ended: the index says so first (cheap), the state confirms."""
    row = await client.store.index.get(workflow_id)
    if row is None or row.status not in WORKFLOW_TERMINAL:
        return False
    return (await client.status(workflow_id)).terminal
