"""Who is calling: the one place the server decides that.

Every route depends on :func:`caller`, which reads ``Authorization: Bearer <token>``
and checks the token against its record in the store (:mod:`dagq.tokens`). Without
a header the caller is refused (401) when the server requires tokens, and is the
anonymous admin of every tenant when it does not (only ever on a loopback address:
:mod:`dagq.server.runner`). A token that is sent is always checked, required or not.

Records are cached for :data:`CACHE_S` seconds, so a server does not read the store
on every request: a revoked token stops working within that time on every server.
Expiry is checked on every request against the cached record, to the second.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, TypeVar

from fastapi import Depends
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.requests import Request

from dagq import tokens
from dagq.server import problems
from dagq.server.problems import ProblemError
from dagq.stores.base import Store
from dagq.tokens import Role, TokenRecord, TokenRejected

#: How long a token's record is trusted before it is read again: the longest a
#: revoked token may still be accepted.
CACHE_S = 5.0
#: Records kept at most; the oldest go first.
CACHE_ENTRIES = 1024
REALM = 'Bearer realm="dagq"'

T = TypeVar("T")
#: A server-sent event as sse-starlette takes it.
Event = dict[str, str | int]

__all__ = ["ANONYMOUS_ADMIN", "Access", "Caller", "Role", "caller", "unauthorized", "while_allowed"]


@dataclass(frozen=True, slots=True)
class Caller:
    """The identity a request acts as: a name (for the audit trail), a role, a tenant."""

    name: str
    role: Role
    #: The tenant whose workflows the caller sees; "" sees every tenant.
    tenant: str = ""

    def may(self, role: Role) -> bool:
        """Whether the caller's role includes ``role``."""
        return tokens.role_includes(self.role, role)


ANONYMOUS_ADMIN = Caller(name="anonymous", role="admin")


@dataclass(slots=True)
class Access:
    """A server's access control: whether a token is required, and the cache of the
    records of the tokens it has seen (``app.state.access``)."""

    store: Store
    required: bool
    cache_s: float = CACHE_S
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    _seen: dict[str, tuple[float, TokenRecord]] = field(default_factory=dict)

    async def caller(self, authorization: str | None) -> Caller:
        """The caller an ``Authorization`` header names (None: no header)."""
        if authorization is None:
            if self.required:
                raise unauthorized(
                    "this server requires a token: send 'Authorization: Bearer <token>' "
                    "(made with 'dagq token create')",
                    invalid=False,
                )
            return ANONYMOUS_ADMIN
        scheme, _, token = authorization.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise unauthorized("the Authorization header is not 'Bearer <token>'")
        try:
            record = await self._record(token)
            tokens.check_usable(record, self.wall())
        except TokenRejected as exc:
            raise unauthorized(str(exc)) from None
        return Caller(name=record.actor(), role=record.role, tenant=record.tenant)

    async def _record(self, token: str) -> TokenRecord:
        key = tokens.digest(token)
        now = self.clock()
        cached = self._seen.get(key)
        if cached is not None and now - cached[0] < self.cache_s:
            return cached[1]
        record = await tokens.lookup(self.store, token)  # unknown tokens are not cached
        self._seen.pop(key, None)
        self._seen[key] = (now, record)
        while len(self._seen) > CACHE_ENTRIES:
            del self._seen[next(iter(self._seen))]
        return record


async def while_allowed(request: Request, events: AsyncIterator[T]) -> AsyncIterator[T | Event]:
    """A stream's events, passed on while the caller's token still grants access.

    A stream outlives the check made when it opened: before each event goes out the
    token is checked again (its cached record: a store read every :data:`CACHE_S`),
    so a token revoked or expired meanwhile gets nothing more; the stream ends with an
    ``unauthorized`` event saying why.
    """
    access: Access = request.app.state.access
    header = request.headers.get("authorization")
    try:
        async for event in events:
            if header is not None:
                try:
                    await access.caller(header)
                except ProblemError as exc:
                    yield {"event": "unauthorized", "data": exc.detail}
                    return
            yield event
    finally:
        close = getattr(events, "aclose", None)  # a generator: end it now, not at GC
        if close is not None:
            await close()


def document_refusals(document: dict[str, Any]) -> None:
    """Add 401 and 403 to every operation of an OpenAPI document that takes a caller
    (those FastAPI marks with the token scheme), whichever router defined it."""
    refusals = problems.openapi_responses(401, 403)
    for operations in document.get("paths", {}).values():
        for operation in operations.values():
            if isinstance(operation, dict) and operation.get("security"):
                responses = operation.setdefault("responses", {})
                for status, response in refusals.items():
                    responses.setdefault(str(status), response)


def unauthorized(detail: str, *, invalid: bool = True) -> ProblemError:
    """A 401 with the ``WWW-Authenticate`` challenge RFC 6750 asks for."""
    challenge = f'{REALM}, error="invalid_token"' if invalid else REALM
    return ProblemError("unauthorized", detail, headers={"WWW-Authenticate": challenge})


#: Declares the scheme in the OpenAPI document (``/docs`` gets an "Authorize" button);
#: the header itself is read by :meth:`Access.caller`, which says what is wrong with it.
_BEARER = HTTPBearer(
    auto_error=False,
    scheme_name="token",
    description="A token made with 'dagq token create' (roles: viewer, operator, admin).",
)


async def caller(
    request: Request,
    _: Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)] = None,
) -> Caller:
    """The caller of the current request (a FastAPI dependency)."""
    access: Access = request.app.state.access
    return await access.caller(request.headers.get("authorization"))
