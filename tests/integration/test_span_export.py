"""A process tracing by its OTEL_* environment as a coordinator or worker does exports
dagq's spans from a helper process (:mod:`dagq.observability.forwarding`) and user
code's itself: what arrives at an OTLP/HTTP receiver on 127.0.0.1 is what was emitted,
a flush returns once it has arrived, and the spans of a process that ends without
stopping still arrive."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from dagq.observability import ids
from tests.integration.cli_harness import wait_until
from tests.integration.test_observability_cluster import Receiver, _serve

pytestmark = pytest.mark.timeout(60)

_PROBE = """
import sys, time
from dagq.observability import ids, spans, tracing

assert tracing.configure("dagq-probe", forward=True)
assert tracing._on.forwarder is not None  # dagq's spans go through the helper
from opentelemetry import trace
with trace.get_tracer("probe").start_as_current_span("user-span"):  # user code's, in-process
    pass
now = time.time()
spans.run_ended("exported-1", "probe", epoch=0, status="failed", start_s=now - 1, end_s=now)
spans.sent("sqlite:///x.db", workflow_id="exported-1", workflow_name="probe", epoch=0,
           queue="gpu", sends=[(0xABC, "train", 2, "m-1")], start_s=now, end_s=now)
tracing.flush()
print("flushed", flush=True)
sys.stdin.readline()  # the test has looked
spans.waited("timer", workflow_id="exported-1", workflow_name="probe", epoch=0,
             start_s=now, end_s=now + 1)
# no tracing.shutdown(): the process just ends
"""


def test_spans_go_out_through_the_helper_process_flushed_and_at_exit() -> None:
    receiver = Receiver()
    otlp = _serve(receiver)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{otlp.server_port}"
    env["OTEL_BSP_SCHEDULE_DELAY"] = "60000"  # only a flush or the end sends anything
    try:
        with subprocess.Popen(
            [sys.executable, "-c", _PROBE],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ) as probe:
            assert probe.stdout is not None and probe.stdin is not None
            assert probe.stdout.readline().strip() == "flushed"
            flushed = {s.name: s for s in receiver.snapshot()}
            probe.stdin.write("\n")
            probe.stdin.close()
            assert probe.wait(30) == 0
            assert probe.stderr is not None
            errors = probe.stderr.read()
        wait_until(
            lambda: any(s.name == "wait timer" for s in receiver.snapshot()),
            timeout_s=30,
            what="the span made just before the probe ended",
        )
    finally:
        otlp.shutdown()
        otlp.server_close()
    assert set(flushed) == {"run", "send gpu", "user-span"}, errors
    assert flushed["user-span"].service == "dagq-probe"
    run, send = flushed["run"], flushed["send gpu"]
    assert run.service == "dagq-probe"
    assert run.trace_id == ids.trace_id("exported-1")
    assert run.span_id == ids.run_span_id("exported-1", 0)
    assert run.parent_id == ids.submit_span_id("exported-1")
    assert run.error and run.attributes["error.type"] == "workflow_failed"
    assert run.attributes["dagq.workflow.status"] == "failed"
    assert send.span_id == 0xABC and send.parent_id == run.span_id
    assert send.attributes["dagq.task.name"] == "train" and send.attributes["dagq.attempt"] == 2
    assert send.attributes["messaging.system"] == "dagq.sqlite"
    assert send.kind == 4  # SPAN_KIND_PRODUCER
    (timer,) = [s for s in receiver.snapshot() if s.name == "wait timer"]
    assert timer.trace_id == run.trace_id and timer.parent_id == run.span_id


_CONSOLE_PROBE = """
import time
from dagq.observability import spans, tracing

assert tracing.configure("dagq-probe", forward=True)
now = time.time()
spans.run_ended("console-1", "probe", epoch=0, status="completed", start_s=now - 1, end_s=now)
tracing.flush()
tracing.shutdown()
"""


def test_the_console_exporter_still_gets_sdk_spans_from_the_helper() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["OTEL_TRACES_EXPORTER"] = "console"
    done = subprocess.run(
        [sys.executable, "-c", _CONSOLE_PROBE],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    # The helper (its stdout is the probe's) printed the SDK's JSON of the span.
    assert '"name": "run"' in done.stdout, done.stdout + done.stderr
    assert f"0x{ids.trace_id('console-1'):032x}" in done.stdout


_BUSY_PROBE = """
import time
from dagq.observability import spans, tracing

assert tracing.configure("dagq-probe", forward=True)
now = time.time()
for i in range(3000):
    spans.waited("timer", workflow_id=f"busy-{i}", workflow_name="probe", epoch=0,
                 start_s=now, end_s=now)
started = time.monotonic()
tracing.shutdown()  # what was taken is exported; the rest was dropped, not waited for
print(round(time.monotonic() - started, 2), flush=True)
"""


def test_a_slow_collector_makes_the_helper_drop_spans_not_the_process_wait() -> None:
    received: list[int] = []

    class Slow(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            request = ExportTraceServiceRequest.FromString(body)
            time.sleep(0.5)  # a collector answering slowly
            received.append(
                sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
            )
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *_args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{server.server_port}"
    env["OTEL_BSP_MAX_EXPORT_BATCH_SIZE"] = "100"
    env["OTEL_BSP_MAX_QUEUE_SIZE"] = "500"
    try:
        done = subprocess.run(
            [sys.executable, "-c", _BUSY_PROBE],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        server.shutdown()
        server.server_close()
    assert done.returncode == 0, done.stderr
    # Waiting for all 3,000 at 100 a request would take 15 s; 500 wait at most (2.5 s).
    assert float(done.stdout.strip()) < 8, done.stderr
    assert "dropping some" in done.stderr
    assert 0 < sum(received) < 3000
    assert max(received) <= 100


_HELPER = """
import atexit, runpy, sys
# Stands for the interpreter's teardown: the helper must not go through it.
atexit.register(lambda: print("torn down", file=sys.stderr, flush=True))
sys.argv = ["exporting", "dagq-probe", sys.argv[1]]
runpy.run_module("dagq.observability.exporting", run_name="__main__")
"""


def test_the_helper_exits_at_once_once_its_spans_are_exported() -> None:
    """At the end of its stdin the helper exports what it has, then ends without the
    interpreter's teardown (atexit handlers, freeing the SDK's modules): the traced
    process waits for it to exit (Forwarder.close)."""
    receiver = Receiver()
    otlp = _serve(receiver)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{otlp.server_port}"
    now_ns = time.time_ns()
    trace = ids.trace_id("ended-1")
    record = ("run", trace, 0xAB, None, "internal", {"k": 1}, (), now_ns, now_ns, None)
    acks, acks_out = os.pipe()
    try:
        with subprocess.Popen(
            [sys.executable, "-c", _HELPER, str(acks_out)],
            env=env,
            stdin=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(acks_out,),
        ) as helper:
            assert helper.stdin is not None and helper.stderr is not None
            data = pickle.dumps(("spans", [record]))
            helper.stdin.write(len(data).to_bytes(4, "big") + data)
            helper.stdin.close()
            assert helper.wait(30) == 0
            errors = helper.stderr.read().decode()
        got = receiver.snapshot()
        assert [(s.name, s.trace_id, s.span_id) for s in got] == [("run", trace, 0xAB)], errors
        assert "torn down" not in errors
    finally:
        os.close(acks)
        os.close(acks_out)
        otlp.shutdown()
        otlp.server_close()
