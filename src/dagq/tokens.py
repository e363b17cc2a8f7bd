"""Access tokens of ``dagq server``: roles, tenants, expiry, revocation.

A token is ``dagq_<id>_<secret>``: ``id`` (12 hex digits) names its record, the
secret is 32 random bytes (``secrets.token_urlsafe``). The store keeps only the
record (``access/tokens/<id>``, a document): role, tenant, expiry, who made it, and
the SHA-256 of the whole token — never the token. A hash without a salt or stretching
is enough because the secret is random, not chosen by a person: 256 bits cannot be
guessed from its digest. Checking compares digests in constant time.

Roles nest: ``viewer`` reads, ``operator`` also submits, cancels, retries and
signals, ``admin`` also manages dead letters, purges and tokens. A token with a
tenant sees and acts on only that tenant's workflows; one without sees every tenant.
Revoking keeps the record (marked revoked) so ``dagq token list`` still tells who
had access until when.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from collections.abc import Callable
from typing import Literal, get_args

import msgspec

from dagq import keys
from dagq.errors import ConflictError, DagqError, DamagedData, UsageError
from dagq.stores.base import Store

Role = Literal["viewer", "operator", "admin"]
ROLES: tuple[Role, ...] = get_args(Role)
_RANK: dict[str, int] = {role: rank for rank, role in enumerate(ROLES)}
PREFIX = "dagq_"
_ID_HEX = 12
_TENANT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_NAME_CHARS = 100
_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)(w|d|h|m|s))")
_UNIT_S = {"w": 7 * 86400.0, "d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
Clock = Callable[[], float]


class TokenRejected(DagqError):
    """A token that does not grant access: unknown, malformed, expired or revoked."""


class TokenRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What the store keeps of a token (its digest, never the token)."""

    id: str
    name: str
    role: Role
    tenant: str = ""
    created_at: float
    created_by: str = ""
    expires_at: float | None = None
    revoked_at: float | None = None
    digest: str

    def status(self, now: float) -> str:
        """``active``, ``expired`` or ``revoked``."""
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and now >= self.expires_at:
            return "expired"
        return "active"

    def actor(self) -> str:
        """Who acts with this token, as the audit trail names it."""
        return f"token:{self.name}" if self.name == self.id else f"token:{self.name}:{self.id}"


class TokenInfo(msgspec.Struct, frozen=True, kw_only=True):
    """A token as ``dagq token list`` shows it: everything but its digest."""

    id: str
    name: str
    role: Role
    tenant: str
    status: str
    created_at: float
    created_by: str
    expires_at: float | None
    revoked_at: float | None


class NewToken(msgspec.Struct, frozen=True, kw_only=True):
    """A token just created: the only time its secret is known."""

    token: str
    info: TokenInfo


_decoder = msgspec.json.Decoder(TokenRecord)


def role_includes(role: str, wanted: str) -> bool:
    """Whether ``role`` may do what ``wanted`` may (roles nest)."""
    return _RANK[role] >= _RANK[wanted]


def check_role(text: str) -> Role:
    """``text`` as a role; UsageError naming the choices otherwise."""
    for role in ROLES:
        if text == role:
            return role
    raise UsageError(f"role {text!r} is not one of {', '.join(ROLES)}")


