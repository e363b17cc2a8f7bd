"""``python -m bench``: run the workloads, print one JSON line per run and a summary.

    python -m bench                          # W1-W4, size 'small', every mode, 3 runs each
    python -m bench --peers dbos             # and the same workloads on DBOS, side by side
    python -m bench --sizes small,full --modes client,multiproc
    python -m bench --sizes tiny --runs 1    # what CI runs: proves the suite works

Modes: run (``dagq run FILE`` as typed, default options), client (the public Client
with a coordinator and worker in-process), multiproc (``dagq coordinator`` and two
``dagq worker`` processes: the cluster), inproc (internal calls: the fast path, not a
user's). Each run is a fresh process (``bench.run_one``); the summary shows medians,
and each run's final value is checked.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench import peers
from bench.workloads import shape

#: How each mode is labelled in the table.
LABELS = {"run": "dagq run", "client": "Client", "multiproc": "cluster", "inproc": "internal"}
#: Why a workload is not measured in a mode.
NOT_MEASURED = {
    ("W4", "run"): "dagq run runs one workflow; 200 at once is a cluster's (or a Client's) shape",
}

ROOT = Path(__file__).resolve().parent.parent


def run_once(
    workload: str,
    size: str,
    mode: str,
    workers: int,
    store: str,
    *,
    telemetry: bool = False,
    hold: bool = False,
) -> dict[str, Any]:
    """One run in a fresh process; its JSON result."""
    command = [
        sys.executable,
        "-m",
        "bench.run_one",
        workload,
        size,
        mode,
        "--workers",
        str(workers),
        "--store",
        store,
        *(["--telemetry"] if telemetry else []),
        *(["--hold-transaction"] if hold else []),
    ]
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, check=False, timeout=1800
    )
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def median_of(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of each figure over the runs (the run with the median wall time for the rest)."""
    ordered = sorted(results, key=lambda r: r["wall_s"])
    summary = dict(ordered[len(ordered) // 2])
    for key in (
        "wall_s",
        "tasks_per_s",
        "step_p50_ms",
        "step_p95_ms",
        "ops_per_task",
        "state_bytes",
        "loop_lag_max_ms",
        "loop_lag_p99_ms",
        "cpu_s",
        "helper_cpu_s",
        "tree_cpu_s",
        "tree_cpu_us_per_task",
        "cpu_ms_per_task",
        "startup_s",
        "run_s",
        "teardown_s",
        "waited_s",
    ):
        values = [r[key] for r in results if key in r]
        if values:
            summary[key] = statistics.median(values)
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--workloads", default="W1,W2,W3,W4")
    parser.add_argument(
        "--sizes",
        default="small",
        help="tiny, small, full, huge, scale, or n=COUNT (W1, W2, W4; comma-separated)",
    )
    parser.add_argument(
        "--modes",
        default="run,client,multiproc,inproc",
        help="run, client, multiproc, inproc (comma-separated)",
    )
    parser.add_argument(
        "--peers",
        default="",
        help="dbos: the same workloads on DBOS (SQLite), in a virtual environment of its own",
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument(
        "--stores",
        default="sqlite",
        help="sqlite, azure (Azurite), postgres (a throw-away cluster; comma-separated)",
    )
    parser.add_argument(
        "--hold-transaction",
        action="store_true",
        help="postgres: a transaction held open elsewhere for each whole run",
    )
    parser.add_argument(
        "--telemetry",
        default="off",
        help="off, on, or off,on (each run with traces and metrics off / on; needs dagq[otel])",
    )
    args = parser.parse_args()
    for peer in filter(None, args.peers.split(",")):
        if peer not in peers.REQUIREMENTS:
            parser.error(
                f"unknown peer {peer!r} in --peers (known: {', '.join(peers.REQUIREMENTS)})"
            )
    summaries: list[dict[str, Any]] = []
    cluster = None
    if "postgres" in args.stores.split(",") and not os.environ.get("DAGQ_BENCH_POSTGRES"):
        from tests.postgres import start

        cluster = start()  # one throw-away cluster for every run; each has its own schema
        os.environ["DAGQ_BENCH_POSTGRES"] = cluster.url
    try:
        _all(args, summaries)
    finally:
        if cluster is not None:
            cluster.stop()
    notes = []
    for peer in filter(None, args.peers.split(",")):
        found, note = peers.measure(
            peer,
            workloads=args.workloads.split(","),
            sizes=args.sizes.split(","),
            runs=args.runs,
            workers=args.workers,
            summarise=median_of,
        )
        summaries += found
        if note:
            notes.append(note)
            print(note, flush=True)
    _table(summaries, args.runs, notes)


def _all(args: argparse.Namespace, summaries: list[Any]) -> None:
    for workload in args.workloads.split(","):
        for size in args.sizes.split(","):
            try:
                shape(workload, size)
            except ValueError as e:
                print(f"error: {e}", file=sys.stderr)
                raise SystemExit(2) from None
            for store in args.stores.split(","):
                for mode in args.modes.split(","):
                    why = NOT_MEASURED.get((workload, mode))
                    if mode == "run" and store != "sqlite":
                        why = "dagq run is measured with its default store, sqlite"
                    if why:
                        print(
                            f"{workload} {LABELS[mode]} {store}: not measured ({why})", flush=True
                        )
                        continue
                    summaries += _runs(
                        workload, size, mode, store, args, telemetry=args.telemetry.split(",")
                    )


def _runs(
    workload: str,
    size: str,
    mode: str,
    store: str,
    args: argparse.Namespace,
    *,
    telemetry: list[str],
) -> list[Any]:
    """The median of ``args.runs`` runs for each telemetry setting; the settings take
    turns (off, on, off, on, ...) so that a change in the machine's load falls on both."""
    results: dict[str, list[dict[str, Any]]] = {t: [] for t in telemetry}
    for _ in range(args.runs):
        for setting in telemetry:
            result = run_once(
                workload,
                size,
                mode,
                args.workers,
                store,
                telemetry=setting == "on",
                hold=args.hold_transaction,
            )
            print(json.dumps(result), flush=True)
            if result["status"] != ["completed"]:
                raise SystemExit(
                    f"{workload} {size} {mode} {store} did not complete: {result['status']}"
                )
            if not result.get("result_ok"):
                raise SystemExit(
                    f"{workload} {size} {mode} {store}: the final output is "
                    f"{result.get('result')!r}, not {result.get('expected')!r}"
                )
            results[setting].append(result)
    return [median_of(found) for found in results.values()]


def _table(summaries: list[dict[str, Any]], runs: int, notes: list[str]) -> None:
    columns = (
        "workload",
        "size",
        "store",
        "mode",
        "telemetry",
        "slots",
        "tasks",
        "start-up s",
        "wall s",
        "tasks/s",
        "vs peer",
        "step p50/p95 ms",
        "result",
        "peak RSS MB*",
        "state KB",
        "ops/task",
        "tx/task",
        "lag max/p99 ms",
        "CPU µs/task†",
    )
    rows = [_row(s, summaries) for s in summaries]
    # A column no run has a figure for (telemetry all off, no peer, ...) is left out.
    shown = [i for i in range(len(columns)) if any(row[i] not in ("-", "off") for row in rows)]
    table = Table(title=f"dagq benchmark (median of {runs})", title_justify="left")
    for i in shown:
        table.add_column(columns[i], justify="left" if i in (0, 3) else "right")
    for row in rows:
        table.add_row(*(row[i] for i in shown))
    console = Console(width=max(Console().width, 200))
    console.print(table)
    console.print(
        "wall: from the first submit to the last run's end (dagq run: from launch to exit,"
        " start-up and teardown included; its tasks/s counts from the first task started"
        " to the run's end)"
    )
    console.print("vs peer: tasks/s against the peer's on the same workload, same run")
    console.print(
        "* client, internal: the one process; dagq run: its largest process;"
        " cluster: coordinator/worker-1/worker-2"
    )
    console.print(
        "† CPU of every process of the run (the benchmark, dagq run or the cluster's"
        " processes, pool processes, span-exporting helpers), start-up included, per task"
    )
    for note in notes:
        print(note)


def _row(s: dict[str, Any], summaries: list[dict[str, Any]]) -> tuple[str, ...]:
    peer_rate = {
        (p["workload"], p["size"]): p["tasks_per_s"] for p in summaries if p["mode"] == "peer"
    }
    step = f"{s['step_p50_ms']:.2f}/{s['step_p95_ms']:.2f}" if "step_p50_ms" in s else "-"
    lag = (
        f"{s['loop_lag_max_ms']:.1f}/{s['loop_lag_p99_ms']:.1f}" if "loop_lag_max_ms" in s else "-"
    )
    rss = "/".join(f"{v:.0f}" for v in s.get("peak_rss_mb", {}).values()) or "-"
    versus = peer_rate.get((s["workload"], s["size"]))
    peer = s["mode"] == "peer"
    return (
        s["workload"],
        s["size"],
        s.get("store", "sqlite"),
        f"{s['peer']} {s.get('version', '')} (peer)" if peer else LABELS[s["mode"]],
        "on" if s.get("telemetry") else "off",
        str(s.get("slots", "-")),
        f"{s['tasks']:,}",
        f"{s['startup_s']:.2f}" if "startup_s" in s else "-",
        f"{s['wall_s']:.3f}",
        f"{s['tasks_per_s']:,.0f}",
        f"{s['tasks_per_s'] / versus:.2f}x" if versus and not peer else "-",
        step,
        "ok" if s.get("result_ok") else "WRONG",
        rss,
        f"{s['state_bytes'] / 1024:.1f}" if "state_bytes" in s else "-",
        str(s.get("ops_per_task", "-")),
        str(s.get("transactions_per_task", "-")),
        lag,
        f"{s['tree_cpu_us_per_task']:,.0f}" if "tree_cpu_us_per_task" in s else "-",
    )


if __name__ == "__main__":
    main()
