"""Server-sent event streams on the store's change feed, against a real ``dagq server``.

A stream looks at the store when what it watches changes (docs/architecture.md; the
server module ``dagq.server.pacing``): a change another process commits to a sqlite
store reaches every open stream in tens of milliseconds, and open streams that see
nothing cost the server next to no CPU (they used to poll five times a second each).
The writer here is this test process, appending history chunks to a run that waits
(no coordinator runs), so what is timed is the server's own part.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from dagq import keys
from dagq.history import HistoryEntry, encode_chunk
from dagq.stores import open_store
from tests.integration.cli_harness import DagqCli, wait_until
from tests.integration.test_server_api import ApiServer

pytestmark = pytest.mark.timeout(120)

STREAMS = 100
WAITING = """\
name: streams-wait
tasks:
  - name: gate
    wait_for: {signal: go}
"""


class StreamsServer(ApiServer):
    """``dagq server`` given a minute to start (a loaded shared machine)."""

    def start(self) -> None:
        self.process = self.cli.start(
            "server", "--store", self.cli.store_url, "--port", str(self.port)
        )
        wait_until(self._answers, timeout_s=60, what="the server to answer /healthz")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    with DagqCli(tmp_path_factory.mktemp("streams")) as cli:
        api = StreamsServer(cli)
        api.start()
        yield api
        api.stop()


class Reader:
    """A thread reading one stream, noting when each ``probe`` entry arrives."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.opened = threading.Event()
        self.arrivals: dict[str, float] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        with httpx.stream("GET", self.url, timeout=60) as response:
            self.opened.set()
            for line in response.iter_lines():
                if self.stop.is_set():
                    return
                if line.startswith("data:") and '"kind":"probe"' in line:
                    self.arrivals[json.loads(line[5:])["detail"]] = time.time()


def submit_waiting(server: ApiServer, workflow_id: str) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as http:
        body = {"definition": WAITING, "id": workflow_id}
        assert http.post("/v1/workflows", json=body).status_code == 202


async def append(store_url: str, workflow_id: str, seq: int) -> float:
    """Append a ``probe`` entry (detail: its number) to the run's history; when the
    commit ended."""
    store = open_store(store_url)
    try:
        batch = store.batch()
        entry = HistoryEntry(time.time(), "probe", None, 0, str(seq), None)
        batch.put(keys.history(workflow_id, 1_000 + seq), encode_chunk([entry]))
        await batch.commit()
        return time.time()
    finally:
        await store.close()


def cpu_s(pid: int) -> float:
    """User and system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def arrived_everywhere(readers: list[Reader], probe: str) -> bool:
    return all(probe in reader.arrivals for reader in readers)


def open_readers(server: ApiServer, workflow_id: str, count: int) -> list[Reader]:
    readers = [Reader(f"{server.url}/v1/workflows/{workflow_id}/stream") for _ in range(count)]
    for reader in readers:
        assert reader.opened.wait(30), "a stream did not open"
    return readers


def test_a_commit_of_another_process_reaches_every_open_stream_at_once(
    server: ApiServer,
) -> None:
    submit_waiting(server, "streams-fast")
    readers = open_readers(server, "streams-fast", 10)
    try:
        delays: list[float] = []
        for seq in range(8):
            committed = asyncio.run(append(server.cli.store_url, "streams-fast", seq))
            wait_until(
                functools.partial(arrived_everywhere, readers, str(seq)),
                timeout_s=10,
                what=f"probe {seq} on every stream",
            )
            delays.extend(r.arrivals[str(seq)] - committed for r in readers)
            time.sleep(0.05 + 0.011 * seq)  # out of step with any polling interval
    finally:
        for reader in readers:
            reader.stop.set()
    # Polling every 0.2 s put the median near 0.1 s; the change feed, a few ms.
    assert statistics.median(delays) < 0.09, sorted(delays)


def test_idle_open_streams_cost_the_server_almost_no_cpu(server: ApiServer) -> None:
    submit_waiting(server, "streams-idle")
    readers = open_readers(server, "streams-idle", STREAMS)
    try:
        pid = server.process.pid if server.process else 0
        time.sleep(1.0)  # the streams have sent what there was
        before, began = cpu_s(pid), time.monotonic()
        time.sleep(3.0)
        used = cpu_s(pid) - before
        seconds = time.monotonic() - began
    finally:
        for reader in readers:
            reader.stop.set()
    # 100 streams polling five times a second took ~13% of a core; now one file check
    # every 20 ms for all of them.
    assert used / seconds < 0.06, f"{used:.2f} s CPU in {seconds:.1f} s for {STREAMS} streams"
