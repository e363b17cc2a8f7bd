"""The round trip of a Python task to a pool process, alone (issue 17).

    python -m bench.pool_trip [--tasks 4000] [--slots 1,4] [--runs 3]

Runs ``--tasks`` no-op tasks that consume an input (``bench.tasks:add_one`` with
``root = 1``, so a request carries stored inputs and a reply an output) through a
worker's :class:`~dagq.runners.pool.TaskPool` of ``--slots`` processes, each slot
sending its next task as soon as the last one answered, and prints one JSON line per
run: tasks a second, wall microseconds a task, and CPU microseconds a task in this
process (the worker's side: encoding, the pipe, reading the reply and the output
capture) and in the pool processes (decoding, redirecting stdout and stderr, calling
the function, encoding the reply; with the kernel's share of each wake-up). No store,
no coordinator: what `dagq run` adds to it is in ``python -m bench``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import time

from dagq.runners import StoredInputs, TaskContext
from dagq.runners.pool import TaskPool
from dagq.runners.python import add_import_paths

CALL = "bench.tasks:add_one"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


async def measure(tasks: int, slots: int) -> dict[str, object]:
    """One run: ``tasks`` tasks through a pool of ``slots`` processes."""
    add_import_paths([ROOT])
    pool = TaskPool(slots)
    ctx = TaskContext(workflow_id="bench", task="mid", attempt=1, idempotency_key="k")
    inputs = StoredInputs(inline={"root": 1})
    per_slot = max(1, tasks // slots)

    async def lane() -> None:
        for _ in range(per_slot):
            outcome = await pool.run(CALL, None, ctx, 60.0, inputs=inputs, live=lambda _: None)
            if not (outcome.ok and outcome.output == 2):
                raise SystemExit(f"a task failed: {outcome.error or outcome.output!r}")

    try:
        await asyncio.gather(*(lane() for _ in range(slots)))  # every process started, warm
        cpu, wall = time.process_time(), time.perf_counter()
        await asyncio.gather(*(lane() for _ in range(slots)))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    finally:
        await pool.close()
    done = per_slot * slots
    return {
        "tasks": done,
        "slots": slots,
        "tasks_per_s": round(done / wall),
        "wall_us_per_task": round(wall / done * 1e6, 1),
        "worker_cpu_us_per_task": round(cpu / done * 1e6, 1),
        "load_average": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.pool_trip", description=__doc__)
    parser.add_argument("--tasks", type=int, default=4000)
    parser.add_argument("--slots", default="1,4", help="comma-separated pool sizes")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    for _ in range(args.runs):
        for slots in (int(s) for s in args.slots.split(",")):
            before = _children_cpu()
            result = asyncio.run(measure(args.tasks, slots))
            # The pool processes are reaped by their zygote, and it by this process,
            # once the pool is closed: their CPU is in, warm-up tasks included.
            children = _children_cpu() - before
            result["pool_cpu_us_per_task"] = round(children / (2 * result["tasks"]) * 1e6, 1)
            print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
