"""Leases as blob leases, one blob per lease name under ``leases/`` in the container.

Azure enforces the lease: only the holder of the lease id can renew or release it,
and it expires by itself. Blob leases last 15 to 60 seconds (whole seconds: a TTL
is rounded up); a TTL outside that range is refused. Who holds the lease and since
when is kept in the blob's metadata (owner, token = the Azure lease id,
acquired_at, expires_at), so a refused acquire can say who holds it and how long.

* ``acquire``: take the lease with a fresh lease id; if it is held, the same owner
  (a restarted holder) or ``force`` breaks it first, anyone else gets LeaseHeld;
* ``renew``: renew by lease id (Azure allows it after expiry as long as nobody took
  the lease since), LeaseLost otherwise;
* ``release``: release by lease id; a lease no longer ours is left alone;
* ``get``: the metadata, if Azure says the blob is leased.
"""

from __future__ import annotations

import contextlib
import math
import uuid
from urllib.parse import quote, unquote

import msgspec
from azure.core.exceptions import HttpResponseError, ResourceNotFoundError
from azure.storage.blob.aio import BlobClient, BlobLeaseClient

from dagq.errors import DagqError, LeaseHeld, ValidationError
from dagq.stores.azure_service import AzureService, Clients, error_code
from dagq.stores.base import Clock, Lease
from dagq.stores.common import check_ttl, lease_lost

LEASES = "leases/"
#: Azure's bounds on a blob lease, in seconds.
MIN_TTL_S = 15
MAX_TTL_S = 60
_HELD = {
    "LeaseAlreadyPresent",
    "LeaseIsBreakingAndCannotBeAcquired",
    "LeaseIsBrokenAndCannotBeRenewed",
}


def check_lease_ttl(name: str, ttl_s: float) -> int:
    """The TTL in whole seconds, or ValidationError naming Azure's limits."""
    check_ttl(name, ttl_s)
    if not MIN_TTL_S <= ttl_s <= MAX_TTL_S:
        raise ValidationError(
            f"lease {name!r}: ttl_s={ttl_s:g} is outside {MIN_TTL_S}-{MAX_TTL_S} seconds, "
            "the range of an Azure blob lease"
        )
    return math.ceil(round(ttl_s, 6))


