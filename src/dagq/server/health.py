"""``/healthz`` (the process answers) and ``/readyz`` (and its store does)."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Depends
from starlette.responses import Response

from dagq.errors import DagqError
from dagq.server import problems
from dagq.server.context import Api, answer, api_of, json_schema
from dagq.server.resources import Health

router = APIRouter()
Server = Annotated[Api, Depends(api_of)]
#: How long readiness waits for the store.
READY_TIMEOUT_S = 3.0


@router.get("/healthz", summary="Liveness", responses={200: {"content": json_schema(Health)}})
async def healthz() -> Response:
    """The server process is up."""
    return answer(Health(status="ok"))


@router.get(
    "/readyz",
    summary="Readiness: the store answers",
    responses={200: {"content": json_schema(Health)}, **problems.openapi_responses(503)},
)
async def readyz(api: Server) -> Response:
    """Ready when a query of the store's index answers in time; 503 otherwise."""
    url = api.client.store.url
    try:
        async with asyncio.timeout(READY_TIMEOUT_S):
            await api.client.store.index.query(limit=1)
    except (TimeoutError, DagqError, OSError) as exc:
        detail = f"the store {url} did not answer: {str(exc) or type(exc).__name__}"
        return problems.response(problems.problem("unavailable", detail, instance="/readyz"))
    return answer(Health(status="ready", store=url))
