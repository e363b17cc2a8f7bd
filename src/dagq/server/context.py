"""What every route shares: the server's settings, its client of the store, and the
helpers that answer in JSON."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from dagq.client import Client
from dagq.errors import WorkflowNotFound
from dagq.log_reading import ChunkSizes
from dagq.server.access import Caller, Role
from dagq.server.idempotency import Keys
from dagq.server.limits import MAX_BODY_BYTES
from dagq.server.pacing import Pace
from dagq.server.problems import ProblemError
from dagq.stores.changes import Watcher


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """How a server behaves; ``dagq server`` fills it from its options."""

    store_url: str
    #: Every request must carry a token (``dagq server --auth``, or a non-loopback
    #: address); without, a request with no token acts as the anonymous admin.
    auth: bool = False
    max_body_bytes: int = MAX_BODY_BYTES
    #: How often a stream polls for new events where the store's change feed cannot
    #: see every writer (Azure; docs: :mod:`dagq.server.pacing`) ...
    stream_poll_s: float = 0.1
    #: ... backing off to this while nothing changes.
    stream_max_poll_s: float = 0.25
    #: Where the feed sees every writer: how often an idle stream looks anyway.
    stream_idle_s: float = 5.0
    #: The least time between two looks of a stream woken by a broad change.
    stream_gap_s: float = 0.05
    #: Seconds between keep-alive comments on an idle stream.
    stream_ping_s: float = 15.0
    #: How long ``POST …/retry`` waits for a coordinator to take the retry up.
    retry_ack_s: float = 10.0
    #: What ``Retry-After`` tells a client to wait before polling a new run.
    retry_after_s: int = 1

    def pace(self, watcher: Watcher) -> Pace:
        """The pace of a stream's looks at the store, waiting on ``watcher``."""
        return Pace(
            watcher=watcher,
            poll_s=self.stream_poll_s,
            max_poll_s=self.stream_max_poll_s,
            idle_s=self.stream_idle_s,
            gap_s=self.stream_gap_s,
        )


@dataclass(frozen=True, slots=True)
class Api:
    """The server's state, one per process (``app.state.api``)."""

    settings: Settings
    client: Client
    keys: Keys
    #: The sizes of live log chunks already read (a poll fetches only new ones).
    log_chunks: ChunkSizes = field(default_factory=ChunkSizes)


def api_of(request: Request) -> Api:
    """The server's state (a FastAPI dependency)."""
    found: Api = request.app.state.api
    return found


def answer(value: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """``value`` as JSON (msgspec: the structs' own field names and order)."""
    return Response(
        msgspec.json.encode(value),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )


def allow(who: Caller, role: Role, what: str) -> None:
    """Refuse (403) a caller whose role does not include ``role``; ``what`` names the
    action ("cancel workflows")."""
    if not who.may(role):
        raise ProblemError(
            "forbidden", f"{who.role} {who.name!r} may not {what} (it takes the {role} role)"
        )


def allow_store_wide(who: Caller, role: Role, what: str) -> None:
    """As :func:`allow`, for what belongs to no one tenant (dead letters mix every
    tenant's messages): a caller bound to a tenant is refused too."""
    allow(who, role, what)
    if who.tenant:
        raise ProblemError(
            "forbidden",
            f"{who.name!r} is bound to tenant {who.tenant!r} and may not {what}: they "
            "belong to every tenant (it takes a token without a tenant)",
        )


def actor(who: Caller) -> str:
    """Who started an action, as recorded with it."""
    return who.name


async def guard(api: Api, who: Caller, workflow_id: str) -> None:
    """Refuse (as not found) a workflow outside the caller's tenant; a caller of the
    default tenant sees every workflow."""
    if not who.tenant:
        return
    row = await api.client.store.index.get(workflow_id)
    if row is None or row.tenant != who.tenant:
        raise WorkflowNotFound(f"no workflow '{workflow_id}'")


def json_schema(struct: type[Any]) -> dict[str, Any]:
    """The OpenAPI ``responses`` content of a route answering with ``struct``."""
    return {"application/json": {"schema": {"$ref": f"#/components/schemas/{struct.__name__}"}}}
