"""What one Azure request costs here, by kind: CPU of this process and of Azurite.

    python -m bench.request_cost [--requests 300]

Each kind runs in a loop through the store's own :class:`AzureService` (the SDK's aio
clients, one aiohttp session), after a warm-up, 16 requests in flight and then one,
on a fresh Azurite this starts (or the account ``AZURE_STORAGE_CONNECTION_STRING``
names, with ``DAGQ_BENCH_SERVER_PID`` the emulator's PID). Per request: this process's
CPU (``time.process_time``), Azurite's (``/proc``: the whole process, and its main
thread, where its JavaScript runs), requests per second and the time each took. An
entity group transaction is measured both through the SDK's ``submit_transaction`` and
through :func:`dagq.stores.azure_batch.submit`, which the index uses.

From these, and a run's requests per task (``python -m bench.run_one W4 full inproc
--store azure``), the most tasks per second this machine can give: its cores over
both processes' CPU per task, and Azurite's one thread over its own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

from azure.data.tables import UpdateMode

from bench import process_cpu
from dagq.stores import azure_batch
from dagq.stores.azure_auth import parse_azure_url, resolve_auth
from dagq.stores.azure_service import AzureService

_BODY = b"x" * 700  # about a W4 state header
_Request = Callable[[int], Awaitable[None]]


async def _measure(
    count: int, request: _Request, in_flight: int, per_call: int = 1
) -> dict[str, float]:
    """Figures per request of ``count`` calls of ``request`` (each ``per_call`` requests)."""
    limit = asyncio.Semaphore(in_flight)

    async def one(i: int) -> None:
        async with limit:
            await request(i)

    cpu, server, started = time.process_time(), process_cpu.server_cpu(), time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(count)))
    wall = time.perf_counter() - started
    cpu, after = time.process_time() - cpu, process_cpu.server_cpu()
    count *= per_call
    figures = {
        "client_cpu_ms": round(cpu * 1000 / count, 3),
        "requests_per_s": round(count / wall, 1),
        "ms_each": round(wall * 1000 * in_flight / count, 2),
    }
    if server is not None and after is not None:
        figures["azurite_cpu_ms"] = round((after.total - server.total) * 1000 / count, 3)
        figures["azurite_main_thread_ms"] = round(
            (after.main_thread - server.main_thread) * 1000 / count, 3
        )
    return figures


async def _kinds(service: AzureService) -> dict[str, tuple[_Request, int, int]]:
    """Each kind's call (given its number), how many fewer calls it makes than the
    count, and how many requests a call is."""
    clients = await service.clients()
    queue = service.queue_client(clients, f"cost{secrets.token_hex(4)}")
    await queue.create_queue()
    replace = {"mode": UpdateMode.REPLACE}

    def entities(i: int, count: int) -> list[Any]:
        return [
            ("upsert", {"PartitionKey": f"g{i}", "RowKey": f"r{j}", "v": _BODY}, replace)
            for j in range(count)
        ]

    async def put(i: int) -> None:
        await service.blob_client(clients, f"b{i % 50}").upload_blob(_BODY, overwrite=True)

    async def get(i: int) -> None:
        await (await service.blob_client(clients, f"b{i % 50}").download_blob()).readall()

    async def send(i: int) -> None:
        await queue.send_message("m" * 300)

    async def receive(i: int) -> None:
        async for message in queue.receive_messages(max_messages=1, visibility_timeout=60):
            await queue.delete_message(message)

    async def upsert(i: int) -> None:
        entity = {"PartitionKey": "p", "RowKey": f"r{i % 50}", "v": _BODY}
        await clients.table.upsert_entity(entity, mode=UpdateMode.REPLACE)

    def through_sdk(count: int) -> _Request:
        async def submit(i: int) -> None:
            await clients.table.submit_transaction(entities(i, count))

        return submit

    def through_dagq(count: int) -> _Request:
        async def submit(i: int) -> None:
            if not await azure_batch.submit(clients.table, entities(i, count)):
                raise RuntimeError("an entity group transaction failed")

        return submit

    await put(0)
    return {
        "blob.put": (put, 1, 1),
        "blob.get": (get, 1, 1),
        "queue.send": (send, 1, 1),
        "queue.receive and delete (each)": (receive, 2, 2),
        "table.upsert": (upsert, 1, 1),
        "table.batch of 3, SDK": (through_sdk(3), 1, 1),
        "table.batch of 3, dagq": (through_dagq(3), 1, 1),
        "table.batch of 30, SDK": (through_sdk(30), 5, 1),
        "table.batch of 30, dagq": (through_dagq(30), 5, 1),
    }


async def measure(count: int) -> list[dict[str, Any]]:
    """Every kind's figures, 16 in flight then 1 (``count`` requests of most kinds)."""
    target = parse_azure_url(f"azure://devstoreaccount1/cost{secrets.token_hex(4)}")
    service = AzureService(target, resolve_auth(target.account, os.environ))
    try:
        kinds = await _kinds(service)
        for request, fewer, _ in kinds.values():  # warm-up: Node's JIT, the SDK's caches
            await _measure(max(count // (5 * fewer), 10), request, 16)
        rows = []
        for in_flight in (16, 1):
            for kind, (request, fewer, per_call) in kinds.items():
                figures = await _measure(count // fewer, request, in_flight, per_call)
                rows.append({"kind": kind, "in_flight": in_flight, **figures})
        return rows
    finally:
        await service.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300, help="of each kind (default 300)")
    args = parser.parse_args()
    from tests.azurite import Azurite, start

    from dagq.stores.azure_auth import CONNECTION_STRING_VARIABLE

    emulator = Azurite(None, None) if os.environ.get(CONNECTION_STRING_VARIABLE) else start()
    if emulator.process is not None:
        os.environ[process_cpu.SERVER_PID] = str(emulator.process.pid)
    try:
        for row in asyncio.run(measure(args.requests)):
            print(json.dumps(row))
    finally:
        emulator.stop()


if __name__ == "__main__":
    main()
