"""``python -m bench.server``: how fast ``dagq server`` answers, on one SQLite store.

    python -m bench.server                        # 10,000-task run, 100,000 listed runs
    python -m bench.server --tasks 50 --rows 500 --requests 5   # what CI runs

Three figures, each timed from a client on 127.0.0.1 (httpx, one kept-alive
connection), a real ``dagq server`` process serving a store that holds:

* **status** — ``GET /v1/workflows/{id}`` of a fan-out run of ``--tasks`` tasks that
  ran to completion (in this process, before the server starts);
* **list** — ``GET /v1/workflows`` (the first page of 50, and a page by status) with
  ``--rows`` runs in the index (seeded in one batch: the rows, not the runs);
* **sse** — from the moment the coordinator stamps a history entry (``at``; the
  entries a worker stamps when an attempt ends are left out) or a listing row
  (``updated_at``) to its arrival at a client of ``…/{id}/stream`` and of
  ``/v1/stream``, while ``dagq coordinator`` and ``dagq worker`` run a chain of tasks.
  The coordinator stamps before it commits: the figure includes the commit (and, on
  a loaded machine, the time the coordinator waits for a CPU);
* **sse_commit** — from the end of a commit of a history chunk to its arrival at a
  client of ``…/{id}/stream``: ``--probes`` chunks appended straight to the history of
  a run that waits (before the coordinator starts), spaced 100-180 ms apart. This is
  the server's own part of the SSE figure: noticing the change and sending it.

Prints one JSON line with every figure (milliseconds), then a table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import msgspec
from rich.console import Console
from rich.table import Table

from bench.run_one import inproc
from bench.workloads import chain, fan_out
from dagq import keys
from dagq.history import HistoryEntry, encode_chunk
from dagq.stores import open_store
from dagq.stores.base import Batch, IndexRow

ROOT = Path(__file__).resolve().parent.parent
DAGQ = str(Path(sys.executable).with_name("dagq"))
STATUSES = ("completed", "failed", "running", "cancelled")
#: History entries stamped with the worker's clock when the attempt started or ended
#: (not when the coordinator committed them): left out of the latency.
WORKER_STAMPED = frozenset({"started", "completed", "failed", "retried", "warning"})
#: The kind of the history entries the commit probe appends.
PROBE = "bench_probe"


async def seed_rows(url: str, count: int) -> None:
    """``count`` listing rows (no runs behind them), in one committed batch."""
    store = open_store(url)
    batch = Batch(store)
    start = time.time() - count
    for i in range(count):
        status = STATUSES[i % len(STATUSES)]
        batch.upsert(
            IndexRow(
                id=f"seeded-{i:07d}",
                name=f"seeded-{i % 20}",
                status=status,
                created_at=start + i,
                updated_at=start + i + 1,
                data={"total": 5, "counts": {status: 5}},
            )
        )
    await batch.commit()
    await store.close()


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def start(*args: str, url: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "DAGQ_STORE": url}
    return subprocess.Popen(
        [DAGQ, *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT
    )


def wait_for(check: Any, what: str, timeout_s: float = 60) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            found = check()
        except httpx.TransportError:
            found = None
        if found:
            return found
        time.sleep(0.05)
    raise SystemExit(f"timed out waiting for {what}")


def timed(http: httpx.Client, path: str, requests: int, **params: Any) -> list[float]:
    """Milliseconds of each of ``requests`` GETs of ``path`` (after 3 not counted)."""
    for _ in range(3):
        http.get(path, params=params).raise_for_status()
    times = []
    for _ in range(requests):
        began = time.perf_counter()
        http.get(path, params=params).raise_for_status()
        times.append((time.perf_counter() - began) * 1000)
    return times


def figures(prefix: str, times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {
        f"{prefix}_p50_ms": round(statistics.median(ordered), 1),
        f"{prefix}_p95_ms": round(ordered[math.ceil(0.95 * len(ordered)) - 1], 1),
        f"{prefix}_max_ms": round(ordered[-1], 1),
    }


def listen(
    url: str, path: str, stamp: str, done: threading.Event, out: list[tuple[float, float]]
) -> None:
    """Append (stamp, arrival) of each event of ``path`` that has field ``stamp`` (and
    was stamped by the coordinator), until the run ends (its ``end`` event, or a row
    ``completed``)."""
    with httpx.stream("GET", f"{url}{path}", timeout=60) as response:
        data = None
        for line in response.iter_lines():
            if line.startswith("data:"):
                data = line[5:].strip()
            elif not line and data:
                arrived = time.time()
                event = json.loads(data) if data.startswith("{") else {}
                if stamp in event and event.get("kind") not in WORKER_STAMPED:
                    out.append((float(event[stamp]), arrived))
                if event.get("status") == "completed" and stamp == "updated_at":
                    done.set()
                data = None
            if done.is_set() and stamp == "updated_at":
                return  # the history stream ends by itself after its ``end`` event


def sse_latency(url: str, steps: int) -> dict[str, Any]:
    """A run waits for a signal, both streams are read, then the signal lets a chain of
    ``steps`` tasks run: every event stamped after the signal was sent is timed."""
    definition = _gated_chain(steps)
    with httpx.Client(base_url=url, timeout=30) as http:
        workflow_id = f"sse-{int(time.time())}"
        done = threading.Event()
        own: list[tuple[float, float]] = []
        every: list[tuple[float, float]] = []
        path = f"/v1/stream?name={definition['name']}"
        readers = [threading.Thread(target=listen, args=(url, path, "updated_at", done, every))]
        readers[0].start()
        http.post("/v1/workflows", json={"definition": definition, "id": workflow_id})
        location = f"/v1/workflows/{workflow_id}"
        wait_for(
            lambda: http.get(f"{location}/tasks/gate").json()["status"] == "waiting",
            "the run to wait for its signal",
        )
        history = f"{location}/stream"
        readers.append(threading.Thread(target=listen, args=(url, history, "at", done, own)))
        readers[1].start()
        time.sleep(1.0)  # both streams have sent what came before (not timed)
        sent = time.time()
        http.post(f"{location}/signals/go", json={}).raise_for_status()
        done.wait(timeout=300)
        for reader in readers:
            reader.join(timeout=30)
    live = [(arrived - at) * 1000 for at, arrived in own if at >= sent]
    rows = [(arrived - at) * 1000 for at, arrived in every if at >= sent]
    return {
        **figures("sse_history", live),
        "sse_history_events": len(live),
        **figures("sse_rows", rows),
        "sse_rows_events": len(rows),
    }


def commit_latency(url: str, store_url: str, probes: int) -> dict[str, Any]:
    """Append ``probes`` history chunks to a waiting run (no coordinator running) and
    time each from the end of its commit to its arrival at a stream's client."""
    workflow_id = f"probe-{int(time.time())}"
    arrived: list[float] = []
    with httpx.Client(base_url=url, timeout=30) as http:
        gate = {"name": "gate", "wait_for": {"signal": "go"}}
        definition = {"name": "bench-probe", "tasks": [gate]}
        http.post("/v1/workflows", json={"definition": definition, "id": workflow_id})
        reader = threading.Thread(
            target=_read_probes, args=(url, workflow_id, probes, arrived), daemon=True
        )
        reader.start()
        time.sleep(1.0)  # the stream is open and has sent what came before
        committed = asyncio.run(_append_probes(store_url, workflow_id, probes))
        reader.join(timeout=30)
    times = [(at - done) * 1000 for done, at in zip(committed, arrived, strict=False)]
    return {**figures("sse_commit", times), "sse_commit_events": len(times)}


