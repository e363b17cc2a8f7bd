"""``dagq server``: check the options and the store, then serve with uvicorn.

Tokens are required with ``--auth``, and always on an address other than loopback;
only a server that answers this machine alone may serve without them, and it says so
in one line as it starts (docs/architecture.md, interfaces: access control).

On SIGTERM or SIGINT uvicorn stops accepting connections and lets open requests
finish (streams are told to end: :mod:`dagq.server.stream`), then the store is
closed and the process exits 0. A second SIGINT stops waiting.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import signal
import sys
from types import FrameType
from typing import Any

from dagq.errors import UsageError
from dagq.server import require_extra

log = logging.getLogger("dagq.server")

#: The longest a shutdown waits for open requests before closing them.
GRACE_S = 30


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an IP address or ``localhost``) reaches only this machine;
    UsageError if it is neither an address nor ``localhost``."""
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        raise UsageError(
            f"--host {host!r} is not an IP address; use 127.0.0.1, ::1, localhost, "
            "or an address of this machine (0.0.0.0 for all of them)"
        ) from None
    return address.is_loopback


def auth_required(host: str, *, auth: bool) -> bool:
    """Whether the server requires tokens: asked for, or bound beyond loopback."""
    return auth or not is_loopback(host)


def run_server(
    store_url: str,
    *,
    host: str,
    port: int,
    auth: bool = False,
    log_level: str = "info",
    log_format: str = "text",
) -> int:
    """Serve the API until SIGTERM/SIGINT; returns the exit code.

    With ``log_format`` ``json`` every line on stderr is a JSON object: uvicorn's
    records (requests among them) go through the handler the command set up
    (:mod:`dagq.cli.log_output`) instead of uvicorn's own, and so does the access line.
    """
    require_extra()
    required = auth_required(host, auth=auth)
    tokens = asyncio.run(_check_store(store_url))

    import uvicorn

    from dagq.server.app import create_app
    from dagq.server.context import Settings

    access = _access_line(host, required=required, tokens=tokens)
    if log_format == "json":
        log.warning("%s", access)
    else:
        print(access, file=sys.stderr, flush=True)
    app = create_app(Settings(store_url=store_url, auth=required))
    config = uvicorn.Config(
        app,
        host=host.strip("[]"),
        port=port,
        timeout_graceful_shutdown=GRACE_S,
        log_level=log_level.lower(),
        # json: no handlers of uvicorn's own; its records reach the root logger's
        log_config=None if log_format == "json" else uvicorn.config.LOGGING_CONFIG,
        server_header=False,
    )
    server = _server_class()(config)
    server.run()
    return 0 if server.started else 1


def _server_class() -> type[Any]:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, except that a signal that stopped it gracefully is not
        raised again once it has (uvicorn's default): a drained shutdown exits 0."""

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True  # a second Ctrl-C: stop waiting for requests
            else:
                self.should_exit = True

    return Server


def _access_line(host: str, *, required: bool, tokens: int) -> str:
    """What the server says of its access control as it starts, in one line."""
    if not required:
        return (
            f"dagq server: no token required on {host} (loopback only): every local caller "
            "acts as admin; --auth requires tokens"
        )
    why = "--auth" if is_loopback(host) else f"{host} is not loopback"
    if tokens == 0:
        return (
            f"dagq server: tokens required ({why}), and none is active: make one with "
            "'dagq token create --role admin'"
        )
    return f"dagq server: tokens required ({why}); {tokens} active"


async def _check_store(store_url: str) -> int:
    """Open the store once, so a bad URL is one line before anything listens; the
    number of active tokens."""
    from dagq.stores import open_store
    from dagq.tokens import list_tokens

    store = open_store(store_url, create=True)
    try:
        return sum(1 for t in await list_tokens(store) if t.status == "active")
    finally:
        await store.close()
