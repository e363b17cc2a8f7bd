"""Several real processes sharing one sqlite file.

Each worker is this file run as a script: it opens the store, prints ``ready``,
waits for a start signal (a file appearing) so that all workers race, does its part
and prints a JSON summary.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import dagq.stores.sqlite
from dagq.errors import ConflictError
from dagq.stores.base import OutgoingMessage, Store
from dagq.stores.sqlite import open_sqlite_store

SRC = Path(dagq.stores.sqlite.__file__).resolve().parents[2]
QUEUE = "jobs"
COUNTER = "counter"


# --- the workers (run in child processes) -------------------------------------------


async def receive_until_empty(store: Store, batch: str) -> dict[str, Any]:
    """Receive with a long visibility timeout until the queue looks empty."""
    ids: list[str] = []
    redelivered = 0
    delete = False
    while messages := await store.queues.receive(
        QUEUE, max_messages=int(batch), visibility_timeout_s=600
    ):
        ids.extend(m.id for m in messages)
        redelivered += sum(1 for m in messages if m.dequeue_count != 1)
        delete = not delete
        if delete:  # delete half the batches, so deletes race with receives too
            await store.queues.delete(QUEUE, [m.receipt for m in messages])
    return {"ids": ids, "redelivered": redelivered}


async def increment(store: Store, times: str) -> dict[str, Any]:
    """Add one to the counter document ``times`` times, retrying lost races."""
    with contextlib.suppress(ConflictError):  # another worker created it first
        await store.documents.put(COUNTER, b"0", if_none_match=True)
    conflicts = 0
    for _ in range(int(times)):
        while True:
            document = await store.documents.get(COUNTER)
            assert document is not None
            value = int(document.data) + 1
            try:
                await store.documents.put(COUNTER, str(value).encode(), if_match=document.etag)
                break
            except ConflictError:
                conflicts += 1
    return {"done": int(times), "conflicts": conflicts}


WORKERS = {"receive": receive_until_empty, "increment": increment}


def work(mode: str, db: str, go: str, *args: str) -> None:
    store = open_sqlite_store(db)
    print("ready", flush=True)
    while not os.path.exists(go):
        time.sleep(0.002)

    async def run() -> dict[str, Any]:
        try:
            return await WORKERS[mode](store, *args)
        finally:
            await store.close()

    print(json.dumps(asyncio.run(run())), flush=True)


# --- the tests ----------------------------------------------------------------------


def run_workers(tmp_path: Path, count: int, mode: str, *args: str) -> list[dict[str, Any]]:
    """Start ``count`` workers on one file, release them together, collect summaries."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    go = tmp_path / "go"
    command = [sys.executable, __file__, mode, str(tmp_path / "store.db"), str(go), *args]
    workers = [
        subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        for _ in range(count)
    ]
    try:
        for worker in workers:
            assert worker.stdout is not None
            assert worker.stdout.readline().strip() == "ready", worker.communicate()[1]
        go.touch()
        summaries = []
        for worker in workers:
            out, err = worker.communicate(timeout=60)
            assert worker.returncode == 0, err
            summaries.append(json.loads(out))
        return summaries
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()


async def test_each_message_goes_to_exactly_one_of_several_processes(tmp_path: Path) -> None:
    store = open_sqlite_store(tmp_path / "store.db")
    sent = [f"m{i}" for i in range(4000)]
    await store.queues.send(QUEUE, [OutgoingMessage(body=b"x", id=i) for i in sent])
    await store.close()

    summaries = await asyncio.to_thread(run_workers, tmp_path, 5, "receive", "10")

    received = Counter(i for summary in summaries for i in summary["ids"])
    assert [i for i, n in received.items() if n > 1] == []
    assert set(received) == set(sent)
    assert sum(summary["redelivered"] for summary in summaries) == 0


async def test_compare_and_swap_loses_no_update_across_processes(tmp_path: Path) -> None:
    summaries = await asyncio.to_thread(run_workers, tmp_path, 5, "increment", "200")

    store = open_sqlite_store(tmp_path / "store.db")
    document = await store.documents.get(COUNTER)
    await store.close()
    assert document is not None
    assert int(document.data) == sum(summary["done"] for summary in summaries) == 1000


if __name__ == "__main__":
    work(*sys.argv[1:])
