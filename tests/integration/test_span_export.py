"""A process tracing by its OTEL_* environment as a coordinator or worker does exports
dagq's spans from a helper process (:mod:`dagq.observability.forwarding`) and user
code's itself: what arrives at an OTLP/HTTP receiver on 127.0.0.1 is what was emitted,
a flush returns once it has arrived, and the spans of a process that ends without
stopping still arrive."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

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
