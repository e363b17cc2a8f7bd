"""``GET /v1/workers``, ``/v1/queues`` and ``/v1/doctor``: what serves the store.

The same readings as ``dagq workers`` (:func:`dagq.registry.live_workers`) and
``dagq doctor`` (:func:`dagq.maintenance.diagnose`), and the queue overview beside
them (:func:`dagq.maintenance.queue_overview`). They are store-wide; a caller bound
to a tenant does not see the ids of other tenants' runs in them (a worker's running
attempts and doctor's findings about single workflows are left out for it).
"""

from __future__ import annotations

import time
from typing import Annotated

import msgspec
from fastapi import APIRouter, Depends
from starlette.responses import Response

from dagq import maintenance, registry
from dagq.registry import WorkerRecord
from dagq.server import problems
from dagq.server.access import Caller, caller
from dagq.server.context import Api, allow, answer, api_of, json_schema

router = APIRouter(prefix="/v1")
Who = Annotated[Caller, Depends(caller)]
Server = Annotated[Api, Depends(api_of)]


class Workers(msgspec.Struct, frozen=True, kw_only=True):
    """The live workers on record."""

    items: list[WorkerRecord]


class QueueInfo(msgspec.Struct, frozen=True, kw_only=True):
    """A queue: messages waiting (``depth``) and in flight, the oldest's age, the live
    workers serving it, and its dead letters."""

    queue: str
    depth: int
    in_flight: int
    oldest_age_s: float
    workers: int
    dead_letters: int


class Queues(msgspec.Struct, frozen=True, kw_only=True):
    """The queues of unfinished workflows, of live workers and of dead letters."""

    items: list[QueueInfo]


class Finding(msgspec.Struct, frozen=True, kw_only=True):
    """One check of ``dagq doctor``: ``ok``, ``warn`` or ``fail``, what was checked,
    what it saw, and the suggested fix ("" when none)."""

    level: str
    what: str
    detail: str
    fix: str


class Doctor(msgspec.Struct, frozen=True, kw_only=True):
    """What ``dagq doctor`` reports; ``ok`` when every finding is."""

    findings: list[Finding]
    ok: bool


#: The structs of this module the OpenAPI document describes.
SCHEMAS = (Workers, Queues, Doctor)


@router.get(
    "/workers",
    summary="Live workers",
    responses={200: {"content": json_schema(Workers)}, **problems.openapi_responses(403)},
)
async def list_workers(who: Who, api: Server) -> Response:
    """Every live worker: its queues, concurrency, what it runs, when it was last seen."""
    allow(who, "viewer", "see workers")
    found = await registry.live_workers(api.client.store.documents, now=time.time())
    if who.tenant:  # the running attempts name other tenants' runs
        found = [msgspec.structs.replace(w, attempts=[]) for w in found]
    return answer(Workers(items=found))


@router.get(
    "/queues",
    summary="Queues: depth, oldest message, workers, dead letters",
    responses={200: {"content": json_schema(Queues)}, **problems.openapi_responses(403)},
)
async def list_queues(who: Who, api: Server) -> Response:
    """The queues of unfinished workflows, those live workers serve, those holding dead
    letters, and the completion queue."""
    allow(who, "viewer", "see queues")
    found = await maintenance.queue_overview(api.client.store)
    return answer(
        Queues(items=[msgspec.convert(q, QueueInfo, from_attributes=True) for q in found])
    )


@router.get(
    "/doctor",
    summary="What dagq doctor reports",
    responses={200: {"content": json_schema(Doctor)}, **problems.openapi_responses(403)},
)
async def doctor(who: Who, api: Server) -> Response:
    """The store, the coordinator, the queues and the workflows, checked; each finding
    with a suggested fix."""
    allow(who, "viewer", "run doctor")
    found = await maintenance.diagnose(api.client.store)
    if who.tenant:  # findings about one workflow may be another tenant's
        found = [f for f in found if not f.check.startswith("workflow ")]
    findings = [Finding(level=f.level, what=f.check, detail=f.detail, fix=f.fix) for f in found]
    return answer(Doctor(findings=findings, ok=all(f.level == "ok" for f in findings)))
