"""``--metrics-port`` and OTEL_* through the CLI, as a user types them: a usage error
for what cannot work, and ``dagq server`` tracing the submits it takes and serving
its metrics."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from dagq.observability import ids
from tests.integration.cli_harness import DagqCli, wait_until
from tests.integration.test_observability_cluster import Receiver, _free_port, _serve, scrape

pytestmark = pytest.mark.timeout(90)

_WITHOUT_PROMETHEUS = """
import sys
sys.modules["prometheus_client"] = None  # as if the otel extra were not installed
from dagq.cli import main
main(["worker", "--store", "memory://", "--metrics-port", "9464"])
"""


def test_metrics_without_the_extra_is_a_one_line_error_naming_the_install() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_PROMETHEUS], capture_output=True, text=True, check=False
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines == ["error: --metrics-port needs the otel extra: pip install 'dagq[otel]'"]


def test_a_metrics_port_in_use_is_a_one_line_error(tmp_path: Path) -> None:
    with socket.socket() as taken, DagqCli(tmp_path) as cli:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = cli.run("coordinator", "--metrics-port", str(port), timeout_s=30)
    assert done.code == 2, done.output
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"error: --metrics-port {port}: cannot serve metrics")


def test_a_bad_metrics_port_is_refused_by_the_option(tmp_path: Path) -> None:
    with DagqCli(tmp_path) as cli:
        done = cli.run("worker", "--metrics-port", "0", timeout_s=30)
    assert done.code == 2
    assert "--metrics-port" in done.stderr


def test_the_server_traces_a_submit_and_serves_its_metrics(tmp_path: Path) -> None:
    receiver = Receiver()
    otlp = _serve(receiver)
    port, metrics_port = _free_port(), _free_port()
    try:
        with DagqCli(tmp_path) as cli:
            cli.env["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{otlp.server_port}"
            cli.env["OTEL_BSP_SCHEDULE_DELAY"] = "100"
            server = cli.start("server", "--port", str(port), "--metrics-port", str(metrics_port))

            def up() -> bool:
                try:
                    scrape(metrics_port)
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/workflows", timeout=2)
                except OSError:
                    return server.process.poll() is not None
                return True

            wait_until(up, timeout_s=30, what="the server to listen")
            assert server.process.poll() is None, server.stderr()
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/v1/workflows?id=served-1",
                data=b"name: served\ntasks:\n  - name: a\n    cmd: 'true'\n",
                headers={"Content-Type": "application/yaml"},
                method="POST",
            )
            with urllib.request.urlopen(request, timeout=30) as response:
                assert response.status == 202
                accepted = json.loads(response.read())
            metrics = scrape(metrics_port)
            server.send(signal.SIGTERM)
            finished = server.wait(30)
    finally:
        otlp.shutdown()
        otlp.server_close()
    assert finished.code == 0, finished.output
    assert accepted["id"] == "served-1"
    submits = [s for s in receiver.snapshot() if s.name == "submit"]
    assert len(submits) == 1
    (submit,) = submits
    assert submit.service == "dagq-server"
    assert submit.trace_id == ids.trace_id("served-1")
    assert submit.span_id == ids.submit_span_id("served-1")
    assert submit.attributes["dagq.workflow.name"] == "served"
    assert "dagq_event_loop_lag_seconds" in metrics
    assert "dagq_tasks_finished" in metrics  # the family (its samples end in _total)


def test_the_server_logs_json_lines_and_samples_its_event_loop_lag(tmp_path: Path) -> None:
    port, metrics_port = _free_port(), _free_port()
    with DagqCli(tmp_path) as cli:
        cli.env["DAGQ_METRICS_INTERVAL_S"] = "0.2"
        server = cli.start(
            "server",
            "--port",
            str(port),
            "--metrics-port",
            str(metrics_port),
            "--log-format",
            "json",
        )

        def lag() -> float | None:
            try:
                metrics = scrape(metrics_port)
            except OSError:
                assert server.process.poll() is None, server.stderr()
                return None
            (sample,) = metrics["dagq_event_loop_lag_seconds"]
            return sample.value if sample.value > 0 else None  # 0 until first sampled

        loop_lag = wait_until(lag, timeout_s=30, what="the server's loop lag to be sampled")
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/workflows?id=logged-1",
            data=b"name: logged\ntasks:\n  - name: a\n    cmd: 'true'\n",
            headers={"Content-Type": "application/yaml"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 202
        task_url = f"http://127.0.0.1:{port}/v1/workflows/logged-1/tasks/a"
        with urllib.request.urlopen(task_url, timeout=30) as response:
            assert response.status == 200
        finished = server.stop(timeout_s=30)
    assert finished.code == 0, finished.output
    assert loop_lag is not None and 0 < loop_lag < 5
    lines = [json.loads(line) for line in finished.stderr.splitlines() if line.strip()]
    assert lines, "the server logged nothing"
    for line in lines:
        assert {"time", "level", "logger", "message"} <= line.keys(), line
    assert any(line["message"].startswith("dagq server: no token required") for line in lines)
    (access, task_access) = [line for line in lines if line["logger"] == "uvicorn.access"]
    assert access["method"] == "POST" and access["status"] == 202
    assert access["path"] == "/v1/workflows?id=logged-1"
    # The access line names the run it concerns and its trace (a submit learns its id).
    assert access["workflow_id"] == "logged-1"
    assert access["trace_id"] == ids.trace_hex("logged-1")
    assert (task_access["workflow_id"], task_access["task"]) == ("logged-1", "a")
    assert any("Uvicorn running on" in line["message"] for line in lines)