async def _append_probes(store_url: str, workflow_id: str, probes: int) -> list[float]:
    store = open_store(store_url)
    committed = []
    try:
        for i in range(probes):
            batch = store.batch()
            entry = HistoryEntry(time.time(), PROBE, None, 0, None, None)
            batch.put(keys.history(workflow_id, 1_000 + i), encode_chunk([entry]))
            await batch.commit()
            committed.append(time.time())
            await asyncio.sleep(0.1 + (i % 9) * 0.01)  # not in step with any poll
    finally:
        await store.close()
    return committed


def _read_probes(url: str, workflow_id: str, probes: int, out: list[float]) -> None:
    path = f"{url}/v1/workflows/{workflow_id}/stream"
    with httpx.stream("GET", path, timeout=60) as response:
        for line in response.iter_lines():
            if line.startswith("data:") and f'"kind":"{PROBE}"' in line:
                out.append(time.time())
                if len(out) >= probes:
                    return


def _gated_chain(steps: int) -> dict[str, Any]:
    """A task that waits for signal ``go``, then a chain of ``steps`` tasks."""
    data: dict[str, Any] = msgspec.to_builtins(chain(steps))
    data["name"] = f"bench-sse-{steps}"
    data["tasks"][0]["depends_on"] = ["gate"]
    data["tasks"].insert(0, {"name": "gate", "wait_for": {"signal": "go"}})
    return data


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--steps", type=int, default=30, help="tasks of the SSE chain")
    parser.add_argument("--probes", type=int, default=40, help="chunks of the commit probe")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dagq-bench-server-") as tmp:
        url = f"sqlite:///{Path(tmp) / 'dagq.db'}"
        began = time.perf_counter()
        asyncio.run(inproc(fan_out(args.tasks), 1, 16, url))
        ran_s = time.perf_counter() - began
        began = time.perf_counter()
        asyncio.run(seed_rows(url, args.rows))
        seeded_s = time.perf_counter() - began
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        server = start("server", "--port", str(port), url=url)
        others: list[subprocess.Popen[bytes]] = []
        try:
            wait_for(lambda: httpx.get(f"{base}/healthz").status_code == 200, "the server")
            result: dict[str, Any] = {
                "tasks": args.tasks + 2,
                "rows": args.rows,
                "run_s": round(ran_s, 1),
                "seed_s": round(seeded_s, 1),
            }
            with httpx.Client(base_url=base, timeout=30) as http:
                result |= figures("status", timed(http, "/v1/workflows/bench-0", args.requests))
                result |= figures("list", timed(http, "/v1/workflows", args.requests))
                result |= figures(
                    "list_status",
                    timed(http, "/v1/workflows", args.requests, status="failed"),
                )
            result |= commit_latency(base, url, args.probes)
            others = [
                start("coordinator", "--log-interval", "3600", url=url),
                start("worker", "-c", "4", "--import-path", str(ROOT), url=url),
            ]
            result |= sse_latency(base, args.steps)
        finally:
            for process in [server, *others]:
                process.terminate()
            for process in [server, *others]:
                process.wait(timeout=30)
    print(json.dumps(result))
    table = Table("figure", "p50 ms", "p95 ms", "max ms", title="dagq server benchmark")
    for name in ("status", "list", "list_status", "sse_history", "sse_rows", "sse_commit"):
        table.add_row(
            name,
            *(str(result[f"{name}_{k}_ms"]) for k in ("p50", "p95", "max")),
        )
    Console().print(table)


if __name__ == "__main__":
    main()
