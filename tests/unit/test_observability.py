"""Traces, metrics and log fields of a run, taken with the SDK's in-memory exporters
on the memory store (docs/architecture.md §7, README "Observability")."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dagq import embedded
from dagq.cli.log_output import JsonFormatter
from dagq.messages import TaskMessage, TaskSpec, decode_task, encode_task
from dagq.observability import attempts, context, ids, metrics, tracing
from dagq.stores.memory import open_memory_store
from tests.helpers import definition

pytestmark = pytest.mark.timeout(60)


#: One provider for the whole module: OpenTelemetry's global provider (which user code
#: in a task uses) can be set only once per process.
_EXPORTER = InMemorySpanExporter()
_PROVIDER = tracing.new_provider()
_PROVIDER.add_span_processor(SimpleSpanProcessor(_EXPORTER))


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    _EXPORTER.clear()
    tracing.install(_PROVIDER)
    try:
        yield _EXPORTER
    finally:
        tracing.install(None)


@pytest.fixture
def recorder() -> Iterator[metrics.Metrics]:
    made = metrics.create()
    try:
        yield made
    finally:
        metrics.disable()


async def run(tasks: list[dict[str, Any]], **workflow: Any) -> embedded.RunResult:
    return await embedded.run_async(
        definition(tasks, **workflow), store=open_memory_store(), workers=2
    )


def named(found: list[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in found if s.name == name]


def one(found: list[ReadableSpan], name: str, **attributes: Any) -> ReadableSpan:
    matching = [
        s
        for s in named(found, name)
        if all((s.attributes or {}).get(k) == v for k, v in attributes.items())
    ]
    assert len(matching) == 1, [(s.name, s.attributes) for s in found]
    return matching[0]


def parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


# --- ids ---------------------------------------------------------------------------------


def test_a_runs_trace_id_is_derived_from_its_workflow_id_alone() -> None:
    assert ids.trace_id("wf-1") == ids.trace_id("wf-1")
    assert ids.trace_id("wf-1") != ids.trace_id("wf-2")
    assert ids.trace_id("wf-1").bit_length() > 64  # 16 bytes, not 8
    assert ids.run_span_id("wf-1", 0) != ids.run_span_id("wf-1", 1)


def test_a_traceparent_round_trips_and_a_malformed_one_is_refused() -> None:
    text = ids.traceparent(ids.trace_id("wf"), 0xABC)
    assert text == f"00-{ids.trace_id('wf'):032x}-0000000000000abc-01"
    assert ids.parse_traceparent(text) == (ids.trace_id("wf"), 0xABC)
    for bad in ("", "00-zz-00-01", f"00-{0:032x}-{1:016x}-01", "00-abc-def-01"):
        assert ids.parse_traceparent(bad) is None


def test_a_new_traceparent_names_its_new_span_in_the_runs_trace() -> None:
    made = [ids.new_traceparent("wf") for _ in range(50)]
    for span, text in made:
        assert text == ids.traceparent(ids.trace_id("wf"), span)
        assert ids.parse_traceparent(text) == (ids.trace_id("wf"), span)
    assert len({span for span, _ in made}) == 50  # drawn anew each time


def test_a_message_without_trace_fields_decodes_and_one_with_them_keeps_them() -> None:
    old = TaskMessage(workflow_id="w", task=0, name="t", attempt=1, spec=TaskSpec(kind="shell"))
    assert b"traceparent" not in encode_task(old)  # nothing added while telemetry is off
    new = msgspec.structs.replace(old, traceparent="00-" + "1" * 32 + "-" + "2" * 16 + "-01")
    assert decode_task(encode_task(new)).traceparent == new.traceparent
    assert decode_task(encode_task(old)).traceparent == ""


# --- traces ------------------------------------------------------------------------------


async def test_one_run_is_one_trace_submit_run_send_wait_process(
    spans: InMemorySpanExporter,
) -> None:
    result = await run(
        [
            {"name": "a", "cmd": 'printf "\\"%s\\"" "$TRACEPARENT" > "$DAGQ_OUTPUT"'},
            {"name": "b", "depends_on": ["a"]},
        ]
    )
    assert result.completed
    wid = result.id
    trace = ids.trace_id(wid)
    found = list(spans.get_finished_spans())
    in_run = [s for s in found if s.name != "process _completions"]
    assert {s.context.trace_id for s in in_run} == {trace}

    submit = one(found, "submit")
    assert submit.parent is None and submit.context.span_id == ids.submit_span_id(wid)
    run_span = one(found, "run")
    assert parent_id(run_span) == submit.context.span_id
    assert run_span.context.span_id == ids.run_span_id(wid, 0)
    assert run_span.attributes is not None
    assert run_span.attributes["dagq.workflow.status"] == "completed"
    assert run_span.attributes["dagq.workflow.name"] == "test"
    assert run_span.start_time is not None and run_span.end_time is not None
    for task in ("a", "b"):
        send = one(found, "send default", **{"dagq.task.name": task})
        wait = one(found, "wait default", **{"dagq.task.name": task})
        process = one(found, "process default", **{"dagq.task.name": task})
        assert send.kind == SpanKind.PRODUCER and process.kind == SpanKind.CONSUMER
        assert parent_id(send) == run_span.context.span_id
        assert parent_id(wait) == send.context.span_id
        assert parent_id(process) == run_span.context.span_id
        assert [link.context.span_id for link in process.links] == [send.context.span_id]
        assert process.attributes is not None
        assert process.attributes["messaging.system"] == "dagq.memory"
        assert process.attributes["messaging.destination.name"] == "default"
        assert process.attributes["dagq.workflow.id"] == wid
        assert process.attributes["dagq.attempt"] == 1
        assert process.attributes["dagq.queue"] == "default"
    # The shell task ran with its attempt's span as TRACEPARENT.
    process_a = one(found, "process default", **{"dagq.task.name": "a"})
    assert result.outputs["a"] == ids.traceparent(trace, process_a.context.span_id)
    batch = named(found, "process _completions")
    assert batch and batch[0].kind == SpanKind.CONSUMER
    assert batch[0].attributes is not None
    assert batch[0].attributes["messaging.batch.message_count"] >= 1
    assert any(link.context.trace_id == trace for b in batch for link in b.links)


async def test_a_retried_tasks_attempts_land_in_the_same_trace(
    spans: InMemorySpanExporter,
) -> None:
    result = await run(
        [
            {
                "name": "flaky",
                "cmd": '[ "$DAGQ_ATTEMPT" -ge 2 ] || exit 3',
                "num_retries": 1,
                "retry": {"backoff_s": 0.01},
            }
        ]
    )
    assert result.completed
    found = list(spans.get_finished_spans())
    first = one(found, "process default", **{"dagq.attempt": 1})
    second = one(found, "process default", **{"dagq.attempt": 2})
    assert first.context.trace_id == second.context.trace_id == ids.trace_id(result.id)
    assert first.status.status_code == StatusCode.ERROR
    assert first.attributes is not None and "error.type" in first.attributes
    assert second.status.status_code != StatusCode.ERROR
    assert len(named(found, "send default")) == 2


async def test_a_failed_run_ends_its_run_span_with_an_error(spans: InMemorySpanExporter) -> None:
    result = await run([{"name": "bad", "cmd": "exit 1"}])
    assert result.status == "failed"
    run_span = one(list(spans.get_finished_spans()), "run")
    assert run_span.status.status_code == StatusCode.ERROR
    assert run_span.attributes is not None
    assert run_span.attributes["error.type"] == "workflow_failed"


async def test_a_compensation_is_traced_in_the_runs_trace_under_its_new_epoch(
    spans: InMemorySpanExporter, tmp_path: Any
) -> None:
    result = await run(
        [
            {"name": "charge", "compensate": {"cmd": f"touch {tmp_path}/refunded"}},
            {"name": "ship", "cmd": "exit 1", "depends_on": ["charge"]},
        ]
    )
    assert (tmp_path / "refunded").exists(), result.status
    found = list(spans.get_finished_spans())
    wid = result.id
    undo = one(found, "process default", **{"dagq.task.name": "charge#undo"})
    assert undo.context.trace_id == ids.trace_id(wid)
    runs = {s.attributes["dagq.workflow.epoch"]: s for s in named(found, "run") if s.attributes}
    assert sorted(runs) == [0, 1]
    assert all(parent_id(r) == ids.submit_span_id(wid) for r in runs.values())
    assert parent_id(undo) == runs[1].context.span_id
    charge = one(found, "process default", **{"dagq.task.name": "charge"})
    assert parent_id(charge) == runs[0].context.span_id


async def test_a_timer_is_a_wait_span_of_the_run(spans: InMemorySpanExporter) -> None:
    result = await run([{"name": "nap", "sleep_s": 0.2}, {"name": "after", "depends_on": ["nap"]}])
    assert result.completed
    found = list(spans.get_finished_spans())
    timer = one(found, "wait timer")
    assert parent_id(timer) == ids.run_span_id(result.id, 0)
    assert timer.end_time is not None and timer.start_time is not None
    assert (timer.end_time - timer.start_time) / 1e9 >= 0.15


async def test_a_python_task_in_a_thread_runs_inside_its_attempts_span(
    spans: InMemorySpanExporter,
) -> None:
    from dagq.runners import TaskContext
    from dagq.runners.child import call_task

    parent = ids.traceparent(ids.trace_id("wf"), 0x1234)
    ctx = TaskContext(
        workflow_id="wf", task="t", attempt=1, idempotency_key="k", traceparent=parent
    )
    reply = call_task("tests.sample_tasks_otel:traced", None, ctx)
    assert reply.ok, reply.error
    (user,) = named(list(spans.get_finished_spans()), "user-work")
    assert user.context.trace_id == ids.trace_id("wf")
    assert parent_id(user) == 0x1234


async def test_a_signal_wait_is_a_wait_span_of_the_run(spans: InMemorySpanExporter) -> None:
    import asyncio

    from dagq.client import Client
    from dagq.local import LocalRunner
    from dagq.state import TaskStatus

    store = open_memory_store()
    runner = LocalRunner(store, workers=1)
    gate = definition([{"name": "gate", "wait_for": {"signal": "approve"}}])
    await runner.submit(gate, params={}, workflow_id="signalled")
    drive = asyncio.create_task(runner.drive())

    async def waiting() -> None:
        while (await runner.current_state()).task_status[0] != TaskStatus.WAITING:
            await asyncio.sleep(0.02)

    await asyncio.wait_for(waiting(), 20)
    await Client(store).signal("signalled", "approve", {"ok": True})
    assert await asyncio.wait_for(drive, 20) == "completed"
    wait = one(list(spans.get_finished_spans()), "wait signal")
    assert wait.context.trace_id == ids.trace_id("signalled")
    assert parent_id(wait) == ids.run_span_id("signalled", 0)
    assert wait.end_time is not None and wait.start_time is not None
    assert wait.end_time > wait.start_time


# --- metrics -----------------------------------------------------------------------------


def samples(recorder: metrics.Metrics) -> dict[str, list[Any]]:
    text = generate_latest(recorder.registry).decode()
    out: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


async def test_a_run_counts_its_tasks_and_workflow(recorder: metrics.Metrics) -> None:
    result = await run([{"name": "a"}, {"name": "b", "depends_on": ["a"], "cmd": "exit 1"}])
    assert result.status == "failed"
    # Counted by the time the worker stopped (it folds what it ran), before any scrape.
    assert recorder.tasks_finished.counts == {("default", "ok"): 1, ("default", "failed"): 1}
    got = samples(recorder)
    finished = {
        (s.labels["queue"], s.labels["status"]): s.value for s in got["dagq_tasks_finished_total"]
    }
    assert finished == {("default", "ok"): 1.0, ("default", "failed"): 1.0}
    (count,) = got["dagq_task_duration_seconds_count"]
    assert count.value == 2.0
    (waits,) = got["dagq_queue_wait_seconds_count"]
    assert waits.value == 2.0
    (done,) = got["dagq_workflows_finished_total"]
    assert done.labels == {"status": "failed"} and done.value == 1.0
    assert sum(s.value for s in got["dagq_coordinator_batch_seconds_count"]) >= 1


async def test_with_metrics_alone_a_message_says_when_it_is_due_and_no_more(
    recorder: metrics.Metrics, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Metrics on, tracing off: a task message carries when it was due (the queue-wait
    metric), not a traceparent nor the workflow's name, which only spans use."""
    from dagq import coordinator

    made: list[TaskMessage] = []
    real = coordinator.task_message

    def recorded(*args: Any, **kwargs: Any) -> Any:
        outgoing = real(*args, **kwargs)
        made.append(decode_task(outgoing.message.body))
        return outgoing

    monkeypatch.setattr(coordinator, "task_message", recorded)
    result = await run([{"name": "a"}, {"name": "b", "depends_on": ["a"]}])
    assert result.completed and len(made) == 2
    assert all(m.due_at > 0 and not m.traceparent and not m.workflow_name for m in made)
    (waits,) = samples(recorder)["dagq_queue_wait_seconds_count"]
    assert waits.value == 2.0


