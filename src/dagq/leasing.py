"""Holding a lease: acquire (taking over from a dead local holder), renew, release.

A coordinator that cannot renew before its lease expires must stop writing. The
keeper sets ``lost`` when a renewal is refused, and :meth:`LeaseKeeper.check`, which
the coordinator calls before every write and acknowledgement, also refuses once the
lease *may* have expired by this process's own clock: the last successful renewal
began more than the TTL, less a safety margin, ago (a renewal that hangs, a keeper
that died). Where the store can, the check is also part of the commit itself
(:class:`dagq.stores.base.FenceOp`).
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
    return _zombie(pid)


def _zombie(pid: int) -> bool:
    """A killed process its parent has not reaped yet still answers ``kill(pid, 0)``,
    but it runs no code: its state in ``/proc`` is Z (zombie) or X (dead)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            text = stat.read()
    except OSError:  # no procfs here, or the process just went
        return False
    # The state follows the command name, which is in parentheses and may hold spaces.
    fields = text.rpartition(")")[2].split()
    return bool(fields) and fields[0] in ("Z", "X")


class LeaseKeeper:
    """Acquires, renews and releases one named lease."""

    def __init__(self, store: Store, name: str, *, ttl_s: float, owner: str | None = None) -> None:
        self.store = store
        self.name = name
        self.ttl_s = ttl_s
        self.owner = owner or default_owner()
        self.lease: Lease | None = None
        self.lost = False
        #: The lease counts as held, by this process's monotonic clock, until then: the
        #: start of the last successful acquire or renewal plus the TTL, less a margin
        #: for clocks that drift and calls that take time.
        self.margin_s = max(0.2 * ttl_s, 0.1)
        self._valid_until = float("inf")

    async def acquire(self, *, force: bool = False) -> Lease:
        """Take the lease; a holder that is a dead process on this host is taken over."""
        leases = self.store.leases
        began = time.monotonic()
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
        self._valid_until = began + self.ttl_s - self.margin_s
        return self.lease

    def check(self) -> None:
        """Raise LeaseLost unless the lease is surely still ours (call before acting).

        A keeper that never acquired (a coordinator driven step by step, in tests and
        tools) holds nothing to lose and is not fenced.
        """
        if self.lost:
            raise LeaseLost(f"the {self.name} lease was lost; stopping without writing")
        if self.lease is not None and time.monotonic() >= self._valid_until:
            self.lost = True
            raise LeaseLost(
                f"the {self.name} lease may have expired: no renewal has succeeded for "
                f"{self.ttl_s - self.margin_s:g}s (its TTL is {self.ttl_s:g}s); "
                "stopping without writing"
            )

    async def keep(self) -> None:
        """Renew every third of the TTL until cancelled; mark ``lost`` if renewal fails.

        Anything unexpected marks the lease lost too before it propagates (to the
        supervisor, which stops the process): a lease nobody renews is not held.
        """
        try:
            await self._renew_forever()
        except Exception:
            self.lost = True
            raise

    async def _renew_forever(self) -> None:
        while self.lease is not None and not self.lost:
            await asyncio.sleep(self.ttl_s / 3)
            began = time.monotonic()
            try:
                self.lease = await self.store.leases.renew(self.lease, self.ttl_s)
                self._valid_until = began + self.ttl_s - self.margin_s
            except LeaseLost:
                log.error("lease %r was lost", self.name)
                self.lost = True
            except DagqError as exc:
                if time.monotonic() >= self._valid_until:
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
