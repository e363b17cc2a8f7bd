"""``dagq workers`` and what ``dagq doctor`` makes of the workers' records, with real
``dagq worker`` and ``dagq coordinator`` processes on a SQLite store."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dagq import keys
from dagq.registry import EXPIRY_BEATS
from dagq.stores.base import Store
from tests.integration.cli_harness import DagqCli, wait_until

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[DagqCli]:
    with DagqCli(tmp_path) as cli:
        cli.with_store(_create)
        yield cli


async def _create(store: Store) -> None:
    """Nothing: opening the store creates it."""


def doctor(cli: DagqCli) -> dict[str, dict[str, str]]:
    """Doctor's findings by check (it exits 1 when something needs a person)."""
    result = cli.run("doctor", "--json")
    return {f["check"]: f for f in json.loads(result.stdout)}


def listed(cli: DagqCli) -> list[dict[str, Any]]:
    workers: list[dict[str, Any]] = cli.json("workers")
    return workers


def record_of(cli: DagqCli, pid: int) -> dict[str, Any] | None:
    return next((w for w in listed(cli) if w["pid"] == pid), None)


def stored_records(cli: DagqCli) -> list[str]:
    return cli.with_store(lambda store: store.documents.list(keys.WORKERS_PREFIX))


def test_a_worker_is_listed_as_it_starts(cli: DagqCli) -> None:
    launched = time.time()
    worker = cli.start("worker", "-q", "cpu", "-q", "gpu", "-c", "3")

    record = wait_until(
        lambda: record_of(cli, worker.pid), timeout_s=10, what="the worker's record"
    )

    # Registered as it started, before taking any work (how soon is the bench's business:
    # a loaded machine may let a heartbeat or two pass before this test reads the record).
    assert launched <= record["started_at"] <= record["last_seen"]
    assert record["queues"] == ["cpu", "gpu"]
    assert record["concurrency"] == 3
    assert record["running"] == 0
    assert record["host"] and record["version"]
    assert record["state"] == "serving"
    assert str(worker.pid) in record["id"]


def test_the_record_names_the_attempts_a_worker_runs(cli: DagqCli) -> None:
    cli.start_coordinator()
    worker = cli.start_worker("--heartbeat", "0.2")
    go = cli.workdir / "go"
    cli.submit_here(
        "busy",
        {
            "name": "b",
            "tasks": [{"name": "hold", "cmd": f"while [ ! -f {go} ]; do sleep 0.05; done"}],
        },
    )

    record = wait_until(
        lambda: (r := record_of(cli, worker.pid)) and r["running"] == 1 and r,
        timeout_s=20,
        what="the worker's record to show its running task",
    )
    go.touch()

    assert record["attempts"] == ["busy/hold/1"]


def test_explain_names_the_worker_of_a_running_task_suspects_one_killed_and_events_tell(
    cli: DagqCli,
) -> None:
    cli.start_coordinator()
    worker = cli.start_worker("--heartbeat", "0.2", "--visibility-timeout", "2")
    go = cli.workdir / "go"
    hold = {"name": "hold", "cmd": f"while [ ! -f {go} ]; do sleep 0.05; done"}
    cli.submit_here("lost", {"name": "l", "tasks": [hold]})

    def waits() -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = cli.json("explain", "lost", "hold")["waiting_for"]
        return found

    try:
        running = wait_until(
            lambda: (w := waits()) and f"pid {worker.pid}" in w[0]["detail"] and w,
            timeout_s=20,
            what="explain to name the worker running the task",
        )
        worker.stop(signal.SIGKILL)
        lost = wait_until(
            lambda: (w := waits()) and w[0]["kind"] == "lost_worker" and w,
            timeout_s=40,
            what="explain to suspect the killed worker",
            interval_s=0.5,
        )
        cli.start_worker("--heartbeat", "0.2")  # takes the message once it is visible again
        redelivered = wait_until(
            lambda: [e for e in cli.json("events", "lost") if e["kind"] == "redelivered"],
            timeout_s=30,
            what="the history to tell of the second delivery",
            interval_s=0.5,
        )
    finally:
        go.touch()  # the task's shell outlives its killed worker

    assert running[0]["kind"] == "worker"
    assert "no live worker reports running it" in lost[0]["detail"]
    assert [(e["task"], e["attempt"]) for e in redelivered] == [("hold", 1)]
    assert "delivery 2" in redelivered[0]["detail"]
    wait_until(
        lambda: cli.workflow_status("lost") == "completed", timeout_s=20, what="the run to end"
    )


def test_a_worker_stopped_cleanly_deletes_its_record(cli: DagqCli) -> None:
    worker = cli.start_worker()
    wait_until(lambda: record_of(cli, worker.pid), timeout_s=10, what="the worker's record")

    assert worker.stop(signal.SIGTERM).code == 0

    assert stored_records(cli) == []
    assert listed(cli) == []


def test_a_killed_worker_is_dropped_after_its_heartbeat_expiry(cli: DagqCli) -> None:
    heartbeat = 0.3
    worker = cli.start_worker("--heartbeat", str(heartbeat))
    record = wait_until(
        lambda: record_of(cli, worker.pid), timeout_s=10, what="the worker's record"
    )

    worker.stop(signal.SIGKILL)
    killed = time.time()
    wait_until(
        lambda: record_of(cli, worker.pid) is None,
        timeout_s=10,
        what="the killed worker to be dropped",
        interval_s=0.1,
    )

    # Gone no sooner than its last heartbeat plus the expiry, and its record with it.
    assert time.time() >= record["last_seen"] + EXPIRY_BEATS * heartbeat
    assert time.time() - killed < EXPIRY_BEATS * heartbeat + 5
    assert stored_records(cli) == []