class AzureLeases:
    """Named leases held as Azure blob leases."""

    def __init__(self, service: AzureService, clock: Clock) -> None:
        self._service = service
        self._clock = clock
        self._durations: dict[str, int] = {}  # lease id -> the duration Azure holds it for

    async def acquire(self, name: str, owner: str, ttl_s: float, *, force: bool = False) -> Lease:
        seconds = check_lease_ttl(name, ttl_s)
        token = str(uuid.uuid4())
        if force:
            await self._break(name)
        try:
            await self._lease_call(name, "acquire", token, seconds)
        except HttpResponseError as exc:
            if error_code(exc) not in _HELD:
                raise self._service.unavailable("blob.lease", exc) from exc
            held = await self._holder(name)
            if not force and (held is None or held.owner != owner):
                raise self._refusal(name, held) from exc
            await self._break(name)  # our own earlier lease (a restart), or forced
            await self._lease_call(name, "acquire", token, seconds)
        self._durations[token] = seconds
        now = self._clock()
        lease = Lease(name, owner, token, now, now + seconds)
        try:
            await self._describe(lease)
        except DagqError:
            # Not described, the lease would name its previous holder: give it back.
            with contextlib.suppress(DagqError):
                await self.release(lease)
            raise
        return lease

    async def renew(self, lease: Lease, ttl_s: float) -> Lease:
        seconds = check_lease_ttl(lease.name, ttl_s)
        try:
            await self._lease_call(lease.name, "renew", lease.token, seconds)
            if self._durations.get(lease.token) != seconds:
                # Renewing keeps the duration the lease was taken with; acquiring again
                # with the same (active) lease id sets a new one.
                await self._lease_call(lease.name, "acquire", lease.token, seconds)
                self._durations[lease.token] = seconds
        except HttpResponseError as exc:
            if isinstance(exc, ResourceNotFoundError) or error_code(exc).startswith("Lease"):
                raise lease_lost(lease) from exc
            raise self._service.unavailable("blob.lease", exc) from exc
        renewed = msgspec.structs.replace(lease, expires_at=self._clock() + seconds)
        await self._describe(renewed)
        return renewed

    async def release(self, lease: Lease) -> None:
        self._durations.pop(lease.token, None)
        try:
            await self._lease_call(lease.name, "release", lease.token, 0)
        except HttpResponseError as exc:
            if not (isinstance(exc, ResourceNotFoundError) or error_code(exc).startswith("Lease")):
                raise self._service.unavailable("blob.lease", exc) from exc

    async def get(self, name: str) -> Lease | None:
        return await self._holder(name)

    # --- storage calls -------------------------------------------------------------

    def _blob(self, c: Clients, name: str) -> BlobClient:
        return c.container.get_blob_client(LEASES + name)

    async def _lease_call(self, name: str, action: str, token: str, seconds: int) -> None:
        """acquire / renew / release the lease ``token`` on the lease blob (created if
        missing, for an acquire)."""

        async def call(c: Clients) -> None:
            client = BlobLeaseClient(self._blob(c, name), lease_id=token)
            if action == "acquire":
                await client.acquire(lease_duration=seconds)
            elif action == "renew":
                await client.renew()
            else:
                await client.release()

        try:
            await self._service.call("blob.lease", call, expect=(HttpResponseError,))
        except ResourceNotFoundError:
            if action != "acquire":
                raise
            await self._create_blob(name)
            await self._service.call("blob.lease", call, expect=(HttpResponseError,))

    async def _create_blob(self, name: str) -> None:
        async def create(c: Clients) -> None:
            await self._blob(c, name).upload_blob(b"", overwrite=False)

        try:
            await self._service.call("blob.put", create, expect=(HttpResponseError,))
        except HttpResponseError as exc:
            if exc.status_code not in (409, 412):  # made by a concurrent acquire: fine
                raise self._service.unavailable("blob.put", exc) from exc

    async def _break(self, name: str) -> None:
        async def breaking(c: Clients) -> None:
            await BlobLeaseClient(self._blob(c, name)).break_lease(lease_break_period=0)

        try:
            await self._service.call("blob.lease", breaking, expect=(HttpResponseError,))
        except HttpResponseError as exc:  # not leased, or no blob yet: nothing to break
            if not (isinstance(exc, ResourceNotFoundError) or error_code(exc).startswith("Lease")):
                raise self._service.unavailable("blob.lease", exc) from exc

    async def _describe(self, lease: Lease) -> None:
        """Record the holder in the blob's metadata (needs the lease id)."""
        metadata = {
            "owner": quote(lease.owner, safe=""),
            "token": lease.token,
            "acquired_at": repr(lease.acquired_at),
            "expires_at": repr(lease.expires_at),
        }

        async def write(c: Clients) -> None:
            await self._blob(c, lease.name).set_blob_metadata(metadata, lease=lease.token)

        await self._service.call("blob.metadata", write)

    async def _holder(self, name: str) -> Lease | None:
        async def read(c: Clients) -> Lease | None:
            properties = await self._blob(c, name).get_blob_properties()
            if properties.lease.state != "leased":
                return None
            meta = properties.metadata or {}
            if "token" not in meta:  # leased, but not described (yet)
                return Lease(name, "unknown", "", self._clock(), self._clock())
            return Lease(
                name,
                unquote(meta.get("owner", "unknown")),
                meta["token"],
                float(meta["acquired_at"]),
                float(meta["expires_at"]),
            )

        try:
            return await self._service.call("blob.head", read, expect=(ResourceNotFoundError,))
        except ResourceNotFoundError:
            return None

    def _refusal(self, name: str, held: Lease | None) -> LeaseHeld:
        now = self._clock()
        if held is None:
            return LeaseHeld(name, "another owner", 0.0, 0.0)
        return LeaseHeld(name, held.owner, now - held.acquired_at, held.expires_at - now)
