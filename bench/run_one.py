"""One benchmark run in a fresh process; prints one JSON line.

    python -m bench.run_one W1 small inproc --workers 16

A fresh process per run keeps peak memory figures honest.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import json
import os
import resource
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench import process_cpu
from bench.callbacks import SlowCallbacks
from bench.loop_lag import LoopLag
from bench.paths import check_outputs, client_inproc, dagq_run, settle
from bench.stalls import StallWatch
from bench.workloads import SIZES, final, sized
from dagq import keys, observability
from dagq.client import Client
from dagq.coordinator import Coordinator
from dagq.definition import WorkflowDef
from dagq.local import LOCAL_COORDINATOR, local_poll_interval
from dagq.persistence import read_state
from dagq.plan import Plan
from dagq.registry import live_workers
from dagq.state import WORKFLOW_TERMINAL, RunState
from dagq.stores import open_store
from dagq.stores.base import Store
from dagq.stores.counting import counted
from dagq.submission import submit
from dagq.views import PlanCache
from dagq.worker import Worker, WorkerOptions

ROOT = Path(__file__).resolve().parent.parent
#: run: ``dagq run FILE`` as typed; client: the public Client with a coordinator and a
#: worker in this process; multiproc: ``dagq coordinator`` and ``dagq worker`` processes
#: (the cluster), submitted to through the Client; inproc: internal calls (the fast path).
MODES = ["run", "client", "multiproc", "inproc"]


async def _submit_all(
    store: Store, definition: WorkflowDef, count: int, coordinator: Coordinator
) -> list[tuple[str, Plan]]:
    submitted = []
    for i in range(count):
        # The coordinator is given the plan, as `dagq run` gives it (no second copy).
        result = await submit(
            store, definition, workflow_id=f"bench-{i}", compiled=coordinator.remember_plan
        )
        submitted.append((result.workflow_id, result.plan))
    return submitted


async def _final_states(store: Store, runs: list[tuple[str, Plan]]) -> list[RunState]:
    states = []
    for workflow_id, plan in runs:
        found = await read_state(store, workflow_id, plan)
        assert found is not None
        states.append(found[0])
    return states


async def inproc(
    definition: WorkflowDef,
    count: int,
    workers: int,
    url: str,
    stalls_ms: float = 0.0,
    *,
    check: tuple[str, int] | None = None,
    switch_interval: float | str | None = "default",
) -> dict[str, Any]:
    """Coordinator and workers in this process through internal calls — the fast path
    ("internal" in the table), not one a user takes (``stalls_ms``: print what the loop
    did during each lag longer than that, :mod:`bench.stalls`; ``check``: the task whose
    output must be this value in every workflow; ``switch_interval``: their
    ``switch_interval_s`` option, "default" for its default)."""
    store, counts = counted(observability.instrument(open_store(url)))
    switching: dict[str, Any] = (
        {} if switch_interval == "default" else {"switch_interval_s": switch_interval}
    )
    coordinator = Coordinator(store, dataclasses.replace(LOCAL_COORDINATOR, **switching))
    worker = Worker(
        store,
        WorkerOptions(
            queues=("default",),
            concurrency=workers,
            import_paths=(str(ROOT),),
            poll_interval_s=local_poll_interval(store),
            **switching,
        ),
    )
    stop = asyncio.Event()
    running = [asyncio.create_task(coordinator.run(stop)), asyncio.create_task(worker.run(stop))]
    sampling = observability.watching(store, coordinator=coordinator, queues=("default",))
    await sampling.__aenter__()
    started = time.perf_counter()
    cpu_started, server_started = time.process_time(), process_cpu.server_cpu()
    runs = await _submit_all(store, definition, count, coordinator)
    # The run's loop lag: submitting (validating, compiling in the client) is not the run.
    watch = StallWatch(0.005) if stalls_ms else None
    if watch is not None:
        watch.start()
    meter = SlowCallbacks.current
    if meter is not None:
        meter.armed = True
    async with LoopLag(0.005, on_tick=watch.beat if watch else None) as lag:
        pending = {wid for wid, _ in runs}
        while pending:
            coordinator.changed.clear()
            settled = [(w, await coordinator.settled_state(w)) for w in pending]
            pending = {w for w, s in settled if s is None or s.status not in WORKFLOW_TERMINAL}
            if pending:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(coordinator.changed.wait(), 0.2)
        wall = time.perf_counter() - started
        cpu, server = time.process_time() - cpu_started, process_cpu.server_cpu()
    run_peak = _peak_rss_mb(os.getpid())  # the checks below read every state again
    if meter is not None:
        meter.armed = False
    if watch is not None:
        watch.stop()
        watch.report(stalls_ms / 1000)
    ops = dict(counts)
    transactions = dict(store.transactions) if store.transactions is not None else None
    await sampling.__aexit__(None, None, None)
    stop.set()
    await asyncio.gather(*running, return_exceptions=True)
    states = await _final_states(store, runs)
    size = len((await store.documents.get(keys.state(runs[0][0]))).data)  # type: ignore[union-attr]
    checked = await check_outputs(store, [w for w, _ in runs], *check) if check else {}
    await store.close()
    peak = {
        "peak_rss_checked_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    }
    result = _result(states, wall, size, {"process": run_peak}, ops=ops, transactions=transactions)
    result |= checked | peak
    # The loop that runs the coordinator and the workers: how long it went without yielding.
    # CPU time of this process (coordinator, worker, exporter threads) over the run:
    # steadier than wall time on a shared machine.
    process_cpu.add_server_cpu(result, cpu, server_started, server)  # the Azurite it started
    result |= {
        "cpu_s": round(cpu, 4),
        "loop_lag_max_ms": lag.max_ms,
        "loop_lag_p99_ms": lag.p99_ms,
        "loop_lag_own_max_ms": lag.own_max_ms,
        "loop_lag_own_p99_ms": lag.own_p99_ms,
        "loop_lag_worst": lag.worst(),
    }
    return result


async def multiproc(
    definition: WorkflowDef,
    count: int,
    workers: int,
    url: str,
    *,
    workload: str,
    size: str,
    profile: str = "",
) -> dict[str, Any]:
    """``dagq coordinator`` and two ``dagq worker`` processes; this process submits and
    waits through the public ``Client``, then checks the final value (:func:`settle`).

    ``profile``: a directory where each process writes its cProfile statistics
    (``coordinator.prof``, ``worker-1.prof``, ...; CPU time of the whole process,
    start-up included; :mod:`bench.profiled`).
    """
    dagq = [str(Path(sys.executable).with_name("dagq"))]
    env = {**os.environ, "DAGQ_STORE": url}
    per_worker = max(1, workers // 2)
    commands = {"coordinator": ["coordinator", "--log-interval", "3600", *metrics_options()]}
    for name in ("worker-1", "worker-2"):
        commands[name] = ["worker", "-c", str(per_worker), "--import-path", str(ROOT)]
        commands[name] += metrics_options()
    if profile:
        Path(profile).mkdir(parents=True, exist_ok=True)
    processes = {
        name: subprocess.Popen(
            [sys.executable, "-m", "bench.profiled", f"{profile}/{name}.prof", "dagq", *cmd]
            if profile
            else dagq + cmd,
            env=env,
            stderr=subprocess.DEVNULL,
        )
        for name, cmd in commands.items()
    }
    store = open_store(url)
    client = Client(store, plans=PlanCache())
    try:
        launched = time.time()
        await _cluster_ready(store, workers=len(processes) - 1, processes=processes)
        server = _server_pids(url)
        cpu_before = _cpu_reading(processes, server)
        started = time.time()
        ids = [(await client.submit(definition, workflow_id=f"bench-{i}")).id for i in range(count)]
        for workflow_id in ids:
            await client.wait(workflow_id, timeout_s=1800)
        waited = time.time()
        cpu_after = _cpu_reading(processes, server | _server_pids(url))
        helpers = {pid for r in cpu_after.values() for pid in r if process_cpu.is_span_helper(pid)}
        rss = {name: _peak_rss_mb(p.pid) for name, p in processes.items()}
        result = await settle(store, ids, workload, size, started=started)
        size_bytes = len((await store.documents.get(keys.state(ids[0]))).data)  # type: ignore[union-attr]
    finally:
        for p in processes.values():
            p.terminate()
        for p in processes.values():
            p.wait(timeout=60)
        await store.close()
    result["waited_s"] = round(waited - started, 4)
    result["startup_s"] = round(started - launched, 4)
    result["state_bytes"] = size_bytes
    result["peak_rss_mb"] = {k: round(v, 1) for k, v in rss.items()}
    result["slots"] = per_worker * 2
    cpu = {k: round(process_cpu.spent(cpu_before[k], v), 3) for k, v in cpu_after.items()}
    result["cpu_by_process_s"] = cpu
    # Each cluster process's CPU by part: itself, its span helper, its pool processes.
    parts: dict[str, float] = {}
    for name, p in processes.items():
        for part, pids in process_cpu.by_part(p.pid, cpu_after[name], helpers).items():
            before = {pid: cpu_before[name].get(pid, 0.0) for pid in pids}
            after = {pid: cpu_after[name][pid] for pid in pids}
            key = f"{name.split('-')[0]}.{part}"
            parts[key] = parts.get(key, 0.0) + process_cpu.spent(before, after)
    result["cpu_by_part_us_per_task"] = {
        k: round(v * 1e6 / result["tasks"], 1) for k, v in parts.items()
    }
    result["cpu_ms_per_task"] = round(sum(cpu.values()) * 1000 / result["tasks"], 3)
    return result


def _server_pids(url: str) -> set[int]:
    """The PostgreSQL server's processes (none for another store)."""
    if not url.startswith("postgres"):
        return set()
    import psycopg

    from dagq.stores.postgres_database import parse_postgres_url

    with psycopg.connect(parse_postgres_url(url).conninfo) as conn:
        return {pid for (pid,) in conn.execute("SELECT pid FROM pg_stat_activity")}


