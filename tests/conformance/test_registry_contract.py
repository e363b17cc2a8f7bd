"""Workers' records (:mod:`dagq.registry`) and live log chunks (:mod:`dagq.live_logs`)
on every backend: both are plain documents, so what works on one works on all.

A record's times are the worker's clock, never the store's: the records are written and
judged on a fake clock on every backend (on Azurite's real one, a beat written a little
late under load, or a put slower than its limit, failed a test of the rules).
"""

from __future__ import annotations

from dagq import keys
from dagq.client import Client
from dagq.live_logs import CHUNK_BYTES, LiveLog
from dagq.registry import EXPIRY_BEATS, Registration, WorkerRecord, live_workers, record_key
from dagq.stores.base import Store
from tests.conformance.conftest import FakeClock

#: Long enough that no store under load takes longer to write a record (a beat waits
#: at most a heartbeat for its put): the clock is fake, so it costs no time.
HEARTBEAT_S = 10.0


def registration(store: Store, clock: FakeClock, worker_id: str = "host:42:abc") -> Registration:
    def describe() -> WorkerRecord:
        return WorkerRecord(
            id=worker_id,
            host="host",
            pid=42,
            queues=["cpu"],
            concurrency=2,
            started_at=1.0,
            last_seen=clock(),
            heartbeat_s=HEARTBEAT_S,
        )

    return Registration(store.documents, describe, clock=clock)


async def test_a_registered_worker_is_listed(store: Store) -> None:
    clock = FakeClock()
    await registration(store, clock).register()

    [record] = await live_workers(store.documents, now=clock())

    assert record.id == "host:42:abc"
    assert record.queues == ["cpu"]


async def test_a_withdrawn_worker_is_gone(store: Store) -> None:
    clock = FakeClock()
    worker = registration(store, clock)
    await worker.register()

    await worker.withdraw()

    assert await live_workers(store.documents, now=clock()) == []
    assert await store.documents.list(keys.WORKERS_PREFIX) == []


async def test_a_record_past_its_expiry_is_left_out_and_deleted(store: Store) -> None:
    clock = FakeClock()
    await registration(store, clock, "dead:1:x").register()
    clock.advance(EXPIRY_BEATS * HEARTBEAT_S + 0.5)
    await registration(store, clock, "alive:2:y").register()

    listed = await live_workers(store.documents, now=clock())

    assert [r.id for r in listed] == ["alive:2:y"]
    assert await store.documents.list(keys.WORKERS_PREFIX) == [record_key("alive:2:y")]


async def test_a_heartbeat_keeps_a_record_alive(store: Store) -> None:
    clock = FakeClock()
    worker = registration(store, clock)
    await worker.register()
    clock.advance(EXPIRY_BEATS * HEARTBEAT_S * 0.6)
    await worker.beat()
    clock.advance(EXPIRY_BEATS * HEARTBEAT_S * 0.6)

    assert [r.id for r in await live_workers(store.documents, now=clock())] == ["host:42:abc"]


async def test_a_damaged_record_is_left_out(store: Store) -> None:
    clock = FakeClock()
    await store.documents.put(keys.worker("junk"), b"not json")

    assert await live_workers(store.documents, now=clock()) == []


async def test_live_chunks_come_back_in_order(store: Store) -> None:
    prefix = keys.live_log_prefix("wf", 3, 1, item=2)
    live = LiveLog(store.documents, prefix)
    for n in range(3):
        live.write(f"line {n}\n".encode())
    live.write(b"x" * (CHUNK_BYTES + 10))  # more than one chunk
    await live.close()

    async with Client(store) as client:
        chunks = await client.live_output(prefix)
        after_first = await client.live_output(prefix, after=chunks[0][0])

    data = b"".join(chunk for _, chunk in chunks)
    assert data == b"line 0\nline 1\nline 2\n" + b"x" * (CHUNK_BYTES + 10)
    assert len(chunks) == 2
    assert after_first == chunks[1:]
