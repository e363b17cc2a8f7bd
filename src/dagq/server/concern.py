"""Which workflow a request concerns, for its log lines (the access line among them).

An ASGI middleware: when the response starts, the workflow (and task) the route was
about — its path parameters, or what the route named with :func:`about` (a submit
learns its id only as it runs) — becomes the current concern
(:mod:`dagq.observability.context`), so the access line uvicorn writes then carries
``workflow_id``, ``trace_id`` and ``task`` in ``--log-format json``.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dagq.observability import context

#: Where a route leaves the workflow id it learned (the scope is the request's own).
_KEY = "dagq.workflow_id"


def about(request: Request, workflow_id: str) -> None:
    """The request concerns ``workflow_id`` (for a route whose path does not name it)."""
    request.scope[_KEY] = workflow_id


class Concerned:
    """Makes the workflow a request is about the concern of the lines logged as it answers."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def sending(message: Message) -> None:
            if message["type"] != "http.response.start":
                await send(message)
                return
            found = _concern(scope)
            if found is None:
                await send(message)
                return
            with context.concerning(found):  # uvicorn logs the access line in this send
                await send(message)

        await self.app(scope, receive, sending)


def _concern(scope: Scope) -> context.Concern | None:
    params = scope.get("path_params") or {}
    workflow_id = params.get("workflow_id") or scope.get(_KEY)
    if not isinstance(workflow_id, str) or not workflow_id:
        return None
    task = params.get("name")
    return context.Concern(workflow_id=workflow_id, task=task if isinstance(task, str) else "")
