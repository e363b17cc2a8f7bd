"""``dagq server``: check the options and the store, then serve with uvicorn.

uvicorn handles SIGTERM and SIGINT: it stops accepting connections, lets open
requests finish (server-sent event streams are ended by sse-starlette as the server
shuts down), closes the store and exits 0.
"""

from __future__ import annotations

import asyncio
import ipaddress

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
    server = uvicorn.Server(config)
    server.run()
    return 0 if server.started else 1


async def _check_store(store_url: str) -> None:
    """Open the store once, so a bad URL is one line before anything listens."""
    from dagq.stores import open_store

    store = open_store(store_url, create=True)
    await store.close()