def check_tenant(text: str) -> str:
    """A tenant name: 1-64 letters, digits, '.', '_' or '-' (not first); "" for none."""
    if text and not _TENANT.fullmatch(text):
        raise UsageError(
            f"tenant {text[:70]!r} is not valid: use 1-64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return text


def parse_duration(text: str) -> float:
    """Seconds in a duration such as ``90d``, ``12h``, ``30m``, ``45s``, ``2w`` or
    ``1d12h``; UsageError naming it otherwise."""
    compact = text.strip().lower()
    parts = _DURATION.findall(compact)
    if not compact or "".join(n + u for n, u in parts) != compact:
        raise UsageError(
            f"duration {text[:40]!r} is not valid: use a number and a unit (w, d, h, m, s), "
            "e.g. 90d, 12h, 30m or 1d12h"
        )
    seconds = sum(float(n) * _UNIT_S[u] for n, u in parts)
    if seconds <= 0:
        raise UsageError(f"duration {text[:40]!r} is not positive")
    return seconds


def digest(token: str) -> str:
    """The SHA-256 of a token, as its record keeps it."""
    return hashlib.sha256(token.encode()).hexdigest()


def info(record: TokenRecord, now: float) -> TokenInfo:
    """The listing of a record: its fields but the digest, and its status now."""
    return TokenInfo(
        id=record.id,
        name=record.name,
        role=record.role,
        tenant=record.tenant,
        status=record.status(now),
        created_at=record.created_at,
        created_by=record.created_by,
        expires_at=record.expires_at,
        revoked_at=record.revoked_at,
    )


async def create_token(
    store: Store,
    *,
    role: str,
    tenant: str = "",
    expires_in_s: float | None = None,
    name: str = "",
    created_by: str = "",
    clock: Clock = time.time,
) -> NewToken:
    """Make a token and store its record; the result holds the token itself, which
    is never stored and cannot be shown again."""
    checked = check_role(role)
    tenant = check_tenant(tenant)
    if len(name) > _NAME_CHARS or not name.isprintable():
        raise UsageError(f"token name {name[:40]!r} is not valid: at most 100 printable characters")
    if expires_in_s is not None and expires_in_s <= 0:
        raise UsageError("a token's expiry must be in the future")
    now = clock()
    while True:
        token_id = secrets.token_hex(_ID_HEX // 2)
        token = f"{PREFIX}{token_id}_{secrets.token_urlsafe(32)}"
        record = TokenRecord(
            id=token_id,
            name=name or token_id,
            role=checked,
            tenant=tenant,
            created_at=now,
            created_by=created_by,
            expires_at=None if expires_in_s is None else now + expires_in_s,
            digest=digest(token),
        )
        try:
            await store.documents.put(
                keys.token(token_id), msgspec.json.encode(record), if_none_match=True
            )
        except ConflictError:
            continue  # 48 random bits met an existing id: draw again
        return NewToken(token=token, info=info(record, now))


async def list_tokens(store: Store, *, clock: Clock = time.time) -> list[TokenInfo]:
    """Every token's record, oldest first (revoked and expired ones included)."""
    found: list[TokenRecord] = []
    start: str | None = None
    while names := await store.documents.list(keys.TOKENS_PREFIX, start_after=start, limit=1000):
        for name in names:
            record = await _read(store, name[len(keys.TOKENS_PREFIX) :])
            if record is not None:
                found.append(record[0])
        start = names[-1]
    now = clock()
    return [info(r, now) for r in sorted(found, key=lambda r: (r.created_at, r.id))]


async def get_token(store: Store, token_id: str, *, clock: Clock = time.time) -> TokenInfo | None:
    """One token's record (None if there is no such id)."""
    found = await _read(store, token_id)
    return None if found is None else info(found[0], clock())


async def revoke_token(store: Store, token_id: str, *, clock: Clock = time.time) -> TokenInfo:
    """Mark a token revoked (a second revoke changes nothing); UsageError if unknown."""
    while True:
        found = await _read(store, token_id)
        if found is None:
            raise UsageError(f"no token with id {token_id[:40]!r} (see 'dagq token list')")
        record, etag = found
        now = clock()
        if record.revoked_at is not None:
            return info(record, now)
        revoked = msgspec.structs.replace(record, revoked_at=now)
        try:
            await store.documents.put(
                keys.token(token_id), msgspec.json.encode(revoked), if_match=etag
            )
        except ConflictError:
            continue  # changed meanwhile (revoked by another): read again
        return info(revoked, now)


async def verify(store: Store, token: str, *, clock: Clock = time.time) -> TokenRecord:
    """The record of a token that grants access now; TokenRejected saying why not."""
    record = await lookup(store, token)
    check_usable(record, clock())
    return record


async def lookup(store: Store, token: str) -> TokenRecord:
    """The record a token belongs to, whatever its status; TokenRejected if none."""
    token_id = _id_of(token)
    found = await _read(store, token_id) if token_id is not None else None
    if found is None or not hmac.compare_digest(found[0].digest, digest(token)):
        raise TokenRejected("the token is not valid")
    return found[0]


def check_usable(record: TokenRecord, now: float) -> None:
    """TokenRejected when ``record`` is revoked or expired at ``now``."""
    status = record.status(now)
    if status != "active":
        raise TokenRejected(f"the token {record.id} is {status}")


def _id_of(token: str) -> str | None:
    if not token.startswith(PREFIX):
        return None
    token_id, _, secret = token[len(PREFIX) :].partition("_")
    if len(token_id) != _ID_HEX or not secret or not all(c in "0123456789abcdef" for c in token_id):
        return None
    return token_id


async def _read(store: Store, token_id: str) -> tuple[TokenRecord, str] | None:
    if not token_id or "/" in token_id:
        return None
    doc = await store.documents.get(keys.token(token_id))
    if doc is None:
        return None
    try:
        return _decoder.decode(doc.data), doc.etag
    except msgspec.DecodeError as exc:
        raise DamagedData(f"the token record {keys.token(token_id)} is damaged: {exc}") from None
