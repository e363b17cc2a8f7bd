"""Holding a lease: acquire (taking over from a dead local holder), renew, release.

A coordinator that cannot renew before its lease expires must stop writing; the
keeper sets ``lost`` and the coordinator checks it before every flush.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid

from dagq.errors import DagqError, LeaseHeld, LeaseLost
from dagq.stores.base import Lease, Store

log = logging.getLogger("dagq.lease")


def default_owner() -> str:
    """``host:pid:random`` — enough to tell whether a holder still lives."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def holder_is_dead_here(owner: str) -> bool:
    """True if ``owner`` names a process on this host that no longer exists."""
    host, _, rest = owner.partition(":")
    pid_text = rest.partition(":")[0]
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class LeaseKeeper:
    """Acquires, renews and releases one named lease."""

    def __init__(self, store: Store, name: str, *, ttl_s: float, owner: str | None = None) -> None:
        self.store = store
        self.name = name
        self.ttl_s = ttl_s
        self.owner = owner or default_owner()
        self.lease: Lease | None = None
        self.lost = False

    async def acquire(self, *, force: bool = False) -> Lease:
        """Take the lease; a holder that is a dead process on this host is taken over."""
        leases = self.store.leases
        try:
            self.lease = await leases.acquire(self.name, self.owner, self.ttl_s, force=force)
        except LeaseHeld as held:
            if not holder_is_dead_here(held.holder):
                raise
            log.warning(
                "taking over lease %r from %s, which is no longer running", self.name, held.holder
            )
            self.lease = await leases.acquire(self.name, self.owner, self.ttl_s, force=True)
        self.lost = False
        return self.lease

    async def keep(self) -> None:
        """Renew every third of the TTL until cancelled; mark ``lost`` if renewal fails."""
        while self.lease is not None and not self.lost:
            await asyncio.sleep(self.ttl_s / 3)
            try:
                self.lease = await self.store.leases.renew(self.lease, self.ttl_s)
            except LeaseLost:
                log.error("lease %r was lost", self.name)
                self.lost = True
            except DagqError as exc:
                if self.lease is not None and time.time() >= self.lease.expires_at:
                    log.error(
                        "lease %r expired while the store was unreachable: %s", self.name, exc
                    )
                    self.lost = True
                else:
                    log.warning("renewing lease %r failed, retrying: %s", self.name, exc)

    async def release(self) -> None:
        """Give the lease up; errors are logged (it will expire anyway)."""
        if self.lease is None:
            return
        try:
            await self.store.leases.release(self.lease)
        except DagqError as exc:
            log.warning("releasing lease %r failed (it will expire): %s", self.name, exc)
        self.lease = None
