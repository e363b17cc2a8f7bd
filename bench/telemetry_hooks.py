"""``python -m bench.telemetry_hooks [ATTEMPTS]``: the CPU that traces and metrics add
to each attempt, in the traced process and in its span helper, without a run around
them.

It turns telemetry on as a worker and a coordinator do (spans to a span helper that
posts them to ``bench.otlp_sink`` on 127.0.0.1, the metrics made), then calls, per
attempt, the hooks the runtime calls: the coordinator's ``send`` spans (a fan-out's
sends, 100 a step), the worker's ``attempts.begin`` and ``attempts.end`` (the
``wait`` and ``process`` spans, the task metrics). It prints one JSON line: µs of CPU
an attempt in this process (its span-forwarding thread included), and in the helper
(from ``/proc``, its start-up left out), once everything made is exported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from bench import process_cpu
from dagq.dispatching import send_span_ids
from dagq.messages import TaskMessage, TaskSpec
from dagq.observability import attempts, ids, metrics, spans, tracing

STORE = "sqlite:///tmp/bench.db"
QUEUE = "default"
SENDS_A_STEP = 100
#: Attempts a second at most (a step's hooks, then a sleep): W1's pace on this machine,
#: and slow enough that no span is dropped on the way.
PACE = 2000


def _messages(workflow_id: str, count: int, now: float) -> list[tuple[TaskMessage, int]]:
    spec = TaskSpec(kind="python", call="bench.tasks:leaf")
    out = []
    for i in range(count):
        trace, span = send_span_ids(workflow_id)
        task = TaskMessage(
            workflow_id=workflow_id,
            task=i + 1,
            name="leaf",
            attempt=1,
            spec=spec,
            item_index=i,
            traceparent=ids.traceparent(trace, span),
            due_at=now,
            workflow_name="w1",
        )
        out.append((task, span))
    return out


def _helper_cpu(pid: int) -> float:
    return process_cpu.pids_cpu([pid], process_cpu.cpu_by_pid()).get(pid, 0.0)


def main(argv: list[str]) -> None:
    count = int(argv[0]) if argv else 10000
    sink = subprocess.Popen([sys.executable, "-m", "bench.otlp_sink"], stdout=subprocess.PIPE)
    assert sink.stdout is not None
    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{int(sink.stdout.readline())}"
    try:
        tracing.configure("dagq-worker", forward=True)
        tracing.ready(30)
        recorder = metrics.create()
        forwarder = tracing._on.forwarder
        helper = forwarder._helper.pid
        workflow_id = "bench-hooks"
        now = time.time()
        tasks = _messages(workflow_id, count, now)
        helper_before = _helper_cpu(helper)
        cpu_before = time.process_time()
        began = time.perf_counter()
        for start in range(0, count, SENDS_A_STEP):
            ahead = began + start / PACE - time.perf_counter()
            if ahead > 0:
                time.sleep(ahead)
            step = tasks[start : start + SENDS_A_STEP]
            spans.sent(
                STORE,
                workflow_id=workflow_id,
                workflow_name="w1",
                epoch=0,
                queue=QUEUE,
                sends=[(span, t.name, t.attempt, "") for t, span in step],
                start_s=now,
                end_s=now + 0.001,
            )
            for task, _span in step:
                attempt = attempts.begin(STORE, task, QUEUE, now + 0.002, now + 0.002)
                attempts.end(attempt, ok=True, duration_s=0.001, error_type=None, end_s=now + 0.003)
        in_process = time.process_time() - cpu_before
        tracing.flush(60_000)
        flushed = time.process_time() - cpu_before
        helper_cpu = _helper_cpu(helper) - helper_before
        assert recorder.tasks_finished.counts[(QUEUE, "ok")] == count
        print(
            json.dumps(
                {
                    "attempts": count,
                    "spans": 3 * count,
                    "process_us_per_attempt": round(in_process / count * 1e6, 2),
                    "process_with_flush_us_per_attempt": round(flushed / count * 1e6, 2),
                    "helper_us_per_attempt": round(helper_cpu / count * 1e6, 2),
                    "dropped": forwarder.dropped,
                }
            )
        )
    finally:
        tracing.shutdown()
        sink.kill()
        sink.wait()


if __name__ == "__main__":
    main(sys.argv[1:])
