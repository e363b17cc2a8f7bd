"""Review26: breaking the PostgreSQL store's wake-one registrations."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import time

import psycopg
import pytest

from dagq.stores import open_store
from tests.conftest import postgres_url
from tests.postgres import Cluster

pytestmark = pytest.mark.timeout(60)

_BUSY = """
import asyncio, sys
from dagq.stores import open_store

async def main():
    store = open_store(sys.argv[1])
    await store.queues.wait("tasks", 0.01)  # it listens for the queue
    # Asked for 2, found none: registered as waiting. Then its slots fill from its
    # other queue: it no longer waits for "tasks" (nor receives from it).
    assert await store.queues.receive("tasks", max_messages=2, visibility_timeout_s=30) == []
    print("registered", flush=True)
    await asyncio.sleep(30)  # its event loop runs on (its tasks run elsewhere)

asyncio.run(main())
"""
_SEND = """
import asyncio, sys
from dagq.stores import open_store
from dagq.stores.base import OutgoingMessage

async def main():
    store = open_store(sys.argv[1])
    await store.queues.send("tasks", [OutgoingMessage(b"1")])
    await store.close()

asyncio.run(main())
"""


def _python(code: str, url: str, **kwargs: object) -> subprocess.Popen[str]:
    return subprocess.Popen(  # type: ignore[call-overload, no-any-return]
        [sys.executable, "-c", textwrap.dedent(code), url],
        text=True,
        env={**os.environ},
        **kwargs,
    )


async def test_a_registered_process_that_stopped_waiting_does_not_absorb_the_wake_up(
    postgres_cluster: Cluster,
) -> None:
    """A worker registered for ``tasks`` but busy with its other queue's work takes a
    send's only wake-up; an idle worker waiting for ``tasks`` must still be woken (not
    left to its poll)."""
    url = postgres_url(postgres_cluster)
    idle = open_store(url)
    busy = None
    try:
        await idle.queues.wait("tasks", 0.01)
        assert await idle.queues.receive("tasks", max_messages=1, visibility_timeout_s=30) == []
        await asyncio.sleep(0.05)
        busy = _python(_BUSY, url, stdout=subprocess.PIPE)
        assert busy.stdout is not None
        line = await asyncio.to_thread(busy.stdout.readline)
        assert line.strip() == "registered"
        waiting = asyncio.ensure_future(idle.queues.wait("tasks", 10.0))
        await asyncio.sleep(0.1)
        assert not waiting.done()
        started = time.monotonic()
        sender = _python(_SEND, url)
        assert await asyncio.to_thread(sender.wait, 30) == 0
        sent = time.monotonic()
        await waiting
        # Woken by the send, not by its own timeout (the poll, here 10 s).
        assert time.monotonic() - sent < 3.0, time.monotonic() - started
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
            if busy.stdout is not None:
                busy.stdout.close()
        await idle.close()


async def test_receives_renewing_stale_registrations_at_once_do_not_deadlock(
    postgres_cluster: Cluster,
) -> None:
    """Workers whose registrations went stale (their slots were full for a minute)
    receive at once: each renews its own and deletes the others' stale ones; neither
    may wait for the other (PostgreSQL would fail one with 'deadlock detected')."""
    url = postgres_url(postgres_cluster)
    stores = [open_store(url) for _ in range(4)]
    schema = url.rpartition("schema=")[2]
    conninfo = stores[0].queues._db.target.conninfo  # type: ignore[attr-defined]
    conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
    try:
        for store in stores:
            await store.queues.wait("tasks", 0.01)
        for _ in range(200):
            await conn.execute(f"UPDATE {schema}.waiters SET until = %s", (time.time() - 100,))
            found = await asyncio.gather(
                *(
                    s.queues.receive("tasks", max_messages=4, visibility_timeout_s=30)
                    for s in stores
                ),
                return_exceptions=True,
            )
            assert found == [[]] * len(stores)
    finally:
        await conn.close()
        for store in stores:
            await store.close()
