"""Review26: breaking the PostgreSQL store's wake-one registrations."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import time

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