def _cpu_reading(
    processes: dict[str, subprocess.Popen[bytes]], server: set[int]
) -> dict[str, dict[int, float]]:
    """CPU seconds by PID: of each process (with its descendants), of this one (the
    benchmark: submitting, waiting), and of the database server's processes."""
    table = process_cpu.cpu_by_pid()
    reading = {name: process_cpu.tree_cpu(p.pid, table) for name, p in processes.items()}
    reading["bench"] = process_cpu.pids_cpu([os.getpid()], table)
    if server:
        reading["postgres"] = process_cpu.pids_cpu(server, table)
    return reading


async def _cluster_ready(
    store: Store, *, workers: int, processes: dict[str, subprocess.Popen[bytes]]
) -> None:
    """Wait until the coordinator holds its lease and every worker has registered: a
    cluster runs for long, so its start-up is reported apart (``startup_s``)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for name, process in processes.items():
            if process.poll() is not None:
                raise SystemExit(f"{name} exited with code {process.returncode} at start")
        lease = await store.leases.get(keys.COORDINATOR_LEASE)
        live = await live_workers(store.documents, now=time.time())
        if lease is not None and len(live) >= workers:
            return
        await asyncio.sleep(0.02)
    raise SystemExit("the coordinator and workers did not start within 120 s")


def _closed(
    result: dict[str, Any], sink: subprocess.Popen[bytes] | None, tree_started: float
) -> None:
    """Telemetry stopped (what is still buffered goes out, not timed) and the sink with it;
    the CPU figures of the processes in ``result``."""
    if sink is not None:
        helper = _helper_cpu()
        observability.stop()
        if helper is not None:
            result["helper_cpu_s"] = round(helper, 4)
    # This process and every process it waited for (dagq run and its pool processes,
    # a cluster's processes, the span-exporting helpers), start-up included; not the sink.
    # (Less the CPU of the thread that sampled ``dagq run``'s tree, if one did.)
    spent = _tree_cpu() - tree_started - result.get("sampler_cpu_s", 0.0)
    result["tree_cpu_s"] = round(spent, 4)
    result["tree_cpu_us_per_task"] = round(result["tree_cpu_s"] / result["tasks"] * 1e6, 1)
    if sink is not None:
        sink.kill()
        sink.wait()


def _tree_cpu() -> float:
    """CPU seconds of this process and of the children it has waited for."""
    own, children = (
        resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _helper_cpu() -> float | None:
    """CPU seconds of this process's span-exporting helper so far, once it has exported
    what it was given (None without one)."""
    from dagq.observability import tracing

    forwarder = tracing._on.forwarder
    helper = getattr(forwarder, "_helper", None)
    if helper is None:
        return None
    tracing.flush()
    fields = Path(f"/proc/{helper.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _result(
    states: list[RunState],
    wall: float,
    size: int,
    rss: dict[str, float],
    *,
    ops: dict[str, int] | None = None,
    transactions: dict[str, int] | None = None,
) -> dict[str, Any]:
    # A foreach task counts its instances (W1 as a foreach: root, n instances, join).
    n_tasks = sum(s.n_tasks + sum(g.n - 1 for g in s.groups.values()) for s in states)
    result: dict[str, Any] = {
        "status": sorted({s.status for s in states}),
        "tasks": n_tasks,
        "wall_s": round(wall, 4),
        "tasks_per_s": round(n_tasks / wall, 1),
        "state_bytes": size,
        "peak_rss_mb": {k: round(v, 1) for k, v in rss.items()},
    }
    gaps = _step_gaps(states[0])
    if gaps:
        result["step_p50_ms"] = round(statistics.median(gaps) * 1000, 3)
        result["step_p95_ms"] = round(statistics.quantiles(gaps, n=20)[-1] * 1000, 3)
    if ops is not None:
        calls = {k: v for k, v in ops.items() if not k.endswith(":items")}
        result["ops_per_task"] = round(sum(calls.values()) / n_tasks, 2)
        result["ops"] = dict(sorted(ops.items()))
    if transactions:  # what a paying store bills: every request, by kind
        result["transactions_per_task"] = round(sum(transactions.values()) / n_tasks, 2)
        result["transactions"] = dict(sorted(transactions.items()))
    return result


def _step_gaps(st: RunState) -> list[float]:
    """For a chain: time from one step's end to the next step's start."""
    ends, starts = st.task_finished_at, st.started_at
    return [starts[i + 1] - ends[i] for i in range(len(ends) - 1) if starts[i + 1] >= ends[i] >= 0]


def _telemetry(here: bool) -> tuple[subprocess.Popen[bytes], float | None]:
    """Turn traces and metrics on, as ``OTEL_EXPORTER_OTLP_ENDPOINT`` and
    ``--metrics-port`` would (child processes inherit the endpoint; the ``dagq``
    processes get a ``--metrics-port`` each); in this process too if ``here`` (it runs
    the coordinator and worker, or submits). The sink, and this process's telemetry
    start-up in seconds (None if not ``here``): importing the SDK and prometheus-client,
    and its span helper up (its own imports done, ~0.3 s of CPU) — before the clock, as
    a service starts its telemetry once at its start and a cluster's processes are up
    before the clock (``startup_s``)."""
    sink = subprocess.Popen(
        [sys.executable, "-m", "bench.otlp_sink"], cwd=ROOT, stdout=subprocess.PIPE
    )
    assert sink.stdout is not None
    port = int(sink.stdout.readline())
    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{port}"
    if not here:
        return sink, None
    began = time.perf_counter()
    observability.start("bench", free_port())
    from dagq.observability import tracing

    tracing.flush()  # returns once the helper has answered: its imports are done
    return sink, time.perf_counter() - began


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def metrics_options() -> list[str]:
    """``--metrics-port PORT`` for a ``dagq`` process when telemetry is on, else none."""
    if not os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return []
    return ["--metrics-port", str(free_port())]


@contextlib.contextmanager
def postgres_server() -> Iterator[str]:
    """The server URL of ``DAGQ_BENCH_POSTGRES``, else of a throw-away cluster."""
    given = os.environ.get("DAGQ_BENCH_POSTGRES")
    if given:
        yield given
        return
    from tests.postgres import start

    cluster = start()
    try:
        yield cluster.url
    finally:
        cluster.stop()


@contextlib.contextmanager
def held_transaction(server: str, hold: bool) -> Iterator[None]:
    """With ``hold``, a transaction that has taken a snapshot stays open meanwhile: the
    oldest xmin stops, and vacuum can remove no dead row for the whole run."""
    if not hold:
        yield
        return
    import psycopg

    with psycopg.connect(server) as conn:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        conn.execute("SELECT txid_current(), count(*) FROM pg_class").fetchone()
        yield
        conn.rollback()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("workload", choices=sorted(SIZES))
    parser.add_argument("size")
    parser.add_argument("mode", choices=MODES)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--store", choices=["sqlite", "azure", "postgres"], default="sqlite")
    parser.add_argument(
        "--hold-transaction",
        action="store_true",
        help="postgres: keep a transaction (and its snapshot) open elsewhere for the whole run",
    )
    parser.add_argument(
        "--profile",
        default="",
        metavar="DIR",
        help="multiproc: each process writes its cProfile statistics to DIR/NAME.prof",
    )
    parser.add_argument(
        "--telemetry",
        action="store_true",
        help="traces (OTLP/HTTP to a sink on 127.0.0.1) and metrics (/metrics) on",
    )
    parser.add_argument(
        "--stalls",
        type=float,
        default=0.0,
        metavar="MS",
        help="in-process: print what the loop ran during each lag over MS (to stderr)",
    )
    parser.add_argument(
        "--switch-interval",
        default="default",
        metavar="S",
        help="in-process: the coordinator's and worker's switch_interval_s (seconds, or "
        "'none': the interpreter's own 5 ms; default: the engine's default)",
    )
    parser.add_argument(
        "--slow-callbacks",
        type=float,
        default=0.0,
        metavar="MS",
        help="print the callbacks that ran over MS of the loop thread's CPU (to stderr)",
    )
    args = parser.parse_args()
    try:
        build, count = sized(args.workload, args.size)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    definition = build()
    tree_started = _tree_cpu()
    sink, telemetry_startup = _telemetry(args.mode != "run") if args.telemetry else (None, None)
    where = {"workload": args.workload, "size": args.size}
    if args.mode == "inproc":
        check = final(args.workload, args.size)
        body: Any = functools.partial(
            inproc,
            stalls_ms=args.stalls,
            check=check,
            switch_interval=_switch_interval(args.switch_interval),
        )
    elif args.mode == "client":
        body = lambda _d, _c, workers, url: client_inproc(  # noqa: E731
            args.workload, args.size, workers, url
        )
    else:
        body = functools.partial(multiproc, **where, profile=args.profile)
    if args.mode == "run":
        if args.store != "sqlite":
            raise SystemExit("error: mode 'run' runs dagq run with its default store (sqlite)")
        result = dagq_run(args.workload, args.size, options=metrics_options())
    elif args.slow_callbacks:
        meter = SlowCallbacks(args.slow_callbacks / 1000)
        with meter.installed():
            result = _with_store(args, body, definition, count)
        meter.report()
        result["loop_cpu_max_ms"] = round(meter.iteration_cpu_max_s * 1000, 2)
    else:
        result = _with_store(args, body, definition, count)
    _closed(result, sink, tree_started)
    if telemetry_startup is not None:
        result["telemetry_startup_s"] = round(telemetry_startup, 4)
    result.setdefault("slots", args.workers)
    chain = args.workload == "W2"
    if not chain:
        result.pop("step_p50_ms", None)
        result.pop("step_p95_ms", None)
    print(
        json.dumps(
            {
                "workload": args.workload,
                "size": args.size,
                "mode": args.mode,
                "store": args.store + ("+held-xact" if args.hold_transaction else ""),
                "workflows": count,
                "telemetry": args.telemetry,
                **result,
            }
        )
    )


def _switch_interval(given: str) -> float | str | None:
    """``--switch-interval``: seconds, None for 'none', or "default"; exit 2 otherwise."""
    if given in ("default", "none"):
        return None if given == "none" else given
    try:
        seconds = float(given)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        print(
            f"error: --switch-interval: not a positive number of seconds: {given!r}",
            file=sys.stderr,
        )
        raise SystemExit(2)
    return seconds


def _with_store(args: argparse.Namespace, body: Any, definition: WorkflowDef, count: int) -> Any:
    """``body`` run on a fresh store of the kind asked for; its result."""
    with tempfile.TemporaryDirectory(prefix="dagq-bench-") as tmp:
        if args.store == "azure":
            from tests.azurite import Azurite, start

            from dagq.stores.azure_auth import CONNECTION_STRING_VARIABLE

            # An account named by AZURE_STORAGE_CONNECTION_STRING (an emulator on other
            # ports, say) is used as it is; else Azurite on its usual ports.
            emulator = (
                Azurite(None, None) if os.environ.get(CONNECTION_STRING_VARIABLE) else start()
            )
            if emulator.process is not None:  # its CPU is the run's: reported apart
                os.environ[process_cpu.SERVER_PID] = str(emulator.process.pid)
            try:
                url = f"azure://devstoreaccount1/b{secrets.token_hex(6)}"
                result = asyncio.run(body(definition, count, args.workers, url))
            finally:
                os.environ.pop(process_cpu.SERVER_PID, None)
                emulator.stop()
        elif args.store == "postgres":
            with postgres_server() as server, held_transaction(server, args.hold_transaction):
                url = f"{server}?schema=b{secrets.token_hex(6)}"
                result = asyncio.run(body(definition, count, args.workers, url))
        else:
            url = f"sqlite:///{Path(tmp) / 'bench.db'}"
            result = asyncio.run(body(definition, count, args.workers, url))
    return result


if __name__ == "__main__":
    main()
