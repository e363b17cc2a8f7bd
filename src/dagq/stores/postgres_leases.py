"""Leases of the PostgreSQL store: a row per lease with an expiry.

Acquisition is one ``INSERT … ON CONFLICT DO UPDATE … WHERE`` statement: the row is
taken only if it is free, expired, already ours or ``force`` is given, so two
coordinators starting at once cannot both win. A batch's fence locks the row
(``FOR SHARE``) for its transaction, so a lease cannot change hands mid-commit.
"""

from __future__ import annotations

import msgspec

from dagq.errors import LeaseHeld, LeaseLost
from dagq.stores.base import Lease
from dagq.stores.common import check_ttl, lease_lost, new_token
from dagq.stores.postgres_database import Conn, Database

_TAKE = """
INSERT INTO {s}.leases AS held (name, owner, token, acquired_at, expires_at)
VALUES (%(name)s, %(owner)s, %(token)s, %(now)s, %(expires)s)
ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, token = excluded.token,
    acquired_at = excluded.acquired_at, expires_at = excluded.expires_at
WHERE %(force)s OR held.owner = excluded.owner OR held.expires_at <= %(now)s
RETURNING token
"""


_FENCE = """
WITH held AS (SELECT 1 FROM {s}.leases WHERE name = %s AND token = %s FOR SHARE)
SELECT {s}.fail(%s) WHERE NOT EXISTS (SELECT 1 FROM held)
"""


async def fence(db: Database, conn: Conn, name: str, token: str, guard: str) -> None:
    """In a pipelined batch: fail with ``guard`` unless lease ``name`` is held with
    ``token``; else keep the row locked until the commit."""
    await conn.execute(db.sql(_FENCE), (name, token, guard))


def fence_lost(name: str) -> LeaseLost:
    """The error of a batch whose fence failed."""
    return LeaseLost(f"lease {name!r} is no longer held; nothing was written")


class PostgresLeases:
    """Leases in the ``leases`` table."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def acquire(self, name: str, owner: str, ttl_s: float, *, force: bool = False) -> Lease:
        check_ttl(name, ttl_s)
        now = self._db.clock()
        lease = Lease(name, owner, new_token(), now, now + ttl_s)
        args = {
            "name": name,
            "owner": owner,
            "token": lease.token,
            "now": now,
            "expires": lease.expires_at,
            "force": force,
        }
        if await self._db.row(_TAKE, args) is not None:
            return lease
        sql = "SELECT owner, acquired_at, expires_at FROM {s}.leases WHERE name = %s"
        held = await self._db.row(sql, (name,))
        if held is None:  # released in between: try once more
            if await self._db.row(_TAKE, args) is not None:
                return lease
            held = await self._db.row(sql, (name,))
        owner_now, acquired_at, expires_at = held or (owner, now, now)
        raise LeaseHeld(name, owner_now, now - acquired_at, expires_at - now)

    async def renew(self, lease: Lease, ttl_s: float) -> Lease:
        check_ttl(lease.name, ttl_s)
        expires_at = self._db.clock() + ttl_s
        sql = "UPDATE {s}.leases SET expires_at = %s WHERE name = %s AND token = %s"
        if await self._db.count(sql, (expires_at, lease.name, lease.token)) == 0:
            raise lease_lost(lease)
        return msgspec.structs.replace(lease, expires_at=expires_at)

    async def release(self, lease: Lease) -> None:
        sql = "DELETE FROM {s}.leases WHERE name = %s AND token = %s"
        await self._db.count(sql, (lease.name, lease.token))

    async def get(self, name: str) -> Lease | None:
        sql = (
            "SELECT name, owner, token, acquired_at, expires_at FROM {s}.leases "
            "WHERE name = %s AND expires_at > %s"
        )
        row = await self._db.row(sql, (name, self._db.clock()))
        return None if row is None else Lease(*row)