def test_piped_output_keeps_whole_values(cli: DagqCli) -> None:
    worker = cli.start_worker("-q", "a-rather-long-queue-name-that-a-table-would-cut")
    wait_until(lambda: record_of(cli, worker.pid), timeout_s=10, what="the worker's record")

    result = cli.run("workers", env={"COLUMNS": "40"})

    assert result.code == 0, result.output
    header, row = result.stdout.splitlines()
    assert header.split("\t")[:4] == ["id", "host", "pid", "queues"]
    cells = row.split("\t")
    assert cells[2] == str(worker.pid)
    assert cells[3] == "a-rather-long-queue-name-that-a-table-would-cut"


def test_a_terminal_shows_a_table(cli: DagqCli) -> None:
    worker = cli.start_worker()
    wait_until(lambda: record_of(cli, worker.pid), timeout_s=10, what="the worker's record")
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        cli.command("workers"),
        cwd=cli.workdir,
        env={**cli.env, "TERM": "xterm-256color"},
        stdin=subprocess.DEVNULL,
        stdout=terminal,
        stderr=terminal,
    )
    os.close(terminal)
    chunks = []
    with contextlib.suppress(OSError):
        while chunk := os.read(controller, 65536):
            chunks.append(chunk)
    os.close(controller)
    assert process.wait(timeout=30) == 0
    shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode("utf-8", "replace"))

    assert "last seen" in shown
    assert str(worker.pid) in shown
    assert "\t" not in shown


def test_doctor_flags_a_queue_no_worker_serves_at_once(cli: DagqCli) -> None:
    cli.start_coordinator()
    cli.start_worker("-q", "gpu")
    cli.submit_here("typo", {"name": "t", "tasks": [{"name": "a", "cmd": "true", "queue": "gup"}]})

    def flagged() -> dict[str, str] | None:
        finding = doctor(cli).get("queue 'gup'")
        return finding if finding is not None and finding["level"] == "warn" else None

    finding = wait_until(flagged, timeout_s=20, what="doctor to flag queue 'gup'", interval_s=0.2)

    assert "no live worker serves it" in finding["detail"]
    assert finding["fix"] == f"start one: dagq worker --queue gup --store {cli.store_url}"
    human = cli.run("doctor")
    assert human.code == 1
    assert f"dagq worker --queue gup --store {cli.store_url}" in human.stdout
    explained = cli.json("explain", "typo", "a")
    assert "no_worker" in [w["kind"] for w in explained["waiting_for"]]


def test_doctor_is_content_when_a_live_worker_serves_the_queue(cli: DagqCli) -> None:
    cli.start_coordinator()
    worker = cli.start_worker("-q", "gpu", "--heartbeat", "0.2")
    go = cli.workdir / "go"
    cli.submit_here(
        "served",
        {
            "name": "s",
            "tasks": [
                {"name": "a", "queue": "gpu", "cmd": f"while [ ! -f {go} ]; do sleep 0.05; done"}
            ],
        },
    )
    wait_until(
        lambda: (r := record_of(cli, worker.pid)) and r["running"] == 1,
        timeout_s=20,
        what="the worker's record to show the task running",
        interval_s=0.1,
    )

    found = doctor(cli)
    go.touch()

    assert found["queue 'gpu'"]["level"] == "ok"
    assert "1 worker(s) serve it, 1/4 slot(s) busy" in found["queue 'gpu'"]["detail"]


def test_a_worker_whose_record_cannot_be_written_still_serves(cli: DagqCli) -> None:
    cli.start_coordinator()
    cli.env["DAGQ_FAULTS"] = "documents.put@1-5=fail"  # its first five records fail
    try:
        worker = cli.start_worker("--heartbeat", "0.2")
    finally:
        del cli.env["DAGQ_FAULTS"]
    cli.submit_here("served", {"name": "s", "tasks": [{"name": "a", "cmd": "true"}]})

    result = cli.run("status", "served", "--watch", timeout_s=30)
    record = wait_until(
        lambda: record_of(cli, worker.pid), timeout_s=10, what="the record, once writes work"
    )

    assert result.code == 0, result.output
    assert record["state"] == "serving"
    assert "cannot write this worker's record (retrying)" in worker.stderr()
    assert worker.process.poll() is None


def test_dagq_runs_own_workers_are_listed_with_the_run_they_serve(cli: DagqCli) -> None:
    go = cli.workdir / "go"
    path = cli.workflow(
        "hold.yaml",
        {
            "name": "hold",
            "tasks": [{"name": "a", "cmd": f"while [ ! -f {go} ]; do sleep 0.05; done"}],
        },
    )
    run = cli.start("run", path, "--id", "held")

    record = wait_until(
        lambda: next((w for w in listed(cli) if w["pid"] == run.pid), None),
        timeout_s=20,
        what="dagq run's worker record",
    )
    go.touch()

    assert run.wait(30).code == 0
    assert record["workflows"] == ["held"]
    assert listed(cli) == []


def test_the_readme_shows_the_columns_dagq_workers_prints(cli: DagqCli) -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    shown = next(
        line for line in readme.splitlines() if line.startswith("id ") and "last seen" in line
    )

    header = cli.run("workers").stdout.splitlines()[0]

    assert re.split(r"\s{2,}", shown.strip()) == header.split("\t")
