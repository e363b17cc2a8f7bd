"""``GET /v1/workflows/{id}/tasks/{name}/logs``: an attempt's output, polled by offset.

The same reading as ``dagq logs --follow`` (:mod:`dagq.log_reading`): live chunks
while the attempt runs, its kept log when nothing was sent live. A client asks again
with ``offset=next_offset`` until ``complete``.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from fastapi import APIRouter, Depends, Path, Query
from starlette.responses import Response

from dagq.errors import UsageError
from dagq.log_reading import read_log
from dagq.server import problems
from dagq.server.access import Caller, caller
from dagq.server.context import Api, allow, answer, api_of, guard, json_schema
from dagq.server.problems import ProblemError

router = APIRouter(prefix="/v1")
Who = Annotated[Caller, Depends(caller)]
Server = Annotated[Api, Depends(api_of)]


class LogText(msgspec.Struct, frozen=True, kw_only=True):
    """What an attempt wrote from byte ``offset`` to ``next_offset``; ``complete``: the
    attempt ended and nothing more will come (``attempt`` 0: not started yet)."""

    task: str
    attempt: int
    offset: int
    next_offset: int
    text: str
    complete: bool


@router.get(
    "/workflows/{workflow_id}/tasks/{name:path}/logs",
    summary="A task attempt's output (poll by offset)",
    responses={
        200: {"content": json_schema(LogText)},
        **problems.openapi_responses(404, 422),
    },
)
async def task_logs(
    *,
    workflow_id: Annotated[str, Path(description="The workflow's id.")],
    name: Annotated[str, Path(description="The task's name (may contain '/').")],
    who: Who,
    api: Server,
    attempt: Annotated[int | None, Query(ge=1, description="Default: the latest.")] = None,
    offset: Annotated[int, Query(ge=0, description="The byte to read from.")] = 0,
) -> Response:
    """Output from byte ``offset`` (live while the attempt runs, its kept log once it
    ended); poll again with ``offset=next_offset`` until ``complete``."""
    allow(who, "viewer", "read logs")
    await guard(api, who, workflow_id)
    try:
        found = await read_log(
            api.client,
            workflow_id,
            name,
            attempt=attempt,
            offset=offset,
            sizes=api.log_chunks,
        )
    except UsageError as exc:  # an attempt that never was
        raise ProblemError("not-found", str(exc)) from None
    return answer(
        LogText(
            task=found.task,
            attempt=found.attempt,
            offset=found.offset,
            next_offset=found.next_offset,
            text=found.data.decode("utf-8", "replace"),
            complete=found.complete,
        )
    )
