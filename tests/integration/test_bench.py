"""The benchmark suite runs (in its tiny size): CI proves it works, it does not time it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.postgres import Cluster

ROOT = Path(__file__).resolve().parents[2]
TINY = ("--sizes", "tiny", "--runs", "1")


def _python_m(
    *argv: str, timeout: float, cwd: Path = ROOT, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m ARGV...`` (a benchmark module), its output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=env,
    )


def _bench(*args: str, timeout: float) -> tuple[str, list[dict[str, Any]]]:
    done = _python_m("bench", "--sizes", "tiny", "--runs", "1", *args, timeout=timeout)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return done.stdout, lines


@pytest.mark.timeout(480)
def test_benchmark_suite_runs_every_workload_in_every_mode_and_checks_the_data_flowed() -> None:
    stdout, lines = _bench(timeout=470)  # the default modes: run, client, multiproc, inproc
    measured = {(r["workload"], r["mode"]) for r in lines}
    assert measured == {
        (w, m)
        for w in ("W1", "W2", "W3", "W4")
        for m in ("run", "client", "multiproc", "inproc")
        if (w, m) != ("W4", "run")
    }
    assert "W4 dagq run sqlite: not measured" in stdout
    assert all(r["status"] == ["completed"] and r["tasks_per_s"] > 0 for r in lines)
    # Every task consumed its parents' outputs: the final values prove it, in every mode.
    expected = {"W1": 2 * 50, "W2": 20, "W3": 10**2, "W4": 5}
    for r in lines:
        assert (r["result"], r["expected"], r["result_ok"]) == (
            expected[r["workload"]],
            expected[r["workload"]],
            True,
        ), r
    for r in (r for r in lines if r["mode"] == "run"):  # dagq run FILE, as a user types it
        assert r["exit_code"] == 0 and r["slots"] == 4  # its default options
        assert 0 < r["startup_s"] < r["wall_s"] and r["run_s"] > 0
    for r in (r for r in lines if r["mode"] == "multiproc"):
        assert r["startup_s"] > 0 and set(r["peak_rss_mb"]) == {
            "coordinator",
            "worker-1",
            "worker-2",
        }
    chains = [r for r in lines if r["workload"] == "W2"]
    assert all(r["step_p95_ms"] >= r["step_p50_ms"] > 0 for r in chains)
    assert all("ops_per_task" in r for r in lines if r["mode"] == "inproc")
    assert "dagq benchmark" in stdout
    for label in ("dagq run", "Client", "cluster", "internal"):
        assert f" {label} " in stdout


@pytest.mark.timeout(300)
def test_the_medians_of_several_runs_of_every_mode_are_summed_up() -> None:
    # Every figure of a JSON line is summarised over the runs (a per-process dict made
    # the summary fail once several runs of the cluster were asked for).
    stdout, lines = _bench("--workloads", "W2", "--runs", "2", timeout=290)
    assert len(lines) == 2 * 4  # two runs of each default mode
    assert all(r["result_ok"] for r in lines)
    assert " cluster " in stdout  # the summary table was printed


@pytest.mark.timeout(120)
def test_a_size_may_be_given_as_a_count() -> None:
    """``n=COUNT``: W4's number of workflows (W1's width, W2's length); the final value
    of each is checked as for a named size. A count where none applies is refused."""
    done = _python_m("bench.run_one", "W4", "n=3", "inproc", timeout=100)
    assert done.returncode == 0, done.stderr[-2000:]
    line = json.loads(done.stdout.splitlines()[-1])
    assert (line["workflows"], line["tasks"], line["result_ok"]) == (3, 15, True)
    assert line["peak_rss_mb"]["process"] <= line["peak_rss_checked_mb"]
    for workload, size, why in [
        ("W3", "n=5", "unknown size 'n=5' for W3: full, huge, small, tiny"),
        ("W1", "n=0", "size 'n=0' for W1: COUNT must be a whole number >= 1"),
    ]:
        refused = _python_m("bench", "--workloads", workload, "--sizes", size, timeout=50)
        assert refused.returncode == 2
        assert refused.stderr.strip() == f"error: {why}"


@pytest.mark.timeout(240)
def test_w1_may_fan_out_as_a_foreach() -> None:
    """``foreach=COUNT`` (and ``scale``: a million) is W1 as users write a wide fan-out:
    root -> one foreach task -> join, each instance counted as a task, the join's sum
    checked as for the static fan-out."""
    for mode in ("inproc", "client"):
        done = _python_m("bench.run_one", "W1", "foreach=40", mode, timeout=100)
        assert done.returncode == 0, done.stderr[-2000:]
        line = json.loads(done.stdout.splitlines()[-1])
        assert (line["tasks"], line["result"], line["result_ok"]) == (42, 80, True), mode
    refused = _python_m("bench", "--workloads", "W2", "--sizes", "foreach=3", timeout=50)
    assert refused.returncode == 2
    assert (
        refused.stderr.strip()
        == "error: unknown size 'foreach=3' for W2: full, huge, small, tiny or n=COUNT"
    )


@pytest.mark.timeout(120)
def test_a_run_whose_data_did_not_flow_fails_the_suite(tmp_path: Path) -> None:
    """The check can fail: with tasks that ignore their inputs, the final value is wrong
    and the suite says so (exit != 0), naming the value it got and the one it expected."""
    bench = tmp_path / "bench"
    shutil.copytree(ROOT / "bench", bench, ignore=shutil.ignore_patterns("__pycache__"))
    tasks = bench / "tasks.py"
    tasks.write_text(tasks.read_text().replace("return sum(inputs.values()) + 1", "return 1"))
    done = _python_m(
        "bench",
        *TINY,
        "--workloads",
        "W2",
        "--modes",
        "client",
        timeout=110,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    assert done.returncode != 0
    assert "W2 tiny client sqlite: the final output is 1, not 20" in done.stderr


@pytest.mark.timeout(120)
def test_an_unavailable_peer_is_one_line_and_the_dagq_rows_still_come(tmp_path: Path) -> None:
    """A peer that cannot be installed (here: a venv directory that cannot be made) is
    said in one line; the suite still measures dagq and exits 0."""
    peer = ("--peers", "dbos")
    (tmp_path / "peers").write_text("a file where the peers' directory should be")
    done = _python_m(
        "bench",
        *TINY,
        *("--workloads", "W2", "--modes", "inproc"),
        *peer,
        timeout=110,
        env={**os.environ, "DAGQ_BENCH_PEERS": str(tmp_path / "peers")},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    # Said as it happens, and again under the table.
    [note] = {x.strip() for x in done.stdout.splitlines() if x.startswith("peer dbos:")}
    assert "not measured" in note and "venv" in note
    [run] = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert (run["workload"], run["mode"], run["result_ok"]) == ("W2", "inproc", True)


@pytest.mark.timeout(60)
def test_an_unknown_peer_is_refused() -> None:
    done = _python_m("bench", "--sizes", "tiny", "--peers", "celery", timeout=50)
    assert done.returncode == 2
    assert "error: unknown peer 'celery' in --peers (known: dbos)" in done.stderr


@pytest.mark.timeout(180)
def test_benchmark_azure_mode_counts_storage_transactions(azurite: object) -> None:
    stdout, lines = _bench(
        "--workloads", "W1", "--stores", "azure", "--modes", "inproc", timeout=170
    )
    [run] = lines
    assert (run["store"], run["status"], run["tasks"]) == ("azure", ["completed"], 52)
    assert 0 < run["transactions_per_task"] < 5
    # Tasks sent together go out bundled: far fewer queue messages than tasks.
    assert 0 < run["transactions"]["queue.send"] < 52
    assert "tx/task" in stdout


@pytest.mark.timeout(180)
def test_the_request_cost_benchmark_measures_every_kind(azurite: object) -> None:
    done = _python_m("bench.request_cost", "--requests", "20", timeout=170)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    kinds = {row["kind"] for row in rows}
    assert {"blob.put", "table.batch of 3, SDK", "table.batch of 3, dagq"} <= kinds
    assert [row["in_flight"] for row in rows] == [16] * len(kinds) + [1] * len(kinds)
    assert all(row["client_cpu_ms"] > 0 and row["requests_per_s"] > 0 for row in rows)


@pytest.mark.timeout(240)
def test_the_server_benchmark_runs() -> None:
    done = _python_m(
        "bench.server",
        *("--tasks", "20", "--rows", "200", "--requests", "3", "--steps", "3"),
        timeout=230,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.splitlines()[0])
    assert result["rows"] == 200 and result["tasks"] == 22
    assert result["status_p50_ms"] > 0 and result["list_p50_ms"] > 0
    assert result["sse_history_events"] >= 3 and result["sse_rows_events"] >= 1
    assert "dagq server benchmark" in done.stdout


@pytest.mark.timeout(120)
def test_the_pool_round_trip_benchmark_runs() -> None:
    done = _python_m(
        "bench.pool_trip", "--tasks", "40", "--slots", "1,2", "--runs", "1", timeout=100
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(r["slots"], r["tasks"]) for r in lines] == [(1, 40), (2, 40)]
    assert all(r["tasks_per_s"] > 0 and r["worker_cpu_us_per_task"] > 0 for r in lines)
    assert all(r["pool_cpu_us_per_task"] > 0 for r in lines)  # the processes' CPU is counted


@pytest.mark.timeout(180)
def test_benchmark_runs_with_telemetry_off_and_on() -> None:
    _, lines = _bench(
        "--workloads", "W1,W2", "--telemetry", "off,on", "--modes", "inproc", "--runs", "2",
        timeout=170,
    )  # fmt: skip
    # Off and on take turns, so that the machine's load changing falls on both.
    assert [(r["workload"], r["telemetry"]) for r in lines] == [
        (w, t) for w in ("W1", "W2") for _ in range(2) for t in (False, True)
    ]
    assert all(r["status"] == ["completed"] and r["cpu_s"] > 0 for r in lines)
    assert all(r["tree_cpu_s"] >= r["cpu_s"] for r in lines)  # the helper's CPU is in it
    assert all(r["helper_cpu_s"] > 0 for r in lines if r["telemetry"])
    # The benchmark process's telemetry (its span helper up) started before the clock.
    assert all(r["telemetry_startup_s"] > 0 for r in lines if r["telemetry"])
    assert not any("telemetry_startup_s" in r for r in lines if not r["telemetry"])


@pytest.mark.timeout(240)
def test_dagq_run_and_the_cluster_run_with_telemetry_on() -> None:
    _, lines = _bench(
        "--workloads", "W1", "--telemetry", "on", "--modes", "run,multiproc", timeout=230
    )
    assert {(r["mode"], r["telemetry"]) for r in lines} == {("run", True), ("multiproc", True)}
    assert all(r["status"] == ["completed"] and r["result_ok"] for r in lines)
    assert all(r["tree_cpu_us_per_task"] > 0 for r in lines)
    # dagq run's wall time (launch to exit) is its start-up, its run (from the first task
    # started to the run's end: its tasks/s) and its teardown, each reported.
    for r in (r for r in lines if r["mode"] == "run"):
        assert r["run_s"] > 0 and r["teardown_s"] >= 0 and r["startup_s"] > 0
        assert abs(r["startup_s"] + r["run_s"] + r["teardown_s"] - r["wall_s"]) < 0.01
        assert r["tasks_per_s"] == pytest.approx(r["tasks"] / r["run_s"], rel=0.01)
        # Its tree's CPU by part, sampled from /proc while it ran: its span helper too.
        whole = r["cpu_by_part_total_us_per_task"]
        assert whole["main thread"] > 0 and whole["span helper"] > 0
        assert set(r["cpu_by_part_us_per_task"]) <= set(whole)
    # dagq run starts its own telemetry (its start-up is in start-up s); the benchmark
    # process, submitting to the cluster, starts its own before the clock.
    assert all(("telemetry_startup_s" in r) == (r["mode"] == "multiproc") for r in lines)


@pytest.mark.timeout(180)
def test_benchmark_postgres_mode_runs_with_a_transaction_held_open(
    postgres_cluster: Cluster,
) -> None:
    args = ["--sizes", "tiny", "--runs", "1", "--workloads", "W2", "--stores", "postgres"]
    done = _python_m(
        "bench",
        *args,
        *("--modes", "multiproc", "--hold-transaction"),
        timeout=170,
        env={**os.environ, "DAGQ_BENCH_POSTGRES": postgres_cluster.url},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    [run] = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert (run["store"], run["status"]) == ("postgres+held-xact", ["completed"])
    assert run["step_p95_ms"] >= run["step_p50_ms"] > 0


def _peer_installed() -> bool:
    base = Path(os.environ.get("DAGQ_BENCH_PEERS") or Path.home() / ".cache" / "dagq-bench")
    return any((base / "dbos-venv" / "lib").glob("python*/site-packages/dbos/__init__.py"))


@pytest.mark.timeout(180)
@pytest.mark.skipif(
    not _peer_installed(), reason="DBOS's venv is not made (python -m bench --peers dbos makes it)"
)
def test_the_dbos_peer_runs_the_same_workloads_side_by_side() -> None:
    """Not on CI (installing DBOS from PyPI takes a minute and needs the network): where
    `python -m bench --peers dbos` has made its venv, the peer's rows come with the same
    final values, and dagq's rows a ratio to them."""
    stdout, lines = _bench(
        "--workloads", "W2,W4", "--modes", "client", "--peers", "dbos", timeout=170
    )
    peer = {r["workload"]: r for r in lines if r["mode"] == "peer"}
    assert set(peer) == {"W2", "W4"}
    assert [(peer[w]["result"], peer[w]["result_ok"]) for w in ("W2", "W4")] == [
        (20, True),
        (5, True),
    ]
    assert peer["W4"]["tasks"] == 50 and peer["W2"]["version"].startswith("3.")
    assert "(peer)" in stdout and "vs peer" in stdout


@pytest.mark.timeout(120)
def test_the_switch_interval_may_be_set_and_the_handover_benchmark_runs() -> None:
    """``--switch-interval none`` runs the internal path with the interpreter's interval;
    a value that is not positive seconds is refused in one line. The GIL hand-over
    benchmark prints one line per interval and round."""

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return _python_m(*args, timeout=100)

    done = run("bench.run_one", "W1", "tiny", "inproc", "--switch-interval", "none")
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1])["result_ok"] is True
    refused = run("bench.run_one", "W1", "tiny", "inproc", "--switch-interval", "0")
    assert refused.returncode == 2
    assert refused.stderr.strip() == (
        "error: --switch-interval: not a positive number of seconds: '0'"
    )
    handed = run("bench.gil_handover", "--rounds", "1", "--wake-ups", "20")
    assert handed.returncode == 0, handed.stderr[-2000:]
    lines = handed.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "switch interval 5.0 ms",
        "switch interval 1.0 ms",
    ]
    refused = run("bench.gil_handover", "--intervals", "5ms")
    assert (refused.returncode, refused.stderr.strip()) == (
        2,
        "error: --intervals: not seconds: '5ms'",
    )
