"""``python -m bench``: run the workloads, print one JSON line per run and a summary.

    python -m bench                          # W1-W4, size 'small', in-process, 3 runs each
    python -m bench --sizes small,full --modes inproc,multiproc
    python -m bench --sizes tiny --runs 1    # what CI runs: proves the suite works

Each run is a fresh process (``bench.run_one``); the summary shows medians.
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

from bench.workloads import SIZES

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
        "--sizes", default="small", help="tiny, small, full, huge (comma-separated)"
    )
    parser.add_argument("--modes", default="inproc", help="inproc, multiproc (comma-separated)")
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
    summaries = []
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
    _table(summaries, args.runs)


def _all(args: argparse.Namespace, summaries: list[Any]) -> None:
    for workload in args.workloads.split(","):
        for size in args.sizes.split(","):
            if size not in SIZES[workload]:
                raise SystemExit(f"unknown size {size!r} for {workload}: {sorted(SIZES[workload])}")
            for store in args.stores.split(","):
                for mode in args.modes.split(","):
                    for telemetry in args.telemetry.split(","):
                        summaries.append(
                            _runs(workload, size, mode, store, args, telemetry=telemetry)
                        )


def _runs(
    workload: str, size: str, mode: str, store: str, args: argparse.Namespace, *, telemetry: str
) -> Any:
    results = []
    for _ in range(args.runs):
        result = run_once(
            workload,
            size,
            mode,
            args.workers,
            store,
            telemetry=telemetry == "on",
            hold=args.hold_transaction,
        )
        print(json.dumps(result), flush=True)
        if result["status"] != ["completed"]:
            raise SystemExit(
                f"{workload} {size} {mode} {store} did not complete: {result['status']}"
            )
        results.append(result)
    return median_of(results)


def _table(summaries: list[dict[str, Any]], runs: int) -> None:
    table = Table(title=f"dagq benchmark (median of {runs})", title_justify="left")
    for column in (
        "workload",
        "size",
        "store",
        "mode",
        "telemetry",
        "tasks",
        "wall s",
        "tasks/s",
        "step p50/p95 ms",
        "peak RSS MB*",
        "state KB",
        "ops/task",
        "tx/task",
        "lag max/p99 ms",
    ):
        table.add_column(column, justify="right" if column not in ("workload", "mode") else "left")
    for s in summaries:
        step = f"{s['step_p50_ms']:.2f}/{s['step_p95_ms']:.2f}" if "step_p50_ms" in s else "-"
        lag = (
            f"{s['loop_lag_max_ms']:.1f}/{s['loop_lag_p99_ms']:.1f}"
            if "loop_lag_max_ms" in s
            else "-"
        )
        rss = "/".join(f"{v:.0f}" for v in s["peak_rss_mb"].values())
        table.add_row(
            s["workload"],
            s["size"],
            s.get("store", "sqlite"),
            s["mode"],
            "on" if s.get("telemetry") else "off",
            f"{s['tasks']:,}",
            f"{s['wall_s']:.3f}",
            f"{s['tasks_per_s']:,.0f}",
            step,
            rss,
            f"{s['state_bytes'] / 1024:.1f}",
            str(s.get("ops_per_task", "-")),
            str(s.get("transactions_per_task", "-")),
            lag,
        )
    console = Console(width=max(Console().width, 130))
    console.print(table)
    console.print("* in-process: the one process; multi-process: coordinator/worker-1/worker-2")


if __name__ == "__main__":
    main()
