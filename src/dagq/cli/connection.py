"""A command's store, opened through the :class:`~dagq.client.Client` for one call.

Apart from :mod:`dagq.cli.inspect` (which draws with rich) so that a command printing
plain lines — ``dagq status`` piped — imports no more than it uses.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from dagq.client import Client

T = TypeVar("T")


def with_client(
    store_url: str, body: Callable[[Client], Awaitable[T]], *, create: bool = False
) -> T:
    """Open the store (which must exist unless ``create``), run ``body``, close it."""

    async def main() -> T:
        async with Client(store_url, create=create) as client:
            return await body(client)

    return asyncio.run(main())
