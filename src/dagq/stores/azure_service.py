"""The connection of one azure store: SDK clients, limits, counts and error translation.

Every storage call of the azure backend goes through :meth:`AzureService.call`, which

* builds the async clients on first use (``open_store`` is synchronous, and an aiohttp
  session belongs to the event loop that creates it), creating the container and the
  table on the way, under a lock;
* shares one aiohttp session, hence one connection pool, between Blob, Queue and
  Table, and bounds the requests in flight with a semaphore;
* counts the call as one storage transaction of its kind (``blob.put``, ...);
* turns SDK errors into :mod:`dagq.errors` (``StoreUnavailable`` naming the store,
  the operation and Azure's error code), except the ones the caller expects.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
from collections import Counter
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp
from azure.core.credentials import AzureNamedKeyCredential, AzureSasCredential
from azure.core.exceptions import (
    AzureError,
    ClientAuthenticationError,
    HttpResponseError,
    ResourceExistsError,
    ResourceNotFoundError,
)
from azure.core.pipeline.transport import AioHttpTransport
from azure.data.tables.aio import TableClient, TableServiceClient
from azure.identity.aio import DefaultAzureCredential
from azure.storage.blob.aio import BlobClient, BlobServiceClient, ContainerClient
from azure.storage.queue.aio import QueueClient, QueueServiceClient

from dagq.errors import StoreUnavailable
from dagq.stores.azure_auth import AzureAuth, AzureTarget

_T = TypeVar("_T")

# The SDKs log every request at INFO and each failed sign-in attempt at WARNING;
# dagq reports failures itself, in one line. An explicit level set by the user wins.
for _name, _level in (
    ("azure.core.pipeline.policies.http_logging_policy", logging.WARNING),
    ("azure.identity", logging.ERROR),
):
    if logging.getLogger(_name).level == logging.NOTSET:
        logging.getLogger(_name).setLevel(_level)

#: Requests in flight at once, per store (also the size of the connection pool).
DEFAULT_CONCURRENCY = 64
#: Blob clients kept for reuse (the state headers, history and inputs lately written).
_BLOB_CLIENTS = 1024
#: Retries inside the SDK, quick ones: dagq's own loops retry what still fails. (The
#: storage SDKs' default waits 15 s and more between tries.)
_RETRIES = 2
_BACKOFF_S = 0.3
_STORAGE_RETRY: dict[str, Any] = {
    "retry_total": _RETRIES,
    "initial_backoff": _BACKOFF_S,
    "increment_base": 2,
    "random_jitter_range": _BACKOFF_S,
}

Credential = AzureNamedKeyCredential | AzureSasCredential | DefaultAzureCredential


def table_name(prefix: str) -> str:
    """The index table of a prefix: letters and digits only, and unique to the prefix."""
    digest = hashlib.sha256(prefix.encode()).hexdigest()[:8]
    return f"dagq{prefix.replace('-', '')}{digest}"


@dataclass(slots=True)
class Clients:
    """The SDK clients of one store, built on first use."""

    session: aiohttp.ClientSession
    credential: Credential
    blobs: BlobServiceClient
    container: ContainerClient
    queues: QueueServiceClient
    tables: TableServiceClient
    table: TableClient
    loop: asyncio.AbstractEventLoop


class AzureService:
    """The clients, counters and limits shared by the four azure primitives of a store.

    ``on_open`` runs once the clients are built and the container and table made sure
    of, before any call goes through (the index layout check,
    :func:`.azure_layout.check_layout`); its error is every call's.
    """

    def __init__(
        self,
        target: AzureTarget,
        auth: AzureAuth,
        *,
        create: bool = True,
        concurrency: int = DEFAULT_CONCURRENCY,
        on_open: Callable[[AzureService, Clients], Awaitable[None]] | None = None,
    ) -> None:
        self.target = target
        self._on_open = on_open
        self.auth = auth
        self.create = create
        self.container_name = target.prefix
        self.table_name = table_name(target.prefix)
        self.transactions: Counter[str] = Counter()
        self._concurrency = concurrency
        self._semaphore = asyncio.Semaphore(concurrency)
        self._lock = asyncio.Lock()
        self._clients: Clients | None = None
        self._queue_clients: dict[str, QueueClient] = {}
        self._blob_clients: dict[str, BlobClient] = {}
        self._closed = False

    @property
    def url(self) -> str:
        """The store URL, for error messages."""
        return self.target.url

    async def clients(self) -> Clients:
        """The SDK clients, built (and the container and table made sure of) once."""
        clients = self._clients
        if clients is not None:
            if clients.loop is not asyncio.get_running_loop():
                raise StoreUnavailable(
                    f"azure store {self.url} is used from a second event loop; open one "
                    "store per event loop"
                )
            return clients
        if self._closed:
            raise StoreUnavailable(f"azure store {self.url} is closed")
        async with self._lock:
            if self._clients is None:
                built = self._build()
                try:
                    await self._prepare(built)
                    if self._on_open is not None:
                        await self._on_open(self, built)
                except BaseException:
                    await _close_clients(built)
                    raise
                self._clients = built
        return self._clients

    def blob_client(self, clients: Clients, name: str) -> BlobClient:
        """The client of one blob of the container, kept for the blobs used lately
        (building one costs a tenth of a request's CPU time)."""
        client = self._blob_clients.pop(name, None)
        if client is None:
            client = clients.container.get_blob_client(name)
        self._blob_clients[name] = client  # most recently used last
        if len(self._blob_clients) > _BLOB_CLIENTS:
            del self._blob_clients[next(iter(self._blob_clients))]
        return client

    def queue_client(self, clients: Clients, name: str) -> QueueClient:
        """The client of one Azure queue (raw text messages; dagq encodes them)."""
        client = self._queue_clients.get(name)
        if client is None:
            client = clients.queues.get_queue_client(name)
            self._queue_clients[name] = client
        return client

    async def call(
        self,
        kind: str,
        operation: Callable[[Clients], Awaitable[_T]],
        *,
        expect: tuple[type[AzureError], ...] = (),
    ) -> _T:
        """Run one storage transaction, counted as ``kind``; errors become dagq errors.

        Exceptions of the ``expect`` types reach the caller as they are, to be handled.
        """
        clients = await self.clients()
        self.transactions[kind] += 1
        async with self._semaphore:
            try:
                return await operation(clients)
            except expect:
                raise
            except AzureError as exc:
                raise self.unavailable(kind, exc) from exc

    async def pages(
        self, kind: str, pager: Callable[[Clients], Any]
    ) -> AsyncGenerator[list[Any], None]:
        """The pages of a listing (``pager`` returns the SDK's paged iterable), one
        transaction each."""
        clients = await self.clients()
        iterator = pager(clients).by_page()
        while True:
            async with self._semaphore:
                try:
                    page = await anext(iterator)
                    items = [item async for item in page]
                except StopAsyncIteration:  # no request made: the last page was the end
                    return
                except AzureError as exc:
                    self.transactions[kind] += 1
                    raise self.unavailable(kind, exc) from exc
            self.transactions[kind] += 1
            yield items

    def unavailable(self, kind: str, exc: AzureError) -> StoreUnavailable:
        """The dagq error for an SDK error the caller did not expect."""
        if isinstance(exc, ClientAuthenticationError):
            return StoreUnavailable(
                f"azure store {self.url}: {kind} was refused ({describe(exc)}); check "
                "AZURE_STORAGE_CONNECTION_STRING or your Azure login (az login) and its "
                "roles on the account"
            )
        return StoreUnavailable(f"azure store {self.url}: {kind} failed: {describe(exc)}")

    async def close(self) -> None:
        """Close every client, then the shared session and the credential."""
        self._closed = True
        clients, self._clients = self._clients, None
        queue_clients, self._queue_clients = list(self._queue_clients.values()), {}
        self._blob_clients = {}  # they share the container's transport: nothing to close
        for client in queue_clients:
            await client.close()
        if clients is not None:
            await _close_clients(clients)

    def _build(self) -> Clients:
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self._concurrency),
            cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=False,
            trust_env=_trusts_environment(),
        )
        credential = _credential(self.target, self.auth)
        endpoints = self.auth.endpoints

        def transport() -> AioHttpTransport:
            return AioHttpTransport(session=session, session_owner=False)

        blobs = BlobServiceClient(
            endpoints.blob,
            credential=credential,
            transport=transport(),
            **_STORAGE_RETRY,
        )
        queues = QueueServiceClient(
            endpoints.queue,
            credential=credential,
            transport=transport(),
            **_STORAGE_RETRY,
        )
        tables = TableServiceClient(
            endpoints.table,
            credential=credential,
            transport=transport(),
            retry_total=_RETRIES,
            retry_backoff_factor=_BACKOFF_S,
        )
        return Clients(
            session=session,
            credential=credential,
            blobs=blobs,
            container=blobs.get_container_client(self.container_name),
            queues=queues,
            tables=tables,
            table=tables.get_table_client(self.table_name),
            loop=asyncio.get_running_loop(),
        )

    async def _prepare(self, clients: Clients) -> None:
        """Create the container and the table, or (``create=False``) insist they exist."""
        try:
            if not self.create:
                self.transactions["container.properties"] += 1
                await clients.container.get_container_properties()
                return
            self.transactions["container.create"] += 1
            with contextlib.suppress(ResourceExistsError):
                await clients.container.create_container()
            self.transactions["table.create"] += 1
            with contextlib.suppress(ResourceExistsError):
                await clients.tables.create_table(self.table_name)
        except ResourceNotFoundError as exc:
            raise StoreUnavailable(
                f"no dagq store at {self.url}: container {self.container_name!r} does not "
                "exist (nothing was ever submitted there); check --store or DAGQ_STORE"
            ) from exc
        except ClientAuthenticationError as exc:
            raise self.unavailable("opening", exc) from exc
        except AzureError as exc:
            raise StoreUnavailable(
                f"cannot open azure store {self.url} at {self.auth.endpoints.blob} "
                f"(signed in by {self.auth.source}): {describe(exc)}"
            ) from exc


