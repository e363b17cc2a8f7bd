"""The benchmark suite runs (in its tiny size): CI proves it works, it does not time it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.postgres import Cluster

ROOT = Path(__file__).resolve().parents[2]


def _bench(*args: str, timeout: float) -> tuple[str, list[dict[str, Any]]]:
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--sizes", "tiny", "--runs", "1", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return done.stdout, lines


@pytest.mark.timeout(180)
def test_benchmark_suite_runs_every_workload_in_both_modes() -> None:
    stdout, lines = _bench("--modes", "inproc,multiproc", timeout=170)
    assert {(r["workload"], r["mode"]) for r in lines} == {
        (w, m) for w in ("W1", "W2", "W3", "W4") for m in ("inproc", "multiproc")
    }
    assert all(r["status"] == ["completed"] and r["tasks_per_s"] > 0 for r in lines)
    chain = next(r for r in lines if r["workload"] == "W2" and r["mode"] == "inproc")
    assert chain["step_p95_ms"] >= chain["step_p50_ms"] > 0
    assert all("ops_per_task" in r for r in lines if r["mode"] == "inproc")
    assert "dagq benchmark" in stdout


@pytest.mark.timeout(180)
def test_benchmark_azure_mode_counts_storage_transactions(azurite: object) -> None:
    stdout, lines = _bench("--workloads", "W1", "--stores", "azure", timeout=170)
    [run] = lines
    assert (run["store"], run["status"], run["tasks"]) == ("azure", ["completed"], 52)
    assert 0 < run["transactions_per_task"] < 5
    # Tasks sent together go out bundled: far fewer queue messages than tasks.
    assert 0 < run["transactions"]["queue.send"] < 52
    assert "tx/task" in stdout


@pytest.mark.timeout(240)
def test_the_server_benchmark_runs() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.server",
            "--tasks",
            "20",
            "--rows",
            "200",
            "--requests",
            "3",
            "--steps",
            "3",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=230,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.splitlines()[0])
    assert result["rows"] == 200 and result["tasks"] == 22
    assert result["status_p50_ms"] > 0 and result["list_p50_ms"] > 0
    assert result["sse_history_events"] >= 3 and result["sse_rows_events"] >= 1
    assert "dagq server benchmark" in done.stdout


@pytest.mark.timeout(180)
def test_benchmark_runs_with_telemetry_off_and_on() -> None:
    _, lines = _bench("--workloads", "W1,W2", "--telemetry", "off,on", timeout=170)
    assert {(r["workload"], r["telemetry"]) for r in lines} == {
        (w, t) for w in ("W1", "W2") for t in (False, True)
    }
    assert all(r["status"] == ["completed"] and r["cpu_s"] > 0 for r in lines)


@pytest.mark.timeout(180)
def test_benchmark_postgres_mode_runs_with_a_transaction_held_open(
    postgres_cluster: Cluster,
) -> None:
    args = ["--sizes", "tiny", "--runs", "1", "--workloads", "W2", "--stores", "postgres"]
    done = subprocess.run(
        [sys.executable, "-m", "bench", *args, "--modes", "multiproc", "--hold-transaction"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=170,
        check=False,
        env={**os.environ, "DAGQ_BENCH_POSTGRES": postgres_cluster.url},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    [run] = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert (run["store"], run["status"]) == ("postgres+held-xact", ["completed"])
    assert run["step_p95_ms"] >= run["step_p50_ms"] > 0
