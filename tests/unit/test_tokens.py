"""Access tokens on the memory store: made, checked, listed, revoked, expired; and the
server's cache of them (:class:`dagq.server.access.Access`)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import pytest

from dagq import keys
from dagq.errors import DamagedData, UsageError
from dagq.server.access import Access
from dagq.server.problems import ProblemError
from dagq.stores import open_store
from dagq.stores.base import Store
from dagq.tokens import (
    TokenRejected,
    create_token,
    digest,
    list_tokens,
    parse_duration,
    revoke_token,
    role_includes,
    verify,
)

pytestmark = pytest.mark.timeout(10)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def store() -> AsyncIterator[Store]:
    opened = open_store("memory://")
    yield opened
    await opened.close()


async def test_a_new_token_grants_its_role_and_tenant(store: Store) -> None:
    made = await create_token(store, role="operator", tenant="acme", name="ci")
    record = await verify(store, made.token)
    assert (record.id, record.name, record.role, record.tenant) == (
        made.info.id,
        "ci",
        "operator",
        "acme",
    )
    assert made.token.startswith(f"dagq_{made.info.id}_")


async def test_the_store_keeps_a_hash_never_the_token(store: Store) -> None:
    made = await create_token(store, role="viewer")
    doc = await store.documents.get(keys.token(made.info.id))
    assert doc is not None
    # The secret is what follows "dagq_<id>_" (token_urlsafe: it may hold "_" itself, and
    # its last piece alone, a letter or two, could be anywhere in the record).
    secret = made.token.removeprefix(f"dagq_{made.info.id}_")
    assert len(secret) >= 40
    assert made.token.encode() not in doc.data and secret.encode() not in doc.data
    assert digest(made.token).encode() in doc.data


async def test_every_token_is_different(store: Store) -> None:
    made = [await create_token(store, role="viewer") for _ in range(20)]
    assert len({m.token for m in made}) == len({m.info.id for m in made}) == 20


@pytest.mark.parametrize(
    "forged",
    [
        "",
        "not-a-token",
        "dagq_",
        "dagq_0123456789ab",
        "dagq_0123456789ab_x",
        "dagq_../../states_x",
        "Bearer dagq_0123456789ab_x",
    ],
)
async def test_a_token_never_made_is_rejected(store: Store, forged: str) -> None:
    await create_token(store, role="admin")
    with pytest.raises(TokenRejected, match="not valid"):
        await verify(store, forged)


async def test_the_right_id_with_a_wrong_secret_is_rejected(store: Store) -> None:
    made = await create_token(store, role="admin")
    forged = made.token[:-4] + ("AAAA" if not made.token.endswith("AAAA") else "BBBB")
    with pytest.raises(TokenRejected, match="not valid"):
        await verify(store, forged)


async def test_an_expired_token_is_rejected_and_listed_as_expired(store: Store) -> None:
    clock = Clock()
    made = await create_token(store, role="viewer", expires_in_s=60, clock=clock)
    clock.now += 59
    await verify(store, made.token, clock=clock)
    clock.now += 1
    with pytest.raises(TokenRejected, match="expired"):
        await verify(store, made.token, clock=clock)
    [listed] = await list_tokens(store, clock=clock)
    assert listed.status == "expired"


async def test_a_revoked_token_is_rejected_and_its_record_kept(store: Store) -> None:
    clock = Clock()
    made = await create_token(store, role="admin", name="old", clock=clock)
    revoked = await revoke_token(store, made.info.id, clock=clock)
    assert (revoked.status, revoked.revoked_at) == ("revoked", clock.now)
    with pytest.raises(TokenRejected, match="revoked"):
        await verify(store, made.token, clock=clock)
    assert [t.status for t in await list_tokens(store)] == ["revoked"]
    again = await revoke_token(store, made.info.id, clock=clock)
    assert again == revoked


async def test_revoking_an_unknown_id_names_it(store: Store) -> None:
    with pytest.raises(UsageError, match="no token with id 'nope'"):
        await revoke_token(store, "nope")


async def test_a_listing_never_holds_a_secret_or_a_digest(store: Store) -> None:
    made = await create_token(store, role="viewer", name="a")
    await create_token(store, role="admin", name="b")
    listed = await list_tokens(store)
    assert [t.name for t in listed] == ["a", "b"]
    for info in listed:
        assert not hasattr(info, "digest")
        assert made.token not in repr(info)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"role": "root"}, "role 'root' is not one of viewer, operator, admin"),
        ({"role": "viewer", "tenant": "a b"}, "tenant 'a b' is not valid"),
        ({"role": "viewer", "tenant": "-x"}, "tenant '-x' is not valid"),
        ({"role": "viewer", "name": "x\n"}, "token name 'x\\n' is not valid"),
        ({"role": "viewer", "expires_in_s": 0}, "expiry must be in the future"),
    ],
)
async def test_bad_input_is_refused_naming_it(
    store: Store, kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(UsageError, match=re.escape(message)):
        await create_token(store, **kwargs)  # type: ignore[arg-type]
    assert await list_tokens(store) == []


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("45s", 45), ("30m", 1800), ("12h", 43200), ("90d", 90 * 86400), ("1d12h", 129600)],
)
def test_durations_read_as_people_write_them(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "12", "h", "3x", "1d 2h", "-5m", "0s"])
def test_a_bad_duration_is_refused_naming_it(text: str) -> None:
    with pytest.raises(UsageError, match="duration"):
        parse_duration(text)


def test_roles_nest() -> None:
    assert role_includes("admin", "operator") and role_includes("operator", "viewer")
    assert not role_includes("viewer", "operator") and not role_includes("operator", "admin")


async def test_a_damaged_record_is_reported_not_trusted(store: Store) -> None:
    made = await create_token(store, role="admin")
    await store.documents.put(keys.token(made.info.id), b"{garbage")
    with pytest.raises(DamagedData, match=made.info.id):
        await verify(store, made.token)


# --- the server's cache --------------------------------------------------------------


async def test_a_revocation_takes_effect_once_the_cache_expires(store: Store) -> None:
    ticks = Clock()
    access = Access(store, required=True, cache_s=5.0, clock=ticks)
    made = await create_token(store, role="operator", tenant="t1")
    who = await access.caller(f"Bearer {made.token}")
    assert (who.role, who.tenant, who.name) == ("operator", "t1", f"token:{made.info.id}")
    await revoke_token(store, made.info.id)
    ticks.now += 4.9
    assert await access.caller(f"Bearer {made.token}") == who  # still cached
    ticks.now += 0.1
    with pytest.raises(ProblemError) as refused:
        await access.caller(f"Bearer {made.token}")
    assert refused.value.kind == "unauthorized"
    assert refused.value.headers["WWW-Authenticate"].startswith('Bearer realm="dagq"')


async def test_expiry_is_checked_on_every_request_even_when_cached(store: Store) -> None:
    wall = Clock()
    access = Access(store, required=True, cache_s=3600.0, wall=wall)
    made = await create_token(store, role="viewer", expires_in_s=10, clock=wall)
    await access.caller(f"Bearer {made.token}")
    wall.now += 10
    with pytest.raises(ProblemError, match="expired"):
        await access.caller(f"Bearer {made.token}")


async def test_without_a_header_only_a_server_that_does_not_require_tokens_answers(
    store: Store,
) -> None:
    anonymous = await Access(store, required=False).caller(None)
    assert (anonymous.role, anonymous.tenant) == ("admin", "")
    with pytest.raises(ProblemError, match="requires a token"):
        await Access(store, required=True).caller(None)


@pytest.mark.parametrize("header", ["Basic abc", "Bearer", "Bearer   ", "token"])
async def test_a_header_that_is_not_bearer_is_refused(store: Store, header: str) -> None:
    with pytest.raises(ProblemError, match="not 'Bearer <token>'"):
        await Access(store, required=False).caller(header)