def test_histograms_carry_the_runs_trace_id_as_an_exemplar(recorder: metrics.Metrics) -> None:
    from prometheus_client.openmetrics.exposition import generate_latest as openmetrics

    recorder.task_finished("gpu", True, 0.3, "wf-x")
    text = openmetrics(recorder.registry).decode()
    assert f'# {{trace_id="{ids.trace_id("wf-x"):032x}"}} 0.3' in text


def test_a_histogram_scrape_counts_each_bucket_cumulatively(recorder: metrics.Metrics) -> None:
    for seconds in (0.001, 0.3, 0.3, 7.0, 5000.0, -1.0):
        recorder.waited("cpu", seconds, "wf-h")
    got = samples(recorder)
    buckets = {s.labels["le"]: s.value for s in got["dagq_queue_wait_seconds_bucket"]}
    assert len(buckets) == len(metrics.DURATION_BUCKETS) + 1
    assert buckets["0.005"] == 2.0  # 0.001, and -1 counted as 0
    assert buckets["0.25"] == 2.0 and buckets["0.5"] == 4.0
    assert buckets["10.0"] == 5.0 and buckets["3600.0"] == 5.0 and buckets["+Inf"] == 6.0
    (count,) = got["dagq_queue_wait_seconds_count"]
    (total,) = got["dagq_queue_wait_seconds_sum"]
    assert count.value == 6.0 and total.value == pytest.approx(5007.601)


