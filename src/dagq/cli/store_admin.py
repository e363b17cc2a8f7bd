"""``dagq store …``: commands that act on a store as a whole (migrate, copy)."""

from __future__ import annotations

import asyncio

from dagq.cli.inspect import EXIT_OK, console
from dagq.errors import ValidationError
from dagq.stores import open_store


def run_migrate(store_url: str) -> int:
    """``dagq store migrate``: bring a PostgreSQL store's tables to this dagq's version."""
    if not store_url.startswith(("postgresql:", "postgres:")):
        asyncio.run(_check(store_url))  # a bad URL or a missing store is still an error
        console().print(f"{store_url}: nothing to migrate (only PostgreSQL stores have versions)")
        return EXIT_OK
    try:
        from dagq.stores.postgres import migrate_postgres_store
    except ImportError as exc:
        raise ValidationError(
            f"store URL {store_url!r} needs the PostgreSQL store, which is not installed "
            f"({exc.name or exc}); install it with: pip install 'dagq[postgres]'"
        ) from exc
    before, after = asyncio.run(migrate_postgres_store(store_url))
    if before == after:
        console().print(f"{store_url}: schema version {after}, up to date")
    elif before is None:
        console().print(f"{store_url}: created, schema version {after}")
    else:
        console().print(f"{store_url}: migrated from schema version {before} to {after}")
    return EXIT_OK


async def _check(store_url: str) -> None:
    store = open_store(store_url, create=False)
    await store.close()
