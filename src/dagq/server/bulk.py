"""``POST /v1/workflows/cancel`` and ``/v1/workflows/retry``: act on every run a filter
matches, after a dry run that counts them.

The filter is the listing's (:mod:`dagq.server.filters`), narrowed to the runs the
action can apply to: unfinished runs for a cancel, failed or cancelled ones for a
retry. ``dry_run`` (the default) only counts and names them; with ``"dry_run": false``
each is sent the request as ``POST …/{id}/cancel|retry`` would, and a run that
cannot take it any more (it ended, or was retried, meanwhile) is named in ``skipped``.
A real run honours ``Idempotency-Key`` like every POST that acts.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import replace
from typing import Annotated, Literal

import msgspec
from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from dagq.client import WorkflowSummary
from dagq.errors import UsageError, ValidationError
from dagq.server import idempotency, problems
from dagq.server.access import Caller, caller
from dagq.server.context import Api, actor, allow, answer, api_of, json_schema
from dagq.server.filters import run_filter
from dagq.server.problems import ProblemError
from dagq.server.workflows import matching_page
from dagq.state import WORKFLOW_ACTIVE

log = logging.getLogger("dagq.server")
router = APIRouter(prefix="/v1/workflows")
Who = Annotated[Caller, Depends(caller)]
Server = Annotated[Api, Depends(api_of)]
#: The most runs one bulk action matches (narrow the filter beyond).
MAX_MATCHED = 10_000
#: The statuses each action applies to.
APPLIES_TO: dict[str, frozenset[str]] = {
    "cancel": frozenset(WORKFLOW_ACTIVE),
    "retry": frozenset({"failed", "cancelled"}),
}


class BulkFilter(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Which runs: the filters of ``GET /v1/workflows``; ``dry_run`` only counts."""

    status: str | None = None
    name: str | None = None
    tenant: str | None = None
    label: list[str] | str | None = None
    created_after: str | float | None = None
    created_before: str | float | None = None
    dry_run: bool = True
    #: For a cancel: why (recorded in each run's history).
    reason: str | None = None


class Bulk(msgspec.Struct, frozen=True, kw_only=True):
    """The runs matched (their ids, newest first), and for a real run those skipped
    because they could not take the request any more, with why."""

    matched: int
    ids: list[str]
    dry_run: bool
    skipped: dict[str, str]


RESPONSES = {
    200: {"content": json_schema(Bulk)},
    **problems.openapi_responses(400, 403, 413, 422),
}


@router.post("/cancel", summary="Cancel every run a filter matches", responses=RESPONSES)
async def cancel_matching(request: Request, who: Who, api: Server) -> Response:
    """Body: the filters of the listing and ``dry_run`` (default true: count only)."""
    return await _act(request, who, api, "cancel")


@router.post("/retry", summary="Retry every run a filter matches", responses=RESPONSES)
async def retry_matching(request: Request, who: Who, api: Server) -> Response:
    """Body: the filters of the listing and ``dry_run`` (default true: count only)."""
    return await _act(request, who, api, "retry")


async def _act(
    request: Request, who: Who, api: Api, action: Literal["cancel", "retry"]
) -> Response:
    body = _body(await request.body())
    allow(who, "viewer" if body.dry_run else "operator", f"{action} workflows")

    async def run(request_id: str | None) -> Response:
        runs = await _matching(api, who, body, APPLIES_TO[action])
        skipped: dict[str, str] = {}
        if not body.dry_run:
            by = actor(who)
            for found in runs:
                # Under an Idempotency-Key each run's request id comes from it: a bulk
                # request sent again (or taken over from a server that died) acts once.
                one = None if request_id is None else _request_id_for(request_id, found.id)
                try:
                    if action == "cancel":
                        reason = body.reason or "cancelled by a bulk request"
                        await api.client.cancel(found.id, reason, request_id=one, actor=by)
                    else:
                        await api.client.retry(found.id, ack_timeout_s=0, request_id=one, actor=by)
                except UsageError as exc:  # it ended, or changed, meanwhile
                    skipped[found.id] = str(exc)
            log.info("%s requested %s of %d run(s)", by, action, len(runs))
        ids = [found.id for found in runs]
        return answer(Bulk(matched=len(ids), ids=ids, dry_run=body.dry_run, skipped=skipped))

    if body.dry_run:
        return await run(None)
    return await idempotency.once(api.keys, request, who.tenant, run, problems.render)


def _request_id_for(request_id: str, workflow_id: str) -> str:
    """The request id one run of a bulk request gets, derived from the request's."""
    return hashlib.sha256(f"{request_id}\n{workflow_id}".encode()).hexdigest()[:16]


async def _matching(
    api: Api, who: Caller, body: BulkFilter, applies: frozenset[str]
) -> list[WorkflowSummary]:
    labels = [body.label] if isinstance(body.label, str) else body.label
    wanted = run_filter(
        who,
        status=body.status,
        name=body.name,
        tenant=body.tenant,
        labels=labels,
        created_after=body.created_after,
        created_before=body.created_before,
    )
    found: list[WorkflowSummary] = []
    statuses = [body.status] if body.status else sorted(applies)
    for status in statuses:
        if status not in applies:
            continue  # nothing in that state can take the action
        cursor: str | None = None
        while True:
            page, cursor = await matching_page(
                api, replace(wanted, status=status), limit=500, cursor=cursor
            )
            found += page
            if len(found) > MAX_MATCHED:
                raise ProblemError(
                    "invalid",
                    f"the filter matches over {MAX_MATCHED} runs; narrow it "
                    "(name, label, created_after, created_before)",
                )
            if cursor is None:
                break
    return sorted(found, key=lambda run: (run.created_at, run.id), reverse=True)


def _body(raw: bytes) -> BulkFilter:
    try:
        return msgspec.json.decode(raw or b"{}", type=BulkFilter)
    except msgspec.ValidationError as exc:
        raise ValidationError(f"request body: {exc}") from None
    except msgspec.DecodeError as exc:
        raise ProblemError("malformed-request", f"request body: invalid JSON: {exc}") from None
