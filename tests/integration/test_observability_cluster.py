"""The must-show of issue 15: one run's spans form one trace across processes, and
every process serves its metrics.

A coordinator and two workers (``cpu``, ``gpu``) run as separate processes on one
SQLite file, each exporting OTLP/HTTP to a receiver in this test (a real HTTP server
on 127.0.0.1 decoding the protobuf with ``opentelemetry-proto``) and serving
``/metrics``; ``dagq submit`` (a fourth process) submits a workflow with shell and
Python tasks on both queues, one of them retried, one making a span of its own. The
whole scenario runs once (a module fixture); each test checks one part of it.
"""

from __future__ import annotations

import signal
import socket
import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from prometheus_client.parser import text_string_to_metric_families

from dagq.observability import ids
from dagq.observability.metrics import METRICS
from tests.integration.cli_harness import DagqCli, Finished, wait_until

pytestmark = pytest.mark.timeout(90)

WORKFLOW_ID = "traced-1"

TASKS = """
    from opentelemetry import trace

    from dagq import TaskContext


    def score(rows: int) -> dict:
        with trace.get_tracer("cluster-tasks").start_as_current_span("score-rows"):
            return {"score": 0.25 * rows}


    def flaky(ctx: TaskContext) -> int:
        if ctx.attempt == 1:
            raise RuntimeError("the first attempt always fails")
        return ctx.attempt
"""

WORKFLOW: dict[str, Any] = {
    "name": "traced",
    "tasks": [
        {"name": "prepare", "queue": "cpu", "cmd": """echo '{"rows": 3}' > "$DAGQ_OUTPUT\""""},
        {
            "name": "score",
            "queue": "gpu",
            "depends_on": ["prepare"],
            "call": "cluster_tasks:score",
            "args": {"rows": "{{ inputs.prepare.rows }}"},
        },
        {
            "name": "flaky",
            "queue": "gpu",
            "depends_on": ["prepare"],
            "num_retries": 1,
            "retry": {"backoff_s": 0.05, "jitter": 0},
            "call": "cluster_tasks:flaky",
        },
        {
            "name": "report",
            "queue": "cpu",
            "depends_on": ["score", "flaky"],
            "cmd": 'echo "$TRACEPARENT" > traceparent.txt',
        },
    ],
}


@dataclass(frozen=True)
class Span:
    """One span as the receiver decoded it."""

    service: str
    name: str
    trace_id: int
    span_id: int
    parent_id: int
    kind: int
    links: tuple[int, ...]
    attributes: dict[str, Any]
    error: bool


@dataclass
class Receiver:
    """An OTLP/HTTP trace receiver on 127.0.0.1."""

    spans: list[Span] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, body: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        got = []
        for resource in request.resource_spans:
            service = next(
                (
                    a.value.string_value
                    for a in resource.resource.attributes
                    if a.key == "service.name"
                ),
                "",
            )
            for scope in resource.scope_spans:
                for s in scope.spans:
                    got.append(
                        Span(
                            service=service,
                            name=s.name,
                            trace_id=int.from_bytes(s.trace_id, "big"),
                            span_id=int.from_bytes(s.span_id, "big"),
                            parent_id=int.from_bytes(s.parent_span_id, "big")
                            if s.parent_span_id
                            else 0,
                            kind=s.kind,
                            links=tuple(int.from_bytes(link.span_id, "big") for link in s.links),
                            attributes={a.key: _value(a.value) for a in s.attributes},
                            error=s.status.code == 2,
                        )
                    )
        with self.lock:
            self.spans.extend(got)

    def snapshot(self) -> list[Span]:
        with self.lock:
            return list(self.spans)


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