def test_a_buckets_exemplar_is_its_latest_observation(recorder: metrics.Metrics) -> None:
    from prometheus_client.openmetrics.exposition import generate_latest as openmetrics

    recorder.task_finished("gpu", True, 0.3, "wf-old")
    recorder.task_finished("gpu", False, 0.4, "wf-new")
    text = openmetrics(recorder.registry).decode()
    assert f'# {{trace_id="{ids.trace_hex("wf-new")}"}} 0.4' in text
    assert f'# {{trace_id="{ids.trace_hex("wf-old")}"}} 0.3' not in text  # same bucket
    assert f'status="ok"}} 1.0 # {{trace_id="{ids.trace_hex("wf-old")}"}}' in text


async def test_the_counted_store_counts_each_request_by_kind_and_submits_at_once(
    recorder: metrics.Metrics, tmp_path: Any
) -> None:
    from dagq.observability import sampling
    from dagq.stores import open_store
    from dagq.submission import submit

    store = open_store(f"sqlite:///{tmp_path / 'dagq.db'}")
    view = sampling.counted(store, recorder)
    try:
        await view.documents.put("k", b"v")
        await view.documents.get("k")
        await view.documents.get("k")
        await view.queues.wait("default", 0.001)  # a local sleep: not a request
        assert view.queues.wakes == store.queues.wakes  # attributes as they are
        # A store whose batches are all or nothing stays so behind the counting view: a
        # new workflow is one batch (one commit), not its writes one by one.
        assert getattr(view.committer, "atomic", False)
        await submit(view, definition([{"name": "a"}], name="w"), workflow_id="w1")
        got = {
            s.labels["kind"]: s.value
            for s in samples(recorder)["dagq_storage_requests_total"]
            if s.labels["store"] == "sqlite"
        }
        assert got["documents.put"] == 1.0 and got["documents.get"] >= 2.0
        assert got["batch.commit"] == 1.0
        assert "queues.wait" not in got and "queues.wakes" not in got
    finally:
        await store.close()


