"""``/v1/tokens``: what ``dagq token`` does, for an admin over HTTP (the console).

A token bound to a tenant manages only that tenant's tokens: it lists only them, its
new tokens are of its tenant, and another tenant's token is not found (404).
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from fastapi import APIRouter, Depends, Path, Request
from starlette.responses import Response

from dagq.errors import UsageError, ValidationError
from dagq.server import problems
from dagq.server.access import Caller, caller
from dagq.server.context import Api, actor, allow, answer, api_of, json_schema
from dagq.tokens import (
    NewToken,
    TokenInfo,
    create_token,
    get_token,
    list_tokens,
    parse_duration,
    revoke_token,
)

router = APIRouter(prefix="/v1/tokens")
Who = Annotated[Caller, Depends(caller)]
Server = Annotated[Api, Depends(api_of)]


class Tokens(msgspec.Struct, frozen=True, kw_only=True):
    """Every token the caller may manage (never a secret)."""

    items: list[TokenInfo]


class TokenRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A token to make: as ``dagq token create`` takes it."""

    role: str
    tenant: str | None = None
    #: A duration: ``90d``, ``12h``, ``30m``, ``1d12h``.
    expires: str | None = None
    name: str = ""


SCHEMAS = (Tokens, NewToken, TokenInfo)


def _ok(struct: type[Any], *statuses: int) -> dict[int | str, dict[str, Any]]:
    return {200: {"content": json_schema(struct)}, **problems.openapi_responses(*statuses)}


@router.get("", summary="Access tokens", responses=_ok(Tokens))
async def tokens(who: Who, api: Server) -> Response:
    """Every token (of the caller's tenant, if it has one): role, tenant, status."""
    allow(who, "admin", "manage tokens")
    found = await list_tokens(api.client.store)
    return answer(Tokens(items=[t for t in found if _manages(who, t)]))


@router.post(
    "",
    status_code=201,
    summary="Make an access token",
    responses={
        201: {"description": "The token, shown once", "content": json_schema(NewToken)},
        **problems.openapi_responses(400, 422),
    },
)
async def make_token(request: Request, who: Who, api: Server) -> Response:
    """Body ``{"role", "tenant", "expires", "name"}``; the answer holds the token, the
    only time it is shown (the store keeps its hash)."""
    allow(who, "admin", "manage tokens")
    body = _request(await request.body())
    tenant = body.tenant if body.tenant is not None else who.tenant
    if who.tenant and tenant != who.tenant:
        raise problems.ProblemError(
            "forbidden", f"a token of tenant {who.tenant!r} may not make tokens of another"
        )
    try:
        expires_in_s = None if body.expires is None else parse_duration(body.expires)
        made = await create_token(
            api.client.store,
            role=body.role,
            tenant=tenant,
            expires_in_s=expires_in_s,
            name=body.name,
            created_by=actor(who),
        )
    except UsageError as exc:
        raise ValidationError(f"request body: {exc}") from None
    return answer(made, 201)


@router.post("/{token_id}/revoke", summary="Revoke an access token", responses=_ok(TokenInfo, 404))
async def revoke(
    token_id: Annotated[str, Path(description="The token's id (as listed).")],
    who: Who,
    api: Server,
) -> Response:
    """Servers refuse it within 5 seconds; revoking it again changes nothing."""
    allow(who, "admin", "manage tokens")
    found = await get_token(api.client.store, token_id)
    if found is None or not _manages(who, found):
        raise problems.ProblemError("not-found", f"no token with id {token_id[:40]!r}")
    return answer(await revoke_token(api.client.store, token_id))


def _manages(who: Caller, token: TokenInfo) -> bool:
    return not who.tenant or token.tenant == who.tenant


def _request(raw: bytes) -> TokenRequest:
    try:
        return msgspec.json.decode(raw or b"{}", type=TokenRequest)
    except msgspec.ValidationError as exc:
        raise ValidationError(f"request body: {exc}") from None
    except msgspec.DecodeError as exc:
        raise problems.ProblemError(
            "malformed-request", f"request body: invalid JSON: {exc}"
        ) from None