def _serve(receiver: Receiver) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.path == "/v1/traces":
                receiver.add(body)
            reply = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *_args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def scrape(port: int) -> dict[str, list[Any]]:
    """``/metrics`` of a process, parsed: samples by name."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    out: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        out.setdefault(family.name, [])
        for sample in family.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


def value(metrics: dict[str, list[Any]], name: str, **labels: str) -> float:
    return sum(
        s.value
        for s in metrics.get(name, [])
        if all(s.labels.get(k) == v for k, v in labels.items())
    )


@dataclass(frozen=True)
class Scenario:
    watch: Finished
    spans: list[Span]
    metrics: dict[str, dict[str, list[Any]]]
    exits: dict[str, Finished]
    traceparent: str


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scenario]:
    receiver = Receiver()
    server = _serve(receiver)
    ports = {"coordinator": _free_port(), "cpu": _free_port(), "gpu": _free_port()}
    try:
        with DagqCli(tmp_path_factory.mktemp("traced")) as cli:
            cli.env.update(
                {
                    "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{server.server_port}",
                    "OTEL_BSP_SCHEDULE_DELAY": "100",
                    "DAGQ_METRICS_INTERVAL_S": "0.2",
                }
            )
            cli.write("cluster_tasks.py", TASKS)
            wf = cli.workflow("traced.yaml", WORKFLOW)
            coordinator = cli.start_coordinator("--metrics-port", str(ports["coordinator"]))
            cpu = cli.start_worker("-q", "cpu", "--metrics-port", str(ports["cpu"]))
            gpu = cli.start_worker(
                "-q", "gpu", "--import-path", cli.workdir, "--metrics-port", str(ports["gpu"])
            )
            submitted = cli.run("submit", wf, "--id", WORKFLOW_ID)
            assert submitted.code == 0, submitted.output
            watch = cli.run("status", WORKFLOW_ID, "--watch", timeout_s=60)

            def settled() -> bool:
                # The gauges are sampled every few seconds: wait for a sample taken
                # after the run's last message was deleted, with both workers counted.
                got = scrape(ports["coordinator"])
                return all(
                    value(got, "dagq_workers", queue=q) == 1
                    and value(got, "dagq_queue_depth", queue=q) == 0
                    for q in ("cpu", "gpu")
                )

            wait_until(settled, timeout_s=30, what="the coordinator's gauges to settle")
            metrics = {name: scrape(port) for name, port in ports.items()}
            for process in (coordinator, cpu, gpu):
                process.send(signal.SIGTERM)
            exits = {
                "coordinator": coordinator.wait(15),
                "cpu": cpu.wait(15),
                "gpu": gpu.wait(15),
            }
            traceparent = (cli.workdir / "traceparent.txt").read_text().strip()

            def run_span_arrived() -> bool:
                return any(s.name == "run" for s in receiver.snapshot())

            wait_until(run_span_arrived, timeout_s=10, what="the run span")
            yield Scenario(watch, receiver.snapshot(), metrics, exits, traceparent)
    finally:
        server.shutdown()
        server.server_close()


def of_run(scenario: Scenario) -> list[Span]:
    trace = ids.trace_id(WORKFLOW_ID)
    return [s for s in scenario.spans if s.trace_id == trace]


def only(spans: list[Span], name: str, **attributes: Any) -> list[Span]:
    return [
        s
        for s in spans
        if s.name == name and all(s.attributes.get(k) == v for k, v in attributes.items())
    ]


def test_the_run_completes_and_every_process_exits_cleanly(scenario: Scenario) -> None:
    assert scenario.watch.code == 0, scenario.watch.output
    for name, finished in scenario.exits.items():
        assert finished.code == 0, f"{name}: {finished.output}"
        assert "Traceback" not in finished.output, finished.output


def test_submit_is_the_root_and_the_run_hangs_under_it(scenario: Scenario) -> None:
    spans = of_run(scenario)
    (submit,) = only(spans, "submit")
    assert submit.parent_id == 0 and submit.service == "dagq-client"
    (run,) = only(spans, "run")
    assert run.parent_id == submit.span_id and run.service == "dagq-coordinator"
    assert run.attributes["dagq.workflow.status"] == "completed"
    assert run.attributes["dagq.workflow.name"] == "traced"


def test_each_attempt_has_send_wait_and_process_spans_on_its_workers(scenario: Scenario) -> None:
    spans = of_run(scenario)
    (run,) = only(spans, "run")
    expected = {"prepare": "cpu", "score": "gpu", "flaky": "gpu", "report": "cpu"}
    for task, queue in expected.items():
        attempts = 2 if task == "flaky" else 1
        sends = only(spans, f"send {queue}", **{"dagq.task.name": task})
        waits = only(spans, f"wait {queue}", **{"dagq.task.name": task})
        processes = only(spans, f"process {queue}", **{"dagq.task.name": task})
        assert (len(sends), len(waits), len(processes)) == (attempts,) * 3, task
        by_id = {s.span_id: s for s in sends}
        for send in sends:
            assert send.parent_id == run.span_id and send.service == "dagq-coordinator"
            assert send.attributes["messaging.system"] == "dagq.sqlite"
        for wait in waits:
            assert wait.parent_id in by_id
        for process in processes:
            assert process.parent_id == run.span_id
            assert process.service == "dagq-worker"
            assert process.attributes["dagq.queue"] == queue
            (link,) = process.links
            assert link in by_id
            assert by_id[link].attributes["dagq.attempt"] == process.attributes["dagq.attempt"]


def test_a_retried_tasks_attempts_are_in_the_same_trace(scenario: Scenario) -> None:
    spans = only(of_run(scenario), "process gpu", **{"dagq.task.name": "flaky"})
    by_attempt = {s.attributes["dagq.attempt"]: s for s in spans}
    assert sorted(by_attempt) == [1, 2]
    assert by_attempt[1].error and by_attempt[1].attributes["error.type"] == "RuntimeError"
    assert not by_attempt[2].error


def test_a_python_tasks_own_span_is_a_child_of_its_attempt(scenario: Scenario) -> None:
    spans = of_run(scenario)
    (process,) = only(spans, "process gpu", **{"dagq.task.name": "score"})
    (own,) = only(spans, "score-rows")
    assert own.parent_id == process.span_id
    assert own.service == "dagq-task"


def test_a_shell_task_gets_its_attempts_traceparent(scenario: Scenario) -> None:
    (process,) = only(of_run(scenario), "process cpu", **{"dagq.task.name": "report"})
    assert scenario.traceparent == ids.traceparent(ids.trace_id(WORKFLOW_ID), process.span_id)


def test_coordinator_batches_link_to_the_run(scenario: Scenario) -> None:
    batches = [s for s in scenario.spans if s.name == "process _completions"]
    assert batches
    assert any(ids.run_span_id(WORKFLOW_ID) in b.links for b in batches)
    assert all(b.attributes["messaging.batch.message_count"] >= 1 for b in batches)


def test_every_metric_is_exported_with_sensible_values(scenario: Scenario) -> None:
    coordinator, cpu, gpu = (scenario.metrics[n] for n in ("coordinator", "cpu", "gpu"))
    for name in METRICS:
        family = name.removesuffix("_total")
        for metrics in (coordinator, cpu, gpu):
            assert family in metrics, name
    assert value(coordinator, "dagq_workflows_finished_total", status="completed") == 1
    assert value(coordinator, "dagq_coordinator_batch_seconds_count") >= 1
    assert value(coordinator, "dagq_coordinator_lease_held") == 1
    assert value(coordinator, "dagq_workers", queue="cpu") == 1
    assert value(coordinator, "dagq_workers", queue="gpu") == 1
    assert value(coordinator, "dagq_queue_depth", queue="cpu") == 0
    assert value(coordinator, "dagq_dead_letters", queue="gpu") == 0
    assert "dagq_queue_oldest_message_age_seconds" in coordinator
    assert value(coordinator, "dagq_workflows", status="running") == 0
    assert value(coordinator, "dagq_storage_requests_total", store="sqlite") > 0
    assert value(cpu, "dagq_tasks_finished_total", queue="cpu", status="ok") == 2
    assert value(gpu, "dagq_tasks_finished_total", queue="gpu", status="ok") == 2
    assert value(gpu, "dagq_tasks_finished_total", queue="gpu", status="failed") == 1
    assert value(gpu, "dagq_task_duration_seconds_count", queue="gpu") == 3
    assert value(cpu, "dagq_queue_wait_seconds_count", queue="cpu") == 2
    assert 0 <= value(cpu, "dagq_queue_wait_seconds_sum", queue="cpu") < 30
    assert value(gpu, "dagq_storage_requests_total", kind="queues.receive") > 0
    for metrics in (coordinator, cpu, gpu):
        assert 0 <= value(metrics, "dagq_event_loop_lag_seconds") < 5