def describe(exc: AzureError) -> str:
    """Azure's status and error code, or the kind of failure, in a few words."""
    if isinstance(exc, HttpResponseError) and exc.status_code is not None:
        code = error_code(exc) or getattr(exc.response, "reason", None) or "error"
        return f"HTTP {exc.status_code} {code}"
    text = str(exc).strip()
    first_line = text.splitlines()[0] if text else type(exc).__name__
    return f"{type(exc).__name__}: {first_line}"[:300]


def error_code(exc: AzureError) -> str:
    """Azure's error code of a failed request ('' when there is none)."""
    code = getattr(exc, "error_code", None) or ""
    return str(getattr(code, "value", code))  # the SDKs give a str enum, or a str


def _trusts_environment() -> bool:
    """Whether the session is to follow the environment's proxy settings and ``.netrc``:
    only when there are some. A session that trusts the environment looks both up at
    every request, each time in a thread (two hand-offs between threads a request: a
    blob put cost 1.75 ms of CPU with them, 1.31 without, on the 2-core machine the
    benchmarks run on); without any, it finds nothing either way."""
    for name in os.environ:
        if name.lower().endswith("_proxy") or name == "NETRC":
            return True
    return any(os.path.exists(os.path.expanduser(f"~/{name}")) for name in (".netrc", "_netrc"))


def _credential(target: AzureTarget, auth: AzureAuth) -> Credential:
    if auth.key is not None:
        return AzureNamedKeyCredential(target.account, auth.key)
    if auth.sas is not None:
        return AzureSasCredential(auth.sas)
    return DefaultAzureCredential()


async def _close_clients(clients: Clients) -> None:
    for client in (clients.table, clients.tables, clients.container, clients.blobs):
        await client.close()
    await clients.queues.close()
    await clients.session.close()
    if isinstance(clients.credential, DefaultAzureCredential):
        await clients.credential.close()
