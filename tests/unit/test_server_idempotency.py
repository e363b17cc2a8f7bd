"""Idempotency-Key records in the store: claim, replay, refuse, take over, expire."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from starlette.responses import Response

from dagq.server.idempotency import IN_FLIGHT_S, KEEP_S, Keys, Record, document_key, parse_key
from dagq.server.problems import ProblemError
from dagq.stores import open_store
from dagq.stores.base import Store

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


async def test_a_finished_request_is_replayed_for_the_same_fingerprint(store: Store) -> None:
    keys = Keys(store, clock=Clock())
    claim = await keys.begin("k", "print-a")
    assert isinstance(claim, str)
    await keys.finish("k", claim, "print-a", Response(b'{"id":"x"}', status_code=202))
    again = await keys.begin("k", "print-a")
    assert isinstance(again, Record)
    assert (again.status, again.body) == (202, b'{"id":"x"}')


async def test_another_fingerprint_with_the_same_key_is_422(store: Store) -> None:
    keys = Keys(store, clock=Clock())
    claim = await keys.begin("k", "print-a")
    assert isinstance(claim, str)
    await keys.finish("k", claim, "print-a", Response(b"", status_code=202))
    with pytest.raises(ProblemError) as refused:
        await keys.begin("k", "print-b")
    assert refused.value.kind == "idempotency-key-reused"


async def test_a_key_in_flight_is_409_until_it_is_stale(store: Store) -> None:
    clock = Clock()
    keys = Keys(store, clock=clock)
    assert isinstance(await keys.begin("k", "print-a"), str)
    with pytest.raises(ProblemError) as refused:
        await keys.begin("k", "print-a")
    assert refused.value.kind == "idempotency-key-in-use"
    assert refused.value.headers["Retry-After"] == "1"
    clock.now += IN_FLIGHT_S + 1  # its server died mid-request: the key is taken over
    assert isinstance(await keys.begin("k", "print-a"), str)


async def test_a_finished_key_may_be_used_afresh_after_it_expires(store: Store) -> None:
    clock = Clock()
    keys = Keys(store, clock=clock)
    claim = await keys.begin("k", "print-a")
    assert isinstance(claim, str)
    await keys.finish("k", claim, "print-a", Response(b"", status_code=202))
    clock.now += KEEP_S + 1
    assert isinstance(await keys.begin("k", "print-b"), str)


async def test_an_abandoned_claim_lets_the_request_run_again(store: Store) -> None:
    keys = Keys(store, clock=Clock())
    claim = await keys.begin("k", "print-a")
    assert isinstance(claim, str)
    await keys.abandon("k", claim)
    assert isinstance(await keys.begin("k", "print-a"), str)


def test_keys_are_read_as_structured_strings_or_bare_tokens() -> None:
    assert parse_key('"8e03978e-40d5"') == "8e03978e-40d5"
    assert parse_key("8e03978e-40d5") == "8e03978e-40d5"
    for bad in ("", '""', "x" * 256, "caf\u00e9"):
        with pytest.raises(ProblemError):
            parse_key(bad)


def test_the_same_key_of_two_tenants_is_two_records() -> None:
    assert document_key("a", "k") != document_key("b", "k")


async def test_a_sweep_deletes_only_the_records_past_their_time(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("dagq.server.idempotency._SWEEP_PAGE", 2)  # several pages
    clock = Clock()
    keys = Keys(store, clock=clock)
    old = [document_key("", f"old-{i}") for i in range(3)]
    for doc in old:
        claim = await keys.begin(doc, "print")
        assert isinstance(claim, str)
        await keys.finish(doc, claim, "print", Response(b"", status_code=202))
    stuck = document_key("", "stuck")  # in flight, its server long gone
    assert isinstance(await keys.begin(stuck, "print"), str)
    damaged = document_key("", "damaged")
    await store.documents.put(damaged, b"{not json")
    await store.documents.put("unrelated", b"kept")
    clock.now += KEEP_S + 1
    fresh = document_key("", "fresh")
    claim = await keys.begin(fresh, "print")
    assert isinstance(claim, str)
    await keys.finish(fresh, claim, "print", Response(b"", status_code=202))
    in_flight = document_key("", "in-flight")
    assert isinstance(await keys.begin(in_flight, "print"), str)

    assert await keys.forget_expired() == 5

    left = await store.documents.list("")
    assert sorted(left) == sorted([fresh, in_flight, "unrelated"])
    again = await keys.begin(fresh, "print")
    assert isinstance(again, Record)  # the fresh response is still replayed
