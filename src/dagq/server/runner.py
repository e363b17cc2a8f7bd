"""``dagq server``: check the options and the store, then serve with uvicorn.

On SIGTERM or SIGINT uvicorn stops accepting connections and lets open requests
finish (streams are told to end: :mod:`dagq.server.stream`), then the store is
closed and the process exits 0. A second SIGINT stops waiting.
"""

from __future__ import annotations

import asyncio
import ipaddress
import signal
from types import FrameType
from typing import Any

from dagq.errors import UsageError
from dagq.server import require_extra

#: The longest a shutdown waits for open requests before closing them.
GRACE_S = 30


def check_loopback(host: str) -> None:
    """Refuse any address but loopback: the API has no access control yet."""
    if host == "localhost":
        return
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        raise UsageError(
            f"--host {host!r} is not an IP address; use 127.0.0.1, ::1 or localhost"
        ) from None
    if not address.is_loopback:
        raise UsageError(
            f"--host {host} is not a loopback address: the API has no access control yet, "
            "so it serves only this machine (127.0.0.1, ::1 or localhost); to serve others, "
            "put a reverse proxy that authenticates in front of it"
        )


def run_server(store_url: str, *, host: str, port: int) -> int:
    """Serve the API until SIGTERM/SIGINT; returns the exit code."""
    require_extra()
    check_loopback(host)
    asyncio.run(_check_store(store_url))

    import uvicorn

    from dagq.server.app import create_app
    from dagq.server.context import Settings

    app = create_app(Settings(store_url=store_url))
    config = uvicorn.Config(
        app,
        host=host.strip("[]"),
        port=port,
        timeout_graceful_shutdown=GRACE_S,
        log_level="info",
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


async def _check_store(store_url: str) -> None:
    """Open the store once, so a bad URL is one line before anything listens."""
    from dagq.stores import open_store

    store = open_store(store_url, create=True)
    await store.close()
