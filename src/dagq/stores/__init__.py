"""Stores: the four storage primitives behind one URL.

``open_store("memory://")`` gives an in-process store for tests;
``open_store("sqlite:///dagq.db")`` (relative) or ``open_store("sqlite:////abs/dagq.db")``
opens the embedded default, which several processes may share. A plain path ending
in ``.db`` means sqlite too. ``open_store("azure://ACCOUNT/PREFIX")`` opens a store in
an Azure Storage account (``devstoreaccount1``: the local Azurite emulator) that
processes on many machines may share; ``open_store("postgresql://USER@HOST:PORT/DB")``
one in a PostgreSQL database (``?schema=NAME``, default ``dagq``), likewise shared.

Each backend's module is imported when a URL names it, not before: a command on a
SQLite store loads neither the in-memory store nor the fault injector, let alone the
optional extras.
"""

from __future__ import annotations

import os
import time

from dagq.errors import ValidationError
from dagq.stores.base import DEFAULT_MAX_DELIVERIES, Clock, Store

SUPPORTED_URLS = (
    "memory://",
    "sqlite:///relative/path.db",
    "sqlite:////absolute/path.db",
    "azure://ACCOUNT/PREFIX",
    "postgresql://USER@HOST:PORT/DATABASE[?schema=NAME]",
)

#: The top-level packages of the ``azure`` extra.
_AZURE_PACKAGES = frozenset({"azure", "aiohttp"})
#: The top-level packages of the ``postgres`` extra.
_POSTGRES_PACKAGES = frozenset({"psycopg", "psycopg_pool"})

#: Set, the store injects the faults it names (:mod:`.faults`).
FAULTS_ENV = "DAGQ_FAULTS"

__all__ = ["Store", "open_store"]


def open_store(
    url: str,
    *,
    clock: Clock = time.time,
    max_deliveries: int = DEFAULT_MAX_DELIVERIES,
    create: bool = True,
) -> Store:
    """Open the store a URL names; an unknown scheme raises ValidationError.

    ``create=False`` (for commands that only look) refuses a store that does not exist.
    With ``DAGQ_FAULTS`` set, the store injects the faults it names (:mod:`.faults`).
    """
    store = _open(url, clock=clock, max_deliveries=max_deliveries, create=create)
    plan = os.environ.get(FAULTS_ENV, "")
    if not plan.strip():
        return store
    from dagq.stores.faults import parse_faults, with_faults

    return with_faults(store, parse_faults(plan))


def _open(url: str, *, clock: Clock, max_deliveries: int, create: bool) -> Store:
    if url == "memory://":
        from dagq.stores.memory import open_memory_store

        return open_memory_store(url, clock=clock, max_deliveries=max_deliveries)
    if url.startswith("sqlite:") or ("://" not in url and url.endswith(".db")):
        from dagq.stores.sqlite import open_sqlite_store

        return open_sqlite_store(url, clock=clock, max_deliveries=max_deliveries, create=create)
    if url.startswith("azure:"):
        # Imported here: the Azure SDKs take a third of a second to load, and they are
        # an optional extra.
        try:
            from dagq.stores.azure import open_azure_store
        except ImportError as exc:
            if (exc.name or "").partition(".")[0] not in _AZURE_PACKAGES:
                raise
            raise ValidationError(
                f"store URL {url!r} needs the Azure store, which is not installed "
                f"({exc.name or exc}); install it with: pip install 'dagq[azure]'"
            ) from exc

        return open_azure_store(url, clock=clock, max_deliveries=max_deliveries, create=create)
    if url.startswith(("postgresql:", "postgres:")):
        try:
            from dagq.stores.postgres import open_postgres_store
        except ImportError as exc:
            if (exc.name or "").partition(".")[0] not in _POSTGRES_PACKAGES:
                raise
            raise ValidationError(
                f"store URL {url!r} needs the PostgreSQL store, which is not installed "
                f"({exc.name or exc}); install it with: pip install 'dagq[postgres]'"
            ) from exc

        return open_postgres_store(url, clock=clock, max_deliveries=max_deliveries, create=create)
    raise ValidationError(
        f"store URL {url!r} is not supported; use one of: {', '.join(SUPPORTED_URLS)}, "
        "or a file path ending in .db"
    )
