"""Errors as problem details (RFC 9457, ``application/problem+json``).

Every error the API returns has a stable ``type`` (a URN naming the kind of problem),
a ``title`` (the same for every problem of that type), the HTTP ``status`` and a
``detail`` saying what was wrong with this request. No traceback leaves the server:
an unexpected exception is logged here and answered with a bare 500.
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from dagq.errors import (
    DagqError,
    DamagedData,
    PayloadTooLarge,
    StoreUnavailable,
    TaskNotFound,
    TransientError,
    UsageError,
    ValidationError,
    WorkflowExists,
    WorkflowNotFound,
)

log = logging.getLogger("dagq.server")

MEDIA_TYPE = "application/problem+json"


class Problem(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One problem, as RFC 9457 shapes it."""

    type: str
    title: str
    status: int
    detail: str
    instance: str | None = None


#: slug -> (status, title): every kind of problem the API answers with.
KINDS: dict[str, tuple[int, str]] = {
    "malformed-request": (400, "The request could not be read"),
    "bad-idempotency-key": (400, "The Idempotency-Key header is not valid"),
    "forbidden": (403, "The caller may not do this"),
    "not-found": (404, "No such resource"),
    "method-not-allowed": (405, "Method not allowed"),
    "conflict": (409, "The request conflicts with the current state"),
    "idempotency-key-in-use": (409, "A request with this Idempotency-Key is still in flight"),
    "too-large": (413, "The request is too large"),
    "unsupported-media-type": (415, "Unsupported media type"),
    "invalid": (422, "The request is not valid"),
    "idempotency-key-reused": (422, "This Idempotency-Key was used for a different request"),
    "damaged-data": (500, "Stored data cannot be read"),
    "internal": (500, "Internal server error"),
    "unavailable": (503, "The store is unavailable"),
}


class ProblemError(Exception):
    """Raised by routes to answer with a problem of one of the :data:`KINDS`."""

    def __init__(self, kind: str, detail: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.kind = kind
        self.detail = detail
        self.headers = headers or {}


def problem(kind: str, detail: str, *, instance: str | None = None) -> Problem:
    """The problem of kind ``kind`` (a key of :data:`KINDS`)."""
    status, title = KINDS[kind]
    return Problem(
        type=f"urn:dagq:problem:{kind}",
        title=title,
        status=status,
        detail=detail,
        instance=instance,
    )


def response(found: Problem, headers: dict[str, str] | None = None) -> Response:
    """A problem as an HTTP response."""
    return Response(
        msgspec.json.encode(found), status_code=found.status, media_type=MEDIA_TYPE, headers=headers
    )


def render(exc: Exception, instance: str | None = None) -> Response | None:
    """The problem response for an error a route raised on purpose; None for any other
    (a failure of the server's own)."""
    if isinstance(exc, ProblemError):
        return response(problem(exc.kind, exc.detail, instance=instance), exc.headers)
    if isinstance(exc, DagqError) and kind_of(exc) != "internal":
        return response(problem(kind_of(exc), str(exc), instance=instance))
    return None


def kind_of(exc: DagqError) -> str:
    """The problem kind a dagq error maps to."""
    for error, kind in _ERROR_KINDS:
        if isinstance(exc, error):
            return kind
    return "conflict" if isinstance(exc, UsageError) else "internal"


#: Checked in order: subclasses before their bases.
_ERROR_KINDS: tuple[tuple[type[DagqError], str], ...] = (
    (WorkflowNotFound, "not-found"),
    (TaskNotFound, "not-found"),
    (PayloadTooLarge, "too-large"),
    (ValidationError, "invalid"),
    (WorkflowExists, "conflict"),
    (DamagedData, "damaged-data"),
    (StoreUnavailable, "unavailable"),
    (TransientError, "unavailable"),
)

_HTTP_KINDS = {
    400: "malformed-request",
    403: "forbidden",
    404: "not-found",
    405: "method-not-allowed",
    413: "too-large",
    415: "unsupported-media-type",
}


def install(app: FastAPI) -> None:
    """Answer every error of ``app`` with problem JSON."""

    async def on_problem(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ProblemError)
        return response(problem(exc.kind, exc.detail, instance=request.url.path), exc.headers)

    async def on_dagq(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, DagqError)
        kind = kind_of(exc)
        if kind == "internal":
            log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return response(problem(kind, str(exc), instance=request.url.path))

    async def on_http(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        kind = _HTTP_KINDS.get(exc.status_code, "malformed-request")
        detail = exc.detail if isinstance(exc.detail, str) else KINDS[kind][1]
        found = problem(kind, detail, instance=request.url.path)
        if found.status != exc.status_code:
            found = msgspec.structs.replace(found, status=exc.status_code)
        return response(found, dict(exc.headers or {}))

    async def on_invalid(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        return response(problem("invalid", _describe(exc.errors()), instance=request.url.path))

    async def on_unexpected(request: Request, exc: Exception) -> Response:
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return response(
            problem("internal", "the server failed to answer; see its log", instance=None)
        )

    app.add_exception_handler(ProblemError, on_problem)
    app.add_exception_handler(DagqError, on_dagq)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(RequestValidationError, on_invalid)
    app.add_exception_handler(Exception, on_unexpected)


def _describe(errors: Any) -> str:
    """FastAPI's validation errors as one line: where, and what is wrong."""
    parts = []
    for error in list(errors)[:5]:
        where = ".".join(str(p) for p in error.get("loc", ()))
        parts.append(f"{where}: {error.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request"


def openapi_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses`` entry of a route for the problems it may answer with."""
    ref = {"$ref": "#/components/schemas/Problem"}
    return {
        status: {
            "description": _TITLES.get(status, "Problem"),
            "content": {MEDIA_TYPE: {"schema": ref}},
        }
        for status in statuses
    }


_TITLES = {status: title for status, title in reversed(KINDS.values())}
