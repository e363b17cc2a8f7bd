"""Who is calling: the one place the server decides that.

Every route depends on :func:`caller`. Until tokens exist the server only binds a
loopback address (see :mod:`dagq.server.runner`), and every caller is the anonymous
admin of the default tenant; roles and tenants will be read from a bearer token here,
and checked by :func:`require`, without touching the routes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Role = Literal["viewer", "operator", "admin"]
_RANK: dict[Role, int] = {"viewer": 0, "operator": 1, "admin": 2}


@dataclass(frozen=True, slots=True)
class Caller:
    """The identity a request acts as: a name (for the audit trail), a role, a tenant."""

    name: str
    role: Role
    #: The tenant whose workflows the caller sees; "" is the default tenant.
    tenant: str = ""

    def may(self, role: Role) -> bool:
        """Whether the caller's role includes ``role``."""
        return _RANK[self.role] >= _RANK[role]


ANONYMOUS_ADMIN = Caller(name="anonymous", role="admin")


async def caller() -> Caller:
    """The caller of the current request (a FastAPI dependency)."""
    return ANONYMOUS_ADMIN
