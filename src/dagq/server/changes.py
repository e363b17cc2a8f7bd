"""``GET /v1/stream``: server-sent events of every change of a run's listing row.

Each ``workflow`` event carries the row as ``GET /v1/workflows`` lists it, with
``id:`` the moment of that change (its ``updated_at``). The store's index answers
what changed after a moment (``Index.changed``); a client that reconnects with
``Last-Event-ID`` is sent every row changed after it.

Rows are written with their writer's clock, and a write may land a little after a
later-stamped one, so each look reaches back ``LOOK_BACK_S`` before the newest change
sent and leaves out the changes it already sent: nothing is missed, and a resumed
stream may repeat the few rows changed just before its id (a row is the latest state
of its run: applying it twice is harmless). Without an id the stream starts
``LOOK_BACK_S`` before the request: list first, then stream.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Annotated

import anyio
import msgspec
from fastapi import APIRouter, Depends, Header, Query
from sse_starlette import EventSourceResponse
from starlette.requests import Request

from dagq.client import Client, row_summary
from dagq.server import problems
from dagq.server.access import Caller, caller, while_allowed
from dagq.server.context import Api, Settings, allow, api_of
from dagq.server.filters import RunFilter, run_filter
from dagq.server.pacing import Pace
from dagq.server.problems import ProblemError
from dagq.stores.changes import INDEX_TOPIC

router = APIRouter(prefix="/v1")
Who = Annotated[Caller, Depends(caller)]
Server = Annotated[Api, Depends(api_of)]
#: How far before the newest change sent each look reaches (for late writes).
LOOK_BACK_S = 2.0
#: Rows read per look at the index.
PAGE = 500
#: How long a stream gets to say goodbye when the server stops.
STREAM_GRACE_S = 5.0


@router.get(
    "/stream",
    summary="Stream changes of runs (SSE)",
    responses={
        200: {
            "description": "text/event-stream of `workflow` events (a listing row each)",
            "content": {"text/event-stream": {}},
        },
        **problems.openapi_responses(400, 403, 422),
    },
)
async def stream_changes(
    request: Request,
    *,
    who: Who,
    api: Server,
    status: str | None = None,
    name: str | None = None,
    tenant: str | None = None,
    label: Annotated[list[str] | None, Query(description="key=value; repeatable.")] = None,
    last_event_id: Annotated[str | None, Header()] = None,
    after: Annotated[str | None, Query(description="Like Last-Event-ID.")] = None,
) -> EventSourceResponse:
    """A ``workflow`` event per change of a run's row (filtered like the listing);
    ``id:`` resumes with ``Last-Event-ID``."""
    allow(who, "viewer", "read workflows")
    found = run_filter(who, status=status, name=name, tenant=tenant, labels=label)
    resume = last_event_id or after
    start = _position(resume) if resume else time.time()
    stopping = anyio.Event()
    events = changes(api.client, found, start, settings=api.settings, stopping=stopping)
    return EventSourceResponse(
        while_allowed(request, events),  # a token revoked meanwhile ends the stream
        ping=api.settings.stream_ping_s,
        shutdown_event=stopping,
        shutdown_grace_period=STREAM_GRACE_S,
    )


def _position(text: str) -> float:
    try:
        found = float(text.strip())
    except ValueError:
        found = float("nan")
    if not found >= 0:  # also NaN
        raise ProblemError(
            "malformed-request", f"{text[:40]!r} is not an event id of this stream (as sent)"
        )
    return found


async def changes(
    client: Client,
    wanted: RunFilter,
    start: float,
    *,
    settings: Settings,
    stopping: anyio.Event,
) -> AsyncIterator[dict[str, str | int]]:
    """The rows changed after ``start`` (less the look-back) that pass ``wanted``, as
    they change (looking when the index changes, at the pace ``settings`` give)."""
    async with client.store.changes.watch(INDEX_TOPIC) as watcher:
        pace = settings.pace(watcher)
        async for event in _changes(client, wanted, start, pace, stopping):
            yield event


async def _changes(
    client: Client, wanted: RunFilter, start: float, pace: Pace, stopping: anyio.Event
) -> AsyncIterator[dict[str, str | int]]:
    newest = start
    sent: dict[str, float] = {}  # id -> updated_at of the rows sent within the look-back
    while True:
        since = newest - LOOK_BACK_S
        found = False
        while True:
            rows = await client.store.index.changed(since, limit=PAGE)
            for row in rows:
                if sent.get(row.id, -1.0) >= row.updated_at:
                    continue
                sent[row.id] = row.updated_at
                found = True
                newest = max(newest, row.updated_at)
                run = row_summary(row)
                if wanted.matches(run):
                    data = msgspec.json.encode(run).decode()
                    yield {"event": "workflow", "id": repr(row.updated_at), "data": data}
            if len(rows) < PAGE:
                break
            # Ties at the page's end are read again (those sent are left out then).
            since = max(rows[-1].updated_at - 1e-6, since + 1e-6)
        horizon = newest - LOOK_BACK_S
        sent = {k: at for k, at in sent.items() if at >= horizon}
        pace.looked(found=found)
        await pace.wait(stopping)
        if stopping.is_set():
            yield {"event": "shutdown", "data": "the server is stopping; reconnect", "retry": 1000}
            return
