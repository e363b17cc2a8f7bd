"""``POST /v1/workflows/{id}/cancel|retry|signals/{name}``: requests to the coordinator.

Each answers 202 once the request is durably queued (a retry: once a coordinator took
it up, or after a bounded wait). With an ``Idempotency-Key`` the request id derives
from the key, so the coordinator acts once however often the request is sent.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, TypeVar

import msgspec
from fastapi import APIRouter, Depends, Path, Request
from starlette.responses import Response

from dagq.errors import ValidationError
from dagq.server import idempotency, problems
from dagq.server.access import Caller, caller
from dagq.server.context import Api, actor, allow, answer, api_of, guard, json_schema
from dagq.server.resources import Accepted, status_url
from dagq.submission import new_request_id

B = TypeVar("B", bound=msgspec.Struct)
router = APIRouter(prefix="/v1/workflows/{workflow_id}")
Who = Annotated[Caller, Depends(caller)]
Server = Annotated[Api, Depends(api_of)]
WorkflowId = Annotated[str, Path(description="The workflow's id.")]
RESPONSES: dict[int | str, dict[str, Any]] = {
    202: {"description": "Accepted", "content": json_schema(Accepted)},
    **problems.openapi_responses(400, 404, 409, 413, 422),
}


class CancelBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Why the run is cancelled (recorded in its history)."""

    reason: str = "cancelled by request"


class RetryBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Which tasks to re-run (none named: every failed, upstream_failed, cancelled one)."""

    tasks: list[str] | None = None


@router.post("/cancel", status_code=202, summary="Cancel a workflow", responses=RESPONSES)
async def cancel(workflow_id: WorkflowId, request: Request, who: Who, api: Server) -> Response:
    """Pending tasks are cancelled at once, running ones are stopped. Body (optional):
    ``{"reason": "..."}``. Needs the operator role."""
    allow(who, "operator", "cancel workflows")

    async def run(request_id: str | None) -> Response:
        await guard(api, who, workflow_id)
        body = _body(await request.body(), CancelBody) or CancelBody()
        sent = await api.client.cancel(
            workflow_id, body.reason, request_id=request_id, actor=actor(who)
        )
        return _accepted(workflow_id, request_id=sent)

    return await idempotency.once(api.keys, request, who.tenant, run, problems.render)


@router.post("/retry", status_code=202, summary="Retry a finished workflow", responses=RESPONSES)
async def retry(workflow_id: WorkflowId, request: Request, who: Who, api: Server) -> Response:
    """Re-run its failed, upstream_failed and cancelled tasks (or only those named:
    ``{"tasks": ["a", "b"]}``); completed tasks keep their outputs. Needs the
    operator role."""
    allow(who, "operator", "retry workflows")

    async def run(request_id: str | None) -> Response:
        await guard(api, who, workflow_id)
        body = _body(await request.body(), RetryBody) or RetryBody()
        sent = request_id or new_request_id()
        taken = await api.client.retry(
            workflow_id,
            body.tasks,
            ack_timeout_s=api.settings.retry_ack_s,
            request_id=sent,
            actor=actor(who),
        )
        return _accepted(workflow_id, request_id=sent, taken_up=taken)

    return await idempotency.once(api.keys, request, who.tenant, run, problems.render)


@router.post(
    "/signals/{name}", status_code=202, summary="Send a signal to a workflow", responses=RESPONSES
)
async def signal(
    workflow_id: WorkflowId,
    name: Annotated[str, Path(description="The signal's name (a wait_for of a task).")],
    request: Request,
    who: Who,
    api: Server,
) -> Response:
    """The body (any JSON, optional) is the data the waiting task outputs. Needs the
    operator role."""
    allow(who, "operator", "send signals")

    async def run(request_id: str | None) -> Response:
        await guard(api, who, workflow_id)
        raw = await request.body()
        data = _json(raw) if raw.strip() else None
        sent = await api.client.signal(
            workflow_id, name, data, request_id=request_id, actor=actor(who)
        )
        return _accepted(workflow_id, request_id=sent)

    return await idempotency.once(api.keys, request, who.tenant, run, problems.render)


def _accepted(workflow_id: str, *, request_id: str, taken_up: bool | None = None) -> Response:
    url = status_url(workflow_id)
    body = Accepted(id=workflow_id, request_id=request_id, taken_up=taken_up, status_url=url)
    return answer(body, 202, {"Location": url})


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except RecursionError:
        raise ValidationError("request body: nested too deep") from None
    except ValueError as exc:
        raise problems.ProblemError(
            "malformed-request", f"request body: invalid JSON: {exc}"
        ) from None


def _body(raw: bytes, kind: type[B]) -> B | None:
    if not raw.strip():
        return None
    try:
        return msgspec.convert(_json(raw), kind)
    except msgspec.ValidationError as exc:
        raise ValidationError(f"request body: {exc}") from None
