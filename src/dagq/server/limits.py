"""The request body limit: a body over it is refused with 413 before it is all read."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dagq.payloads import MAX_DEFINITION_BYTES
from dagq.server import problems

#: The largest body the API reads: a definition at its own bound, with room for the
#: JSON envelope (params are bounded far below it).
MAX_BODY_BYTES = MAX_DEFINITION_BYTES + 2 * 1024 * 1024


class BodyLimit:
    """ASGI middleware: 413 for a declared Content-Length over the limit, and for a
    (chunked) body that turns out longer than it while being read."""

    def __init__(self, app: ASGIApp, *, max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            answer = problems.response(
                problems.problem("too-large", self._detail(int(declared)), instance=scope["path"]),
                {"Connection": "close"},
            )
            await answer(scope, receive, send)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise problems.ProblemError("too-large", self._detail(seen, more=True))
            return message

        await self.app(scope, counted, send)

    def _detail(self, size: int, *, more: bool = False) -> str:
        got = f"over {size}" if more else str(size)
        return f"the request body is {got} bytes, over the limit of {self.max_bytes} bytes"
