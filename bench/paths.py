"""The paths users take: ``dagq run FILE`` as typed, and the public ``Client``.

* :func:`dagq_run` — writes the workload as a YAML file beside its tasks module (as a
  user lays out a project) and runs ``dagq run FILE`` in a subprocess with default
  options (4 slots, the default store under ``.dagq/``), piped; start-up (launch to the
  first task started) is reported apart from the run.
* :func:`client_inproc` — ``dagq.Client`` submits and waits, with a coordinator and a
  worker running in the same process on the same store object (``dagq run``'s options).

Both then read, through the public ``Client`` and untimed, every workflow's status, the
timings of its tasks and the final task's output (:func:`settle`): a run whose data did
not flow cannot pass (``result_ok``).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from bench import process_cpu
from bench.workloads import data, final, is_foreach, shape
from dagq import Client
from dagq.coordinator import Coordinator
from dagq.errors import UsageError
from dagq.loading import load_data
from dagq.local import LOCAL_COORDINATOR, LOCAL_VISIBILITY_S, local_poll_interval
from dagq.stores import open_store
from dagq.stores.base import Store
from dagq.views import PlanCache
from dagq.worker import Worker, WorkerOptions

ROOT = Path(__file__).resolve().parent.parent
TASKS_FILE = Path(__file__).with_name("tasks.py")


def dagq_run(
    workload: str, size: str, timeout_s: float = 1800, options: Sequence[str] = ()
) -> dict[str, Any]:
    """``dagq run w.yaml`` in a fresh directory, default options (and ``options``);
    timed from launch."""
    dagq = str(Path(sys.executable).with_name("dagq"))
    with tempfile.TemporaryDirectory(prefix="dagq-bench-run-") as tmp:
        directory = Path(tmp)
        shutil.copyfile(TASKS_FILE, directory / "bench_tasks.py")
        text = yaml.safe_dump(data(workload, size, module="bench_tasks"), sort_keys=False)
        (directory / "w.yaml").write_text(text)
        env = {k: v for k, v in os.environ.items() if not k.startswith("DAGQ_")}
        launched = time.time()
        with (
            subprocess.Popen(
                [dagq, "run", "w.yaml", *options],
                cwd=directory,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            ) as process,
            process_cpu.TreeSampler(process.pid) as sampler,
        ):
            try:
                out, err = process.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                raise
        ended = time.time()
        done = subprocess.CompletedProcess(process.args, process.returncode, out, err)
        first = done.stdout.splitlines()[0] if done.stdout else ""
        if not first.startswith("running ") or " as " not in first:
            raise SystemExit(
                f"dagq run w.yaml (exit {done.returncode}) did not say what it runs:\n"
                f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
            )
        workflow_id = first.rsplit(" as ", 1)[1].strip()
        url = f"sqlite:///{directory / '.dagq' / 'dagq.db'}"
        result = asyncio.run(settle(url, [workflow_id], workload, size, started=launched))
    # The CLI's own process (the coordinator and the worker's loop), and its largest
    # pool process: the largest of the children this process waited for.
    result["peak_rss_mb"] = {
        "dagq run": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    }
    result["exit_code"] = done.returncode
    # The run's end: its last state change (the settled wall is from launch to it).
    run_ended = launched + result["wall_s"]
    result["wall_s"] = round(ended - launched, 4)  # what the user waited, start-up included
    run_s = run_ended - result["first_started_at"]
    result["startup_s"] = round(result["first_started_at"] - launched, 4)
    result["run_s"] = round(run_s, 4)
    # From the run's end to the process's exit: the summary printed, the pool and the
    # span helper stopped (what it still had exported first).
    result["teardown_s"] = round(ended - run_ended, 4)
    # From the first task started to the run's end: neither start-up nor teardown,
    # each reported apart (both in wall_s).
    result["tasks_per_s"] = round(result["tasks"] / run_s, 1)
    result["slots"] = 4
    # The CPU of the tree's threads by part, sampled while it ran (every 50 ms): in the
    # run's window, and over the whole life (start-up and teardown included).
    per_task = 1e6 / result["tasks"]
    for key, spent in (
        ("cpu_by_part_us_per_task", sampler.spent_in(result["first_started_at"], run_ended)),
        ("cpu_by_part_total_us_per_task", sampler.total()),
    ):
        parts = sampler.by_part(spent)
        result[key] = {k: round(v * per_task, 1) for k, v in sorted(parts.items())}
    result["sampler_cpu_s"] = round(sampler.cpu_s, 4)
    return result


async def client_inproc(workload: str, size: str, workers: int, url: str) -> dict[str, Any]:
    """``Client.submit`` every workflow, then ``Client.wait`` for each, with a coordinator
    and a ``workers``-slot worker in this process (the options ``dagq run`` uses)."""
    definition_data = data(workload, size)
    _, count = shape(workload, size)
    store = open_store(url)
    coordinator = Coordinator(store, LOCAL_COORDINATOR)
    worker = Worker(
        store,
        WorkerOptions(
            queues=("default",),
            concurrency=workers,
            visibility_timeout_s=LOCAL_VISIBILITY_S,
            import_paths=(str(ROOT),),
            poll_interval_s=local_poll_interval(store),
        ),
    )
    stop = asyncio.Event()
    running = [asyncio.create_task(coordinator.run(stop)), asyncio.create_task(worker.run(stop))]
    client = Client(store, plans=PlanCache())
    definition = load_data(definition_data, source=workload)
    try:
        started = time.time()
        cpu_started = time.process_time()
        server_started = process_cpu.server_cpu()
        billed = dict(store.transactions or {})
        ids = [(await client.submit(definition, workflow_id=f"bench-{i}")).id for i in range(count)]
        for workflow_id in ids:
            await client.wait(workflow_id, timeout_s=1800)
        waited = time.time()
        cpu = time.process_time() - cpu_started
        server = process_cpu.server_cpu()
        transactions = {
            k: v - billed.get(k, 0)
            for k, v in (store.transactions or {}).items()
            if v > billed.get(k, 0)
        }
        run_peak = _peak_rss_mb()  # the checks below read every state again
        result = await settle(store, ids, workload, size, started=started)
    finally:
        stop.set()
        await asyncio.gather(*running, return_exceptions=True)
        await store.close()
    result["waited_s"] = round(waited - started, 4)
    result["cpu_s"] = round(cpu, 4)
    process_cpu.add_server_cpu(result, cpu, server_started, server)  # the Azurite it started
    if transactions:  # what a paying store bills, from the first submit to the last wait
        result["transactions_per_task"] = round(sum(transactions.values()) / result["tasks"], 2)
        result["transactions"] = dict(sorted(transactions.items()))
    result["peak_rss_mb"] = {"process": run_peak}
    result["peak_rss_checked_mb"] = round(
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1
    )
    result["slots"] = workers
    return result


async def settle(
    store: Any, ids: list[str], workload: str, size: str, *, started: float
) -> dict[str, Any]:
    """What the public ``Client`` says of the finished runs (untimed): their status, the
    final task's output against the value it must have, and — from the task timings —
    the wall time from ``started`` (epoch seconds) to the last run's end."""
    client = Client(store)
    statuses = [await client.status(i) for i in ids]
    first = await client.tasks(ids[0])
    starts = [t.started_at for t in first if t.started_at is not None]
    ended = max(s.finished_at or s.updated_at for s in statuses)
    n_tasks = sum(s.total for s in statuses)
    if is_foreach(workload, size):  # the foreach task counts its instances
        n_tasks += len(ids) * (shape(workload, size)[0][0] - 1)
    wall = ended - started
    result: dict[str, Any] = {
        "status": sorted({s.status for s in statuses}),
        "tasks": n_tasks,
        "wall_s": round(wall, 4),
        "tasks_per_s": round(n_tasks / wall, 1),
        **await check_outputs(client.store, ids, *final(workload, size)),
        "first_started_at": min(starts) if starts else started,
    }
    if workload == "W2":
        gaps = [
            b.started_at - a.finished_at
            for a, b in itertools.pairwise(first)
            if a.finished_at is not None and b.started_at is not None
        ]
        if len(gaps) > 1:
            result["step_p50_ms"] = round(statistics.median(gaps) * 1000, 3)
            result["step_p95_ms"] = round(statistics.quantiles(gaps, n=20)[-1] * 1000, 3)
    if isinstance(store, str):
        await client.close()
    return result


async def check_outputs(store: Store, ids: list[str], task: str, expected: int) -> dict[str, Any]:
    """The output of ``task`` in the first run, and whether every run's is ``expected``
    (a run that did not complete has none)."""
    client = Client(store)
    values = []
    for workflow_id in ids:
        try:
            values.append(await client.output(workflow_id, task))
        except UsageError:  # not completed: no output
            values.append(None)
    return {
        "result": values[0],
        "expected": expected,
        "result_ok": all(v == expected for v in values),
    }


def _peak_rss_mb() -> float:
    """This process's peak resident memory so far (VmHWM), in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
