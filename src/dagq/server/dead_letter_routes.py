"""``/v1/dead-letters``: dead-lettered messages listed, shown, replayed, purged.

What ``dagq dlq`` does (:mod:`dagq.dead_letters`), for the admin role only: a dead
letter may carry any tenant's tasks, and replaying or purging one acts on the store.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import Annotated, Any, Protocol

import msgspec
from fastapi import APIRouter, Depends, Path, Query, Request
from starlette.responses import Response

from dagq import dead_letters
from dagq.dead_letters import DeadLetterInfo
from dagq.errors import UsageError, ValidationError
from dagq.server import problems
from dagq.server.access import Caller, caller
from dagq.server.context import Api, actor, allow_store_wide, answer, api_of, json_schema
from dagq.server.problems import ProblemError

log = logging.getLogger("dagq.server")
router = APIRouter(prefix="/v1/dead-letters")
Who = Annotated[Caller, Depends(caller)]
Server = Annotated[Api, Depends(api_of)]
#: The most keys one replay or purge takes.
MAX_KEYS = 1000


class DeadLetters(msgspec.Struct, frozen=True, kw_only=True):
    """Dead letters, oldest first."""

    items: list[DeadLetterInfo]


class DeadLetterShown(msgspec.Struct, frozen=True, kw_only=True):
    """One dead letter and the message it holds, decoded as far as it can be."""

    dead_letter: DeadLetterInfo
    body: Any


class Keys(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Which dead letters to act on."""

    keys: list[str]


class Count(msgspec.Struct, frozen=True, kw_only=True):
    """How many dead letters were acted on."""

    count: int


SCHEMAS = (DeadLetters, DeadLetterShown, Count)


@router.get(
    "",
    summary="Dead letters",
    responses={200: {"content": json_schema(DeadLetters)}, **problems.openapi_responses(403)},
)
async def list_dead_letters(
    who: Who,
    api: Server,
    queue: Annotated[str | None, Query(description="Only this queue's.")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> Response:
    """Dead-lettered messages (of ``queue``, or every queue), oldest first."""
    allow_store_wide(who, "admin", "see dead letters")
    return answer(DeadLetters(items=await api.client.dead_letters(queue, limit=limit)))


@router.post(
    "/replay",
    summary="Send dead letters back to their queues",
    responses={
        200: {"content": json_schema(Count)},
        **problems.openapi_responses(400, 403, 404, 422),
    },
)
async def replay(request: Request, who: Who, api: Server) -> Response:
    """Body ``{"keys": [...]}``: each goes back to its queue (after a fix), then is
    removed; an unknown key refuses them all (404)."""
    allow_store_wide(who, "admin", "replay dead letters")
    return await _act(request, who, api.client.replay_dead_letters, "replayed")


@router.post(
    "/purge",
    summary="Remove dead letters for good",
    responses={
        200: {"content": json_schema(Count)},
        **problems.openapi_responses(400, 403, 404, 422),
    },
)
async def purge(request: Request, who: Who, api: Server) -> Response:
    """Body ``{"keys": [...]}``: removed for good; an unknown key refuses them all."""
    allow_store_wide(who, "admin", "purge dead letters")
    return await _act(request, who, api.client.purge_dead_letters, "purged")


@router.get(
    "/{key:path}",
    summary="One dead letter and its message",
    responses={
        200: {"content": json_schema(DeadLetterShown)},
        **problems.openapi_responses(403, 404),
    },
)
async def show(
    key: Annotated[str, Path(description="The dead letter's key (as listed).")],
    who: Who,
    api: Server,
) -> Response:
    """The dead letter and what it carried (tasks or events, or its bytes as text)."""
    allow_store_wide(who, "admin", "see dead letters")
    found = await api.client.store.queues.dead_letter_of(key)
    if found is None:
        raise ProblemError("not-found", f"no dead letter with key {key[:80]!r}")
    return answer(
        DeadLetterShown(dead_letter=dead_letters.describe(found), body=dead_letters.body_of(found))
    )


async def _act(request: Request, who: Caller, act: Act, done: str) -> Response:
    """Replay or purge the dead letters the body names (recorded, with who did it, in
    the runs they concern); an unknown key refuses them all."""
    wanted = await _keys(request)
    try:
        count = await act(wanted, actor=actor(who))
    except UsageError as exc:  # an unknown key
        raise ProblemError("not-found", str(exc)) from None
    log.info("%s %s %d dead letter(s): %s", actor(who), done, count, ", ".join(wanted))
    return answer(Count(count=count))


class Act(Protocol):
    """``Client.replay_dead_letters`` or ``Client.purge_dead_letters``."""

    def __call__(self, which: list[str], *, actor: str | None = None) -> Awaitable[int]: ...


async def _keys(request: Request) -> list[str]:
    raw = await request.body()
    try:
        body = msgspec.json.decode(raw or b"null", type=Keys)
    except msgspec.ValidationError as exc:
        raise ValidationError(f"request body: {exc}") from None
    except msgspec.DecodeError as exc:
        raise ProblemError("malformed-request", f"request body: invalid JSON: {exc}") from None
    if not body.keys:
        raise ValidationError('request body: "keys" names no dead letter')
    if len(body.keys) > MAX_KEYS:
        raise ValidationError(f'request body: "keys" names over {MAX_KEYS} dead letters')
    return body.keys
