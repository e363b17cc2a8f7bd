"""The storage contract of ``dagq.stores.base``, run against every backend.

Time is the ``clock`` fixture wherever visibility timeouts, delays or leases matter:
a fake clock for memory and sqlite, the wall clock for azure (whose emulator keeps
real time: there ``advance`` waits, so durations are short, in whole seconds, and
leave half a second of margin, and times compare within ``clock.tolerance``).
Lease TTLs stay within Azure's 15-60 s. ``Queues.wait`` is measured in real time.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Protocol

import pytest

from dagq.errors import (
    ConflictError,
    LeaseHeld,
    LeaseLost,
    MessageLost,
    MessageTooLarge,
    ValidationError,
)
from dagq.stores.base import (
    MAX_MESSAGE_BYTES,
    Document,
    IndexRow,
    Message,
    OutgoingMessage,
    QueueDepth,
    Store,
    get_many,
)


class FakeClock(Protocol):
    tolerance: float

    @property
    def now(self) -> float: ...

    def advance(self, seconds: float) -> None: ...


#: Past a visibility timeout of 1 s, with margin for a real clock.
PAST_ONE_SECOND = 1.5
#: The shortest lease Azure grants; expiry tests wait just past it.
SHORT_TTL = 15


def during(before: float, after: float, clock: FakeClock) -> object:
    """A time taken between the clock readings ``before`` and ``after`` (the two ends of
    a store call): equal to them on a fake clock; on a real one, within the clock's
    tolerance of that stretch (a call to Azurite under load can take over a second)."""
    return pytest.approx((before + after) / 2, abs=(after - before) / 2 + clock.tolerance)


def require_dedup(store: Store) -> None:
    """Skip a test of deduplication by id on a backend whose queues cannot do it."""
    if not store.queues.deduplicates:
        pytest.skip("this backend's queues do not deduplicate by id (Azure Queue Storage)")


def out(body: bytes, id: str | None = None, delay_s: float = 0.0) -> OutgoingMessage:
    return OutgoingMessage(body=body, id=id, delay_s=delay_s)


async def receive_one(store: Store, queue: str = "q", visibility: float = 30.0) -> Message:
    [message] = await store.queues.receive(queue, max_messages=1, visibility_timeout_s=visibility)
    return message


# --- documents ----------------------------------------------------------------------


async def test_get_of_a_missing_document_is_none(store: Store) -> None:
    assert await store.documents.get("nope") is None


async def test_put_then_get_returns_the_data_and_the_etag(store: Store) -> None:
    etag = await store.documents.put("a", b"one")
    document = await store.documents.get("a")
    assert document is not None
    assert (document.data, document.etag) == (b"one", etag)


async def test_empty_documents_round_trip(store: Store) -> None:
    await store.documents.put("empty", b"")
    document = await store.documents.get("empty")
    assert document is not None and document.data == b""


async def test_get_many_answers_as_gets_do_in_the_order_asked(store: Store) -> None:
    first = await store.documents.put("m/1", b"one")
    second = await store.documents.put("m/2", b"")
    found = await get_many(store.documents, ["m/2", "nope", "m/1", "m/2"])
    assert found == [Document(b"", second), None, Document(b"one", first), Document(b"", second)]
    assert await get_many(store.documents, []) == []


async def test_every_put_returns_a_new_etag(store: Store) -> None:
    first = await store.documents.put("a", b"same")
    second = await store.documents.put("a", b"same")
    assert first != second


async def test_put_if_match_with_the_current_etag_replaces(store: Store) -> None:
    etag = await store.documents.put("a", b"one")
    new_etag = await store.documents.put("a", b"two", if_match=etag)
    document = await store.documents.get("a")
    assert document is not None
    assert (document.data, document.etag) == (b"two", new_etag)


async def test_put_if_match_with_a_stale_etag_conflicts_and_keeps_the_document(
    store: Store,
) -> None:
    stale = await store.documents.put("a", b"one")
    await store.documents.put("a", b"two")
    with pytest.raises(ConflictError, match="'a'"):
        await store.documents.put("a", b"three", if_match=stale)
    document = await store.documents.get("a")
    assert document is not None and document.data == b"two"


async def test_put_if_match_on_a_missing_document_conflicts(store: Store) -> None:
    with pytest.raises(ConflictError):
        await store.documents.put("a", b"one", if_match="0123456789abcdef")
    assert await store.documents.get("a") is None


async def test_put_if_match_after_delete_and_recreate_conflicts(store: Store) -> None:
    etag = await store.documents.put("a", b"one")
    await store.documents.delete("a")
    await store.documents.put("a", b"one")
    with pytest.raises(ConflictError):
        await store.documents.put("a", b"two", if_match=etag)


async def test_put_if_none_match_creates_a_missing_document(store: Store) -> None:
    etag = await store.documents.put("a", b"one", if_none_match=True)
    document = await store.documents.get("a")
    assert document is not None and document.etag == etag


async def test_put_if_none_match_on_an_existing_document_conflicts(store: Store) -> None:
    await store.documents.put("a", b"one")
    with pytest.raises(ConflictError, match="exists"):
        await store.documents.put("a", b"two", if_none_match=True)
    document = await store.documents.get("a")
    assert document is not None and document.data == b"one"


async def test_put_with_both_conditions_is_rejected(store: Store) -> None:
    with pytest.raises(ValidationError):
        await store.documents.put("a", b"one", if_match="x", if_none_match=True)


async def test_delete_removes_and_says_so(store: Store) -> None:
    await store.documents.put("a", b"one")
    assert await store.documents.delete("a") is True
    assert await store.documents.get("a") is None
    assert await store.documents.delete("a") is False


async def test_delete_if_match_with_the_current_etag_removes(store: Store) -> None:
    etag = await store.documents.put("a", b"one")
    assert await store.documents.delete("a", if_match=etag) is True
    assert await store.documents.get("a") is None


async def test_delete_if_match_with_a_stale_etag_conflicts_and_keeps_it(store: Store) -> None:
    stale = await store.documents.put("a", b"one")
    await store.documents.put("a", b"two")
    with pytest.raises(ConflictError):
        await store.documents.delete("a", if_match=stale)
    assert await store.documents.get("a") is not None


async def test_delete_if_match_of_a_missing_document_returns_false(store: Store) -> None:
    assert await store.documents.delete("a", if_match="0123456789abcdef") is False


async def test_list_returns_the_keys_with_the_prefix_sorted(store: Store) -> None:
    for key in ["wf/2/state", "wf/1/state", "wf/1/def", "wg/1", "w", "other"]:
        await store.documents.put(key, b"")
    assert await store.documents.list("wf/") == ["wf/1/def", "wf/1/state", "wf/2/state"]
    assert await store.documents.list("wf/1/") == ["wf/1/def", "wf/1/state"]
    assert await store.documents.list("none/") == []


async def test_list_with_an_empty_prefix_returns_every_key(store: Store) -> None:
    for key in ["b", "a", "c/d"]:
        await store.documents.put(key, b"")
    assert await store.documents.list("") == ["a", "b", "c/d"]


async def test_list_pages_with_start_after_and_limit(store: Store) -> None:
    keys = [f"k/{i:02d}" for i in range(7)]
    for key in reversed(keys):
        await store.documents.put(key, b"")
    await store.documents.put("l/00", b"")
    pages: list[list[str]] = []
    after: str | None = None
    while page := await store.documents.list("k/", start_after=after, limit=3):
        pages.append(page)
        after = page[-1]
    assert pages == [keys[0:3], keys[3:6], keys[6:7]]


async def test_list_start_after_before_the_prefix_starts_at_the_prefix(store: Store) -> None:
    for key in ["a", "b/1", "b/2"]:
        await store.documents.put(key, b"")
    assert await store.documents.list("b/", start_after="a") == ["b/1", "b/2"]
    assert await store.documents.list("b/", start_after="b/1") == ["b/2"]
    assert await store.documents.list("b/", limit=0) == []


# --- queues: sending and receiving --------------------------------------------------


async def test_a_sent_message_is_received_with_its_fields(store: Store, clock: FakeClock) -> None:
    before = clock.now
    await store.queues.send("q", [out(b"hello", id="m1")])
    sent = clock.now
    message = await receive_one(store)
    assert (message.queue, message.id, message.body) == ("q", "m1", b"hello")
    assert message.dequeue_count == 1
    assert message.enqueued_at == during(before, sent, clock)
    assert message.receipt


async def test_receive_from_an_empty_queue_returns_nothing(store: Store) -> None:
    assert await store.queues.receive("q", max_messages=10, visibility_timeout_s=30) == []


async def test_receive_takes_at_most_max_messages_oldest_first(store: Store) -> None:
    for i in range(5):  # one send each: the order within one send is not portable
        await store.queues.send("q", [out(f"{i}".encode())])
    first = await store.queues.receive("q", max_messages=3, visibility_timeout_s=30)
    rest = await store.queues.receive("q", max_messages=10, visibility_timeout_s=30)
    assert [m.body for m in first] == [b"0", b"1", b"2"]
    assert [m.body for m in rest] == [b"3", b"4"]


async def test_messages_without_an_id_get_distinct_ids(store: Store) -> None:
    await store.queues.send("q", [out(b"a"), out(b"a")])
    messages = await store.queues.receive("q", max_messages=10, visibility_timeout_s=30)
    assert len({m.id for m in messages}) == 2


async def test_queues_are_independent(store: Store) -> None:
    await store.queues.send("a", [out(b"for a")])
    assert await store.queues.receive("b", max_messages=10, visibility_timeout_s=30) == []
    assert (await receive_one(store, "a")).body == b"for a"


async def test_receive_rejects_a_non_positive_max_messages(store: Store) -> None:
    with pytest.raises(ValidationError):
        await store.queues.receive("q", max_messages=0, visibility_timeout_s=30)


async def test_a_received_message_stays_hidden_for_the_visibility_timeout(
    store: Store, clock: FakeClock
) -> None:
    await store.queues.send("q", [out(b"x")])
    await receive_one(store, visibility=2)
    clock.advance(1)
    assert await store.queues.receive("q", max_messages=10, visibility_timeout_s=30) == []


async def test_an_expired_message_is_redelivered_with_a_new_receipt(
    store: Store, clock: FakeClock
) -> None:
    await store.queues.send("q", [out(b"x", id="m")])
    first = await receive_one(store, visibility=1)
    clock.advance(PAST_ONE_SECOND)
    second = await receive_one(store, visibility=30)
    assert (second.id, second.dequeue_count) == ("m", 2)
    assert second.receipt != first.receipt
    assert second.enqueued_at == first.enqueued_at


async def test_delete_removes_received_messages_and_counts_them(
    store: Store, clock: FakeClock
) -> None:
    for body in (b"a", b"b", b"c"):
        await store.queues.send("q", [out(body)])
    messages = await store.queues.receive("q", max_messages=2, visibility_timeout_s=1)
    assert await store.queues.delete("q", [m.receipt for m in messages]) == 2
    clock.advance(PAST_ONE_SECOND)
    remaining = await store.queues.receive("q", max_messages=10, visibility_timeout_s=30)
    assert [m.body for m in remaining] == [b"c"]


async def test_delete_with_a_stale_receipt_is_a_no_op(store: Store, clock: FakeClock) -> None:
    await store.queues.send("q", [out(b"x")])
    first = await receive_one(store, visibility=1)
    clock.advance(PAST_ONE_SECOND)
    second = await receive_one(store, visibility=30)
    assert await store.queues.delete("q", [first.receipt, "unknown-receipt"]) == 0
    assert await store.queues.delete("q", [second.receipt]) == 1


async def test_delete_needs_the_right_queue(store: Store) -> None:
    await store.queues.send("q", [out(b"x")])
    message = await receive_one(store)
    assert await store.queues.delete("other", [message.receipt]) == 0
    assert await store.queues.delete("q", [message.receipt]) == 1


async def test_extend_keeps_a_message_hidden_longer(store: Store, clock: FakeClock) -> None:
    await store.queues.send("q", [out(b"x")])
    message = await receive_one(store, visibility=1)
    new_receipt = await store.queues.extend("q", message.receipt, 4)
    assert new_receipt != message.receipt
    clock.advance(PAST_ONE_SECOND)  # past the first timeout, within the extension
    assert await store.queues.receive("q", max_messages=1, visibility_timeout_s=30) == []
    assert await store.queues.delete("q", [new_receipt]) == 1


async def test_extend_makes_the_old_receipt_stale(store: Store) -> None:
    await store.queues.send("q", [out(b"x")])
    message = await receive_one(store)
    await store.queues.extend("q", message.receipt, 60)
    assert await store.queues.delete("q", [message.receipt]) == 0
    with pytest.raises(MessageLost):
        await store.queues.extend("q", message.receipt, 60)


async def test_extend_after_delete_raises_message_lost(store: Store) -> None:
    await store.queues.send("q", [out(b"x")])
    message = await receive_one(store)
    await store.queues.delete("q", [message.receipt])
    with pytest.raises(MessageLost):
        await store.queues.extend("q", message.receipt, 60)


async def test_extend_after_redelivery_raises_message_lost(store: Store, clock: FakeClock) -> None:
    await store.queues.send("q", [out(b"x")])
    message = await receive_one(store, visibility=1)
    clock.advance(PAST_ONE_SECOND)
    await receive_one(store)
    with pytest.raises(MessageLost):
        await store.queues.extend("q", message.receipt, 60)


async def test_a_message_id_still_queued_is_not_added_again(store: Store) -> None:
    require_dedup(store)
    await store.queues.send("q", [out(b"first", id="m"), out(b"second", id="m")])
    await store.queues.send("q", [out(b"third", id="m")])
    messages = await store.queues.receive("q", max_messages=10, visibility_timeout_s=30)
    assert [(m.id, m.body) for m in messages] == [("m", b"first")]


async def test_a_message_id_in_flight_is_not_added_again(store: Store, clock: FakeClock) -> None:
    require_dedup(store)
    await store.queues.send("q", [out(b"first", id="m")])
    await receive_one(store, visibility=1)
    await store.queues.send("q", [out(b"again", id="m")])
    clock.advance(PAST_ONE_SECOND)
    messages = await store.queues.receive("q", max_messages=10, visibility_timeout_s=30)
    assert [(m.body, m.dequeue_count) for m in messages] == [(b"first", 2)]


async def test_a_message_id_can_be_sent_again_after_delete(store: Store) -> None:
    await store.queues.send("q", [out(b"first", id="m")])
    await store.queues.delete("q", [(await receive_one(store)).receipt])
    await store.queues.send("q", [out(b"second", id="m")])
    message = await receive_one(store)
    assert (message.body, message.dequeue_count) == (b"second", 1)


async def test_the_same_id_in_two_queues_is_two_messages(store: Store) -> None:
    await store.queues.send("a", [out(b"x", id="m")])
    await store.queues.send("b", [out(b"x", id="m")])
    assert (await receive_one(store, "a")).id == "m"
    assert (await receive_one(store, "b")).id == "m"


async def test_a_delayed_message_becomes_visible_after_its_delay(
    store: Store, clock: FakeClock
) -> None:
    await store.queues.send("q", [out(b"later", delay_s=2), out(b"now")])
    assert [
        m.body for m in await store.queues.receive("q", max_messages=10, visibility_timeout_s=30)
    ] == [b"now"]
    clock.advance(1)
    assert await store.queues.receive("q", max_messages=10, visibility_timeout_s=30) == []
    clock.advance(PAST_ONE_SECOND)
    assert (await receive_one(store)).body == b"later"


async def test_extend_rejects_a_negative_visibility_timeout(store: Store) -> None:
    await store.queues.send("q", [out(b"x")])
    message = await receive_one(store)
    with pytest.raises(ValidationError):
        await store.queues.extend("q", message.receipt, -1)


async def test_a_negative_delay_is_rejected(store: Store) -> None:
    with pytest.raises(ValidationError):
        await store.queues.send("q", [out(b"x", delay_s=-1)])


async def test_a_message_of_exactly_the_size_limit_is_accepted(store: Store) -> None:
    body = b"x" * MAX_MESSAGE_BYTES
    await store.queues.send("q", [out(body)])
    assert (await receive_one(store)).body == body


async def test_an_oversized_message_rejects_the_whole_batch(store: Store) -> None:
    with pytest.raises(MessageTooLarge, match=str(MAX_MESSAGE_BYTES)):
        await store.queues.send("q", [out(b"ok"), out(b"x" * (MAX_MESSAGE_BYTES + 1))])
    assert (await store.queues.depth("q")).visible == 0


# --- queues: dead letters, depth, wait ----------------------------------------------


async def test_a_message_past_max_deliveries_is_dead_lettered(
    store: Store, clock: FakeClock, max_deliveries: int
) -> None:
    await store.queues.send("q", [out(b"poison", id="p"), out(b"fine", id="f")])
    for attempt in range(1, max_deliveries + 1):
        messages = await store.queues.receive("q", max_messages=10, visibility_timeout_s=1)
        assert [m.dequeue_count for m in messages if m.id == "p"] == [attempt]
        await store.queues.delete("q", [m.receipt for m in messages if m.id == "f"])
        clock.advance(PAST_ONE_SECOND)
    before = clock.now
    assert await store.queues.receive("q", max_messages=10, visibility_timeout_s=10) == []
    buried = clock.now
    [dead] = await store.queues.dead_letters("q")
    assert (dead.queue, dead.id, dead.body) == ("q", "p", b"poison")
    assert dead.dequeue_count == max_deliveries
    assert f"{max_deliveries} times" in dead.reason
    assert dead.dead_at == during(before, buried, clock)
    assert (await store.queues.depth("q")).visible == 0


async def test_dead_letter_moves_a_received_message_with_the_reason(
    store: Store, clock: FakeClock
) -> None:
    await store.queues.send("q", [out(b"garbage", id="g")])
    message = await receive_one(store, visibility=1)
    await store.queues.dead_letter("q", message.receipt, "cannot parse")
    [dead] = await store.queues.dead_letters("q")
    assert (dead.id, dead.body, dead.dequeue_count, dead.reason) == (
        "g",
        b"garbage",
        1,
        "cannot parse",
    )
    clock.advance(PAST_ONE_SECOND)
    assert await store.queues.receive("q", max_messages=10, visibility_timeout_s=30) == []


async def test_dead_letters_of_every_queue_are_listed_oldest_first_and_removed_by_key(
    store: Store, clock: FakeClock
) -> None:
    for queue, body in [("a", b"first"), ("b", b"second"), ("a", b"third")]:
        await store.queues.send(queue, [out(body)])
        message = await receive_one(store, queue, visibility=30)
        await store.queues.dead_letter(queue, message.receipt, f"bad {body.decode()}")
        clock.advance(1)
    everything = await store.queues.dead_letters(None)
    assert [(d.queue, d.body) for d in everything] == [
        ("a", b"first"),
        ("b", b"second"),
        ("a", b"third"),
    ]
    assert len({d.key for d in everything}) == 3 and all(d.key for d in everything)
    assert [d.key for d in await store.queues.dead_letters("a")] == [
        everything[0].key,
        everything[2].key,
    ]
    bogus = ["", "nope", "../states/x", "9" * 40, everything[1].key + "x"]
    assert await store.queues.dead_letter_of(everything[1].key) == everything[1]
    assert [await store.queues.dead_letter_of(k) for k in bogus] == [None] * len(bogus)
    assert await store.queues.remove_dead_letters(bogus) == 0
    assert await store.queues.remove_dead_letters([everything[0].key, everything[0].key]) == 1
    assert [d.body for d in await store.queues.dead_letters(None)] == [b"second", b"third"]
    assert await store.queues.remove_dead_letters([everything[0].key]) == 0


async def test_a_dead_letter_key_is_never_given_to_another_dead_letter(
    store: Store, clock: FakeClock
) -> None:
    async def bury(body: bytes) -> str:
        await store.queues.send("q", [out(body)])
        message = await receive_one(store, visibility=30)
        await store.queues.dead_letter("q", message.receipt, "test")
        [dead] = [d for d in await store.queues.dead_letters("q") if d.body == body]
        return dead.key

    await bury(b"first")
    old = await bury(b"second")
    assert await store.queues.remove_dead_letters([old]) == 1
    clock.advance(1)
    new = await bury(b"third")
    assert new != old
    assert await store.queues.remove_dead_letters([old]) == 0  # a stale listing's key
    assert [d.body for d in await store.queues.dead_letters("q")] == [b"first", b"third"]


async def test_dead_letter_with_a_stale_receipt_is_a_no_op(store: Store, clock: FakeClock) -> None:
    await store.queues.send("q", [out(b"x")])
    stale = await receive_one(store, visibility=1)
    clock.advance(PAST_ONE_SECOND)
    current = await receive_one(store, visibility=10)
    await store.queues.dead_letter("q", stale.receipt, "too late")
    assert await store.queues.dead_letters("q") == []
    assert await store.queues.delete("q", [current.receipt]) == 1


async def test_dead_letters_are_listed_oldest_first_up_to_the_limit(
    store: Store, clock: FakeClock
) -> None:
    await store.queues.send("q", [out(b"", id=f"m{i}") for i in range(3)])
    received = await store.queues.receive("q", max_messages=3, visibility_timeout_s=30)
    for message in sorted(received, key=lambda m: m.id):
        await store.queues.dead_letter("q", message.receipt, f"reason {message.id}")
        clock.advance(0.01)
    assert [d.id for d in await store.queues.dead_letters("q")] == ["m0", "m1", "m2"]
    assert [d.id for d in await store.queues.dead_letters("q", limit=2)] == ["m0", "m1"]
    assert await store.queues.dead_letters("other") == []


async def test_depth_counts_visible_and_invisible_and_the_oldest_age(
    store: Store, clock: FakeClock
) -> None:
    assert await store.queues.depth("q") == QueueDepth(visible=0, invisible=0, oldest_age_s=0.0)
    before = clock.now
    await store.queues.send("q", [out(b"a")])
    await store.queues.send("q", [out(b"b")])
    sent = clock.now
    clock.advance(1)
    await store.queues.send("q", [out(b"c"), out(b"d", delay_s=60)])
    await receive_one(store)
    clock.advance(1)
    asked = clock.now
    depth = await store.queues.depth("q")
    assert (depth.visible, depth.invisible) == (2, 2)
    # 2 s on a fake clock; on a real one, the calls between take their time too.
    assert depth.oldest_age_s == during(asked - sent, clock.now - before, clock)


async def test_wait_wakes_as_soon_as_a_message_is_sent(store: Store) -> None:
    waiter = asyncio.create_task(store.queues.wait("q", 30))
    await asyncio.sleep(0.01)
    await store.queues.send("q", [out(b"x")])
    # Timed from the send's answer: a send to Azurite under load can itself take a second.
    sent = time.monotonic()
    await asyncio.wait_for(waiter, 5)
    assert time.monotonic() - sent < 1  # woken by the send, not at the end of its 30 s


async def test_wait_ignores_sends_to_other_queues(store: Store) -> None:
    # The first wait may end at once: a store that starts listening for the queue
    # then cannot tell what was sent before (a message may have arrived).
    await store.queues.wait("q", 0.01)
    # A long wait: only a wrong wake-up ends it early (a send to Azurite on a loaded
    # machine may take longer than a short one would have lasted).
    waiter = asyncio.create_task(store.queues.wait("q", 30))
    await asyncio.sleep(0.01)
    await store.queues.send("other", [out(b"x")])
    await asyncio.sleep(0.05)
    assert not waiter.done()
    waiter.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiter


async def test_wait_returns_after_the_timeout(store: Store) -> None:
    # A backend may end the first wait for a queue once it starts listening, so that its
    # caller looks again for what was sent before (postgres): "a message may have arrived".
    await asyncio.wait_for(store.queues.wait("q", 0.01), 5)
    started = time.monotonic()
    await asyncio.wait_for(store.queues.wait("q", 0.05), 5)
    assert time.monotonic() - started >= 0.04


# --- index --------------------------------------------------------------------------


def row(id: str, created_at: float, **fields: object) -> IndexRow:
    values: dict[str, object] = {"name": "etl", "status": "running", "updated_at": created_at}
    values.update(fields)
    return IndexRow(id=id, created_at=created_at, **values)  # type: ignore[arg-type]


async def test_an_upserted_row_is_returned_by_get(store: Store) -> None:
    original = row("w1", 100.0, tenant="acme", data={"tasks": 3, "tags": ["a"]})
    await store.index.upsert(original)
    assert await store.index.get("w1") == original


async def test_get_of_a_missing_row_is_none(store: Store) -> None:
    assert await store.index.get("nope") is None


async def test_upsert_replaces_the_row_with_the_same_id(store: Store) -> None:
    await store.index.upsert(row("w1", 100.0))
    await store.index.upsert(row("w1", 100.0, status="succeeded", updated_at=200.0))
    found = await store.index.get("w1")
    assert found is not None and (found.status, found.updated_at) == ("succeeded", 200.0)
    assert [r.id for r in (await store.index.query(status=["running"])).rows] == []


async def test_upsert_of_another_run_under_the_same_id_replaces_every_column(
    store: Store,
) -> None:
    await store.index.upsert(row("w1", 100.0, name="etl", tenant="x"))
    for batched in (False, True):  # alone, and in a batch (as the coordinator writes)
        created = 300.0 if batched else 200.0
        newer = row("w1", created, name="report", tenant="y", status="failed")
        if batched:
            batch = store.batch()
            batch.upsert(newer)
            await batch.commit()
        else:
            await store.index.upsert(newer)
        assert await store.index.get("w1") == newer

        async def ids(**filters: object) -> list[str]:
            return [r.id for r in (await store.index.query(**filters)).rows]  # type: ignore[arg-type]

        assert await ids(name="etl") == [] and await ids(tenant="x") == []
        assert await ids(name="report", tenant="y", status=["failed"]) == ["w1"]
        assert [r.created_at for r in (await store.index.query()).rows] == [created]


async def test_query_returns_the_newest_first(store: Store) -> None:
    for i, created_at in enumerate([300.0, 100.0, 200.0]):
        await store.index.upsert(row(f"w{i}", created_at))
    page = await store.index.query()
    assert [r.id for r in page.rows] == ["w0", "w2", "w1"]
    assert page.cursor is None


async def test_query_filters_by_status_name_and_tenant(store: Store) -> None:
    rows = [
        row("a", 1.0, status="running", name="etl", tenant="x"),
        row("b", 2.0, status="failed", name="etl", tenant="y"),
        row("c", 3.0, status="succeeded", name="report", tenant="x"),
        row("d", 4.0, status="running", name="report"),
    ]
    for each in rows:
        await store.index.upsert(each)

    async def ids(**filters: object) -> list[str]:
        return [r.id for r in (await store.index.query(**filters)).rows]  # type: ignore[arg-type]

    assert await ids(status=["running"]) == ["d", "a"]
    assert await ids(status=["running", "failed"]) == ["d", "b", "a"]
    assert await ids(status=[]) == []
    assert await ids(name="etl") == ["b", "a"]
    assert await ids(tenant="x") == ["c", "a"]
    assert await ids(tenant="") == ["d"]
    assert await ids(status=["running"], name="report", tenant="") == ["d"]


async def test_query_pages_through_every_row_once(store: Store) -> None:
    # Ties on created_at are ordered by id, newest (largest) first.
    for i in range(7):
        await store.index.upsert(row(f"w{i}", float(i // 2)))
    seen: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        page = await store.index.query(limit=3, cursor=cursor)
        seen.extend(r.id for r in page.rows)
        pages += 1
        if page.cursor is None:
            break
        cursor = page.cursor
    assert seen == ["w6", "w5", "w4", "w3", "w2", "w1", "w0"]
    assert pages == 3


async def test_query_paging_keeps_the_filters(store: Store) -> None:
    for i in range(6):
        await store.index.upsert(row(f"w{i}", float(i), status="failed" if i % 2 else "running"))
    first = await store.index.query(status=["failed"], limit=2)
    assert first.cursor is not None
    second = await store.index.query(status=["failed"], limit=2, cursor=first.cursor)
    assert [r.id for r in first.rows + second.rows] == ["w5", "w3", "w1"]
    assert second.cursor is None


async def test_query_rejects_a_single_string_as_status(store: Store) -> None:
    with pytest.raises(ValidationError, match="list of statuses"):
        await store.index.query(status="running")


async def test_query_rejects_a_malformed_cursor(store: Store) -> None:
    with pytest.raises(ValidationError, match="cursor"):
        await store.index.query(cursor="not a cursor")


async def test_index_delete_removes_the_row_and_says_so(store: Store) -> None:
    await store.index.upsert(row("w1", 1.0))
    assert await store.index.delete("w1") is True
    assert await store.index.get("w1") is None
    assert await store.index.delete("w1") is False
    assert (await store.index.query()).rows == []


async def test_changed_returns_rows_written_after_a_moment_oldest_change_first(
    store: Store,
) -> None:
    await store.index.upsert(row("a", 1.0, updated_at=10.0))
    await store.index.upsert(row("b", 2.0, updated_at=30.0))
    await store.index.upsert(row("c", 3.0, updated_at=20.0))
    await store.index.upsert(row("a", 1.0, status="failed", updated_at=40.0))  # moved
    found = await store.index.changed(15.0)
    assert [(r.id, r.status, r.updated_at) for r in found] == [
        ("c", "running", 20.0),
        ("b", "running", 30.0),
        ("a", "failed", 40.0),
    ]
    assert [r.id for r in await store.index.changed(15.0, limit=2)] == ["c", "b"]
    assert await store.index.changed(40.0) == []


# --- leases -------------------------------------------------------------------------


async def test_a_free_lease_is_acquired(store: Store, clock: FakeClock) -> None:
    before = clock.now
    lease = await store.leases.acquire("coordinator", "host-1", 30)
    assert (lease.name, lease.owner) == ("coordinator", "host-1")
    assert lease.acquired_at == during(before, clock.now, clock)
    assert lease.expires_at == lease.acquired_at + 30
    assert await store.leases.get("coordinator") == lease


async def test_a_held_lease_refuses_another_owner(store: Store, clock: FakeClock) -> None:
    before = clock.now
    await store.leases.acquire("coordinator", "host-1", 30)
    acquired = clock.now
    clock.advance(1)
    asked = clock.now
    with pytest.raises(LeaseHeld) as raised:
        await store.leases.acquire("coordinator", "host-2", 30)
    refused = clock.now
    assert raised.value.holder == "host-1"
    assert raised.value.age_s == during(asked - acquired, refused - before, clock)  # 1 s
    assert raised.value.expires_in_s == during(
        30 - (refused - before), 30 - (asked - acquired), clock
    )


async def test_an_expired_lease_reads_as_free_and_is_taken_over_with_a_new_token(
    store: Store, clock: FakeClock
) -> None:
    old = await store.leases.acquire("coordinator", "host-1", SHORT_TTL)
    clock.advance(SHORT_TTL + 1)
    assert await store.leases.get("coordinator") is None
    new = await store.leases.acquire("coordinator", "host-2", 30)
    assert new.owner == "host-2" and new.token != old.token


async def test_force_takes_a_held_lease(store: Store) -> None:
    old = await store.leases.acquire("coordinator", "host-1", 30)
    new = await store.leases.acquire("coordinator", "host-2", 30, force=True)
    assert new.token != old.token
    with pytest.raises(LeaseLost):
        await store.leases.renew(old, 30)


async def test_the_same_owner_may_acquire_again_with_a_new_token(store: Store) -> None:
    old = await store.leases.acquire("coordinator", "host-1", 30)
    new = await store.leases.acquire("coordinator", "host-1", 30)
    assert new.token != old.token


async def test_renew_extends_a_held_lease(store: Store, clock: FakeClock) -> None:
    lease = await store.leases.acquire("coordinator", "host-1", 30)
    clock.advance(1)
    before = clock.now
    renewed = await store.leases.renew(lease, 30)
    assert renewed.token == lease.token
    assert renewed.expires_at == during(before + 30, clock.now + 30, clock)
    assert renewed.expires_at > lease.expires_at
    clock.advance(1)
    assert await store.leases.get("coordinator") == renewed


async def test_renew_of_an_expired_lease_nobody_took_succeeds(
    store: Store, clock: FakeClock
) -> None:
    lease = await store.leases.acquire("coordinator", "host-1", SHORT_TTL)
    clock.advance(SHORT_TTL + 1)
    renewed = await store.leases.renew(lease, SHORT_TTL)
    assert await store.leases.get("coordinator") == renewed


async def test_renew_after_a_takeover_raises_lease_lost(store: Store) -> None:
    # Taken over by force: the same as after expiry, without waiting for it.
    lease = await store.leases.acquire("coordinator", "host-1", 30)
    await store.leases.acquire("coordinator", "host-2", 30, force=True)
    with pytest.raises(LeaseLost, match="coordinator"):
        await store.leases.renew(lease, 30)


async def test_renew_after_release_raises_lease_lost(store: Store) -> None:
    lease = await store.leases.acquire("coordinator", "host-1", 30)
    await store.leases.release(lease)
    with pytest.raises(LeaseLost):
        await store.leases.renew(lease, 30)


async def test_release_frees_the_lease_for_another_owner(store: Store) -> None:
    lease = await store.leases.acquire("coordinator", "host-1", 30)
    await store.leases.release(lease)
    assert await store.leases.get("coordinator") is None
    assert (await store.leases.acquire("coordinator", "host-2", 30)).owner == "host-2"


async def test_release_of_a_lease_no_longer_held_keeps_the_new_holder(store: Store) -> None:
    old = await store.leases.acquire("coordinator", "host-1", 30)
    new = await store.leases.acquire("coordinator", "host-2", 30, force=True)
    await store.leases.release(old)
    assert await store.leases.get("coordinator") == new


async def test_get_of_an_unknown_lease_is_none(store: Store) -> None:
    assert await store.leases.get("never") is None


async def test_leases_are_independent_by_name(store: Store) -> None:
    await store.leases.acquire("a", "host-1", 30)
    assert (await store.leases.acquire("b", "host-2", 30)).owner == "host-2"


async def test_acquire_rejects_a_non_positive_ttl(store: Store) -> None:
    with pytest.raises(ValidationError):
        await store.leases.acquire("a", "host-1", 0)
