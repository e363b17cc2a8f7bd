"""``dagq store …``: commands that act on a store as a whole (migrate, copy)."""

from __future__ import annotations

import asyncio

from dagq.cli.inspect import EXIT_OK, console
from dagq.errors import UsageError, ValidationError
from dagq.stores import open_store
from dagq.stores.transfer import CopyReport


def run_migrate(store_url: str) -> int:
    """``dagq store migrate``: bring a PostgreSQL store's tables, or an Azure store's
    index layout, to this dagq's version."""
    if store_url.startswith("azure:"):
        return _migrate_azure(store_url)
    if not store_url.startswith(("postgresql:", "postgres:")):
        asyncio.run(_check(store_url))  # a bad URL or a missing store is still an error
        console().print(
            f"{store_url}: nothing to migrate (only PostgreSQL and Azure stores have versions)"
        )
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


def _migrate_azure(store_url: str) -> int:
    open_store(store_url, create=False)  # the URL checked, the azure extra installed
    from dagq.stores.azure_layout import LAYOUT, migrate_azure_store

    before, converted = asyncio.run(migrate_azure_store(store_url))
    if converted:
        console().print(
            f"{store_url}: migrated {converted} workflow(s) from index layout 1 to {LAYOUT}"
        )
    elif before == LAYOUT:
        console().print(f"{store_url}: index layout {LAYOUT}, up to date")
    else:
        console().print(f"{store_url}: marked as index layout {LAYOUT}")
    return EXIT_OK


async def _check(store_url: str) -> None:
    store = open_store(store_url, create=False)
    await store.close()


def run_copy(source_url: str, destination_url: str) -> int:
    """``dagq store copy SRC DST``: everything in SRC into the new, empty store DST."""
    from dagq.stores.transfer import copy_store

    if "memory://" in (source_url, destination_url):
        raise UsageError("memory:// lives only inside one process; copy between stores on disk")
    if source_url == destination_url:
        raise UsageError(f"SRC and DST are the same store ({source_url}); name a new, empty one")

    async def main() -> CopyReport:
        source = open_store(source_url, create=False)
        try:
            destination = open_store(destination_url)
            try:
                return await copy_store(source, destination)
            finally:
                await destination.close()
        finally:
            await source.close()

    report = asyncio.run(main())
    console().print(
        f"copied {source_url} to {destination_url}: {report.documents} document(s), "
        f"{report.index_rows} index row(s), {report.messages} pending message(s), "
        f"{report.dead_letters} dead letter(s)"
    )
    return EXIT_OK