def test_a_send_traceparent_gives_its_span_only_in_its_own_trace() -> None:
    trace = ids.trace_id("wf-t")
    header = ids.traceparent(trace, 0xABC)
    assert ids.span_in(header, trace) == 0xABC
    assert ids.span_in(header, ids.trace_id("wf-other")) == 0
    assert ids.span_in("00-" + "f" * 32 + "-zzzzzzzzzzzzzzzz-01", int("f" * 32, 16)) == 0
    assert ids.span_in("garbage", trace) == 0


def test_an_attempt_that_does_not_end_here_still_has_its_wait_span(
    spans: InMemorySpanExporter,
) -> None:
    """An attempt's wait and process spans go out together when it ends; one that never
    ends on this worker (it stops, its report could not be made) has its wait alone."""
    trace, send = ids.trace_id("wf-gone"), 0xABC
    task = TaskMessage(
        workflow_id="wf-gone",
        task=1,
        name="t",
        attempt=2,
        spec=TaskSpec(kind="shell", cmd="true"),
        traceparent=ids.traceparent(trace, send),
        due_at=10.0,
        workflow_name="w",
    )
    attempt = attempts.begin("sqlite:///x.db", task, "q", 11.0, 11.5)
    assert spans.get_finished_spans() == ()  # nothing until it ends
    attempts.abandoned(attempt)
    attempts.end(attempt, ok=False, duration_s=1, error_type=None, end_s=13)  # too late
    (wait,) = spans.get_finished_spans()
    assert (wait.name, parent_id(wait), wait.context.trace_id) == ("wait q", send, trace)
    assert (wait.start_time, wait.end_time) == (10_000_000_000, 11_000_000_000)
    process_span = ids.span_in(attempt.traceparent, trace)
    assert process_span and wait.context.span_id == tracing.wait_span_id(process_span)


def _message(workflow_id: str, task: int, *, due_at: float = 10.0) -> TaskMessage:
    """A task message as the coordinator sends it with telemetry on."""
    trace = ids.trace_id(workflow_id)
    return TaskMessage(
        workflow_id=workflow_id,
        task=task,
        name=f"t{task}",
        attempt=1,
        spec=TaskSpec(kind="shell", cmd="true"),
        traceparent=ids.traceparent(trace, 0x100 + task),
        due_at=due_at,
        workflow_name="w",
    )


def test_where_a_forwarder_exports_an_attempts_spans_wait_for_a_fold(
    spans: InMemorySpanExporter, recorder: metrics.Metrics, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where a span helper exports them (its thread folds every moment), an attempt's
    hooks leave its metrics and spans to a fold, made for many attempts at once: one
    record for the attempts of a run on a queue, the same spans as one by one. A scrape
    and a flush fold first."""
    monkeypatch.setattr(tracing, "forwarding", lambda: True)
    emitted: list[Any] = []
    real_emit = tracing.emit_ran
    monkeypatch.setattr(tracing, "emit_ran", lambda r: (emitted.append(r), real_emit(r)))
    made = []
    for n in (1, 2, 3):
        attempt = attempts.begin("sqlite:///x.db", _message("wf-fold", n), "q", 11.0, 11.5)
        attempts.end(attempt, ok=n != 2, duration_s=0.5, error_type=None, end_s=12.0)
        made.append(attempt)
    assert spans.get_finished_spans() == () and emitted == []  # nothing yet
    finished = {
        (s.labels["queue"], s.labels["status"]): s.value
        for s in samples(recorder)["dagq_tasks_finished_total"]
    }
    assert finished == {("q", "ok"): 2.0, ("q", "failed"): 1.0}  # the scrape folded
    tracing.flush()
    assert [len(r) for r in emitted] == [4]  # one record for the three attempts
    found = list(spans.get_finished_spans())
    trace = ids.trace_id("wf-fold")
    for n, attempt in zip((1, 2, 3), made, strict=True):
        process = one(found, "process q", **{"dagq.task.name": f"t{n}"})
        wait = one(found, "wait q", **{"dagq.task.name": f"t{n}"})
        assert ids.traceparent(trace, process.context.span_id) == attempt.traceparent
        assert [link.context.span_id for link in process.links] == [0x100 + n]
        assert parent_id(process) == ids.run_span_id("wf-fold", 0)
        assert parent_id(wait) == 0x100 + n
        assert wait.context.span_id == tracing.wait_span_id(process.context.span_id)
        assert (wait.start_time, wait.end_time) == (10_000_000_000, 11_000_000_000)
        assert process.status.status_code == (StatusCode.ERROR if n == 2 else StatusCode.UNSET)
    assert len(found) == 6


def test_attempts_folded_by_another_thread_meanwhile_are_each_counted_once(
    recorder: metrics.Metrics, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The event loop adds attempts while another thread (the span forwarder's, a
    scrape's) folds them: none is lost or counted twice."""
    monkeypatch.setattr(attempts, "FOLD_AT", 10**9)  # only the other thread folds
    stop = threading.Event()

    def folding() -> None:
        while not stop.is_set():
            attempts.fold()

    thread = threading.Thread(target=folding)
    thread.start()
    try:
        for n in range(20_000):
            attempt = attempts.begin("sqlite:///x.db", _message("wf-race", n), "q", 11.0, 11.5)
            attempts.end(attempt, ok=True, duration_s=0.5, error_type=None, end_s=12.0)
    finally:
        stop.set()
        thread.join(30)
    got = samples(recorder)
    (finished,) = got["dagq_tasks_finished_total"]
    (waits,) = got["dagq_queue_wait_seconds_count"]
    assert finished.value == 20_000.0 and waits.value == 20_000.0


def test_attempts_that_never_end_here_do_not_pile_up_uncounted(
    recorder: metrics.Metrics,
) -> None:
    """Metrics on, tracing off, nobody scraping: attempts that begin and are abandoned
    (never ended here) are folded by the hundred all the same (found in review)."""
    for n in range(5000):
        attempt = attempts.begin("sqlite:///x.db", _message("never", n), "q", 11.0, 11.5)
        attempts.abandoned(attempt)
    assert len(attempts._backlog.began) < attempts.FOLD_AT
    (waits,) = samples(recorder)["dagq_queue_wait_seconds_count"]
    assert waits.value == 5000.0


def test_turning_tracing_off_emits_the_attempts_that_ended_before(
    spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attempts that ended, not yet folded, when tracing is turned off have their spans
    emitted first (found in review: they were folded with tracing already off)."""
    monkeypatch.setattr(tracing, "forwarding", lambda: True)  # left to a fold
    attempt = attempts.begin("sqlite:///x.db", _message("wf-off", 1), "q", 11.0, 11.5)
    attempts.end(attempt, ok=True, duration_s=0.5, error_type=None, end_s=12.0)
    assert spans.get_finished_spans() == ()
    tracing.install(None)
    assert sorted(s.name for s in spans.get_finished_spans()) == ["process q", "wait q"]


def test_the_exporters_resource_is_the_providers() -> None:
    finished = tracing.Finished(_PROVIDER)
    assert finished.resource == _PROVIDER.resource
    assert hash(finished.resource) == hash(_PROVIDER.resource)
    assert {_PROVIDER.resource: 1}[finished.resource] == 1


# --- logs --------------------------------------------------------------------------------


def test_a_json_log_line_about_an_attempt_names_it_and_its_trace() -> None:
    record = logging.LogRecord("dagq.worker", logging.INFO, "f", 1, "hello", None, None)
    with context.concerning(context.Concern("wf-9", "t[2]", 3, 0xBEEF)):
        line = json.loads(JsonFormatter().format(record))
    assert line["workflow_id"] == "wf-9" and line["task"] == "t[2]" and line["attempt"] == 3
    assert line["trace_id"] == f"{ids.trace_id('wf-9'):032x}"
    assert line["span_id"] == f"{0xBEEF:016x}"
    plain = json.loads(JsonFormatter().format(record))
    assert "workflow_id" not in plain and "trace_id" not in plain


def test_worker_log_lines_carry_the_attempt(caplog: pytest.LogCaptureFixture) -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("dagq.test-concern")
    logger.addHandler(handler)
    try:
        token = context.current.set(context.Concern("wf-1", "a", 1))
        logger.warning("about a")
        context.current.reset(token)
    finally:
        logger.removeHandler(handler)
    assert json.loads(stream.getvalue())["task"] == "a"


# --- no cost when off --------------------------------------------------------------------


def test_without_otel_variables_nothing_of_opentelemetry_is_imported(tmp_path: Any) -> None:
    probe = (
        "import asyncio, sys\n"
        "from dagq import embedded\n"
        "from dagq.stores.memory import open_memory_store\n"
        "from tests.helpers import definition\n"
        "r = asyncio.run(embedded.run_async(definition([{'name': 'a'}]), "
        "store=open_memory_store()))\n"
        "assert r.completed\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'opentelemetry', 'prometheus_client'}))\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, env=env
    )
    assert done.stdout.strip() == "[]"


async def test_a_ratio_sampler_keeps_or_drops_a_run_whole() -> None:
    from opentelemetry.sdk.trace.sampling import Decision, TraceIdRatioBased

    sampler = TraceIdRatioBased(0.5)
    exporter = InMemorySpanExporter()
    provider = tracing.new_provider(sampler=sampler)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider)
    workflow_ids = [f"ratio-{n}" for n in range(6)]
    try:
        for wid in workflow_ids:
            result = await embedded.run_async(
                definition([{"name": "a"}, {"name": "b", "depends_on": ["a"]}]),
                store=open_memory_store(),
                workflow_id=wid,
            )
            assert result.completed
    finally:
        tracing.install(None)
    by_trace: dict[int, set[str]] = {}
    for span in exporter.get_finished_spans():
        by_trace.setdefault(span.context.trace_id, set()).add(span.name)
    expected = {
        wid
        for wid in workflow_ids
        if sampler.should_sample(None, ids.trace_id(wid), "run").decision
        == Decision.RECORD_AND_SAMPLE
    }
    assert 0 < len(expected) < len(workflow_ids)  # these ids make a test that can fail
    assert {w for w in workflow_ids if ids.trace_id(w) in by_trace} == expected
    for wid in expected:
        assert {"submit", "run", "send default", "process default"} <= by_trace[ids.trace_id(wid)]


def test_tracing_is_wanted_only_when_the_environment_says_so() -> None:
    assert not tracing.wanted({})
    assert tracing.wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert tracing.wanted({"OTEL_TRACES_EXPORTER": "console"})
    assert not tracing.wanted({"OTEL_TRACES_EXPORTER": "none"})
    assert not tracing.wanted(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_SDK_DISABLED": "true"}
    )


class _AllOrNothing:
    """A committer that commits a batch in one transaction (as sqlite's does)."""

    atomic = True

    async def __call__(self, ops: Any) -> list[str]:
        return []


class _AcksLast:
    """A committer that writes a batch's acks after its states (as Azure's does)."""

    acks_after_states = True

    async def __call__(self, ops: Any) -> list[str]:
        return []


@pytest.mark.parametrize("committer", [_AllOrNothing, _AcksLast])
def test_views_of_a_store_keep_what_its_committer_promises(
    recorder: metrics.Metrics, committer: type[Any]
) -> None:
    """With metrics on, the counted view still takes hand-overs (on Azure it lost the
    promise, and with it the hand-off); a hooked view keeps the order of the writes but
    is never said to be all or nothing (faults go between a submit's writes)."""
    from dagq.observability import sampling
    from dagq.stores.base import takes_handoff
    from dagq.stores.intercepting import intercepted

    store = open_memory_store()
    store.committer = committer()
    counted = sampling.counted(store, recorder)
    assert takes_handoff(counted.committer)
    hooked = intercepted(store, lambda _operation, _args, call: call())
    assert not getattr(hooked.committer, "atomic", False)
    assert takes_handoff(hooked.committer) is (committer is _AcksLast)
    whole = intercepted(store, lambda _operation, _args, call: call(), whole=True)
    assert takes_handoff(whole.committer)
