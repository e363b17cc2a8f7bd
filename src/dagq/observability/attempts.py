"""The worker's side of telemetry: an attempt's queue wait and its ``process`` span,
and the task metrics (docs/architecture.md §7)."""

from __future__ import annotations

import functools

import msgspec

from dagq import keys
from dagq.messages import TaskMessage
from dagq.observability import ids, metrics, spans, tracing
from dagq.observability.tracing import SpanRef


class _OnQueue(msgspec.Struct, frozen=True):
    """What every traced attempt of one run's epoch on one queue shares, made once."""

    trace: int
    #: ``00-TRACE-``: a traceparent of this trace up to its span id.
    trace_part: str
    run_span: int
    wait_name: str
    process_name: str
    #: The ``process`` span's attributes but the attempt's own (copied, never changed).
    common: dict[str, str | int | float | bool]


@functools.lru_cache(maxsize=1024)
def _on_queue(
    store_url: str, queue: str, workflow_id: str, workflow_name: str, epoch: int
) -> _OnQueue:
    trace = ids.trace_id(workflow_id)
    return _OnQueue(
        trace=trace,
        trace_part=ids.traceparent(trace, 0)[:36],
        run_span=ids.run_span_id(workflow_id, epoch),
        wait_name=f"wait {queue}",
        process_name=f"process {queue}",
        common=spans.attempt_common(store_url, "process", queue, workflow_id, workflow_name),
    )


class Attempt(msgspec.Struct):
    """An attempt being traced on this worker.

    Its ``process`` span is emitted when it ends, with the id chosen when it began: the
    task runs inside it through its traceparent (a Python task's context, a shell
    task's environment), so nothing needs a live span meanwhile.
    """

    task: TaskMessage
    queue: str
    name: str
    traceparent: str = ""
    span_id: int = 0
    started_at: float = 0.0
    attributes: dict[str, str | int | float | bool] = msgspec.field(default_factory=dict)
    links: tuple[SpanRef, ...] = ()
    on_queue: _OnQueue | None = None


def begin(store_url: str, task: TaskMessage, queue: str, received_at: float, now: float) -> Attempt:
    """An attempt starts: its wait in the queue (span and metric) ends at ``received_at``;
    its ``process QUEUE`` span starts, under the run's span, linked to its ``send``."""
    name = keys.attempt_name(task.name, item=task.item_index, undo=task.undo)
    attempt = Attempt(task, queue, name)
    recorder = metrics.current()
    if recorder is not None and task.due_at:
        recorder.waited(queue, received_at - task.due_at, task.workflow_id)
    if not tracing.enabled():
        return attempt
    shared = _on_queue(store_url, queue, task.workflow_id, task.workflow_name, task.epoch)
    trace = shared.trace
    sent: SpanRef | None = None
    traceparent = task.traceparent
    if traceparent:  # as the coordinator makes it (a quick check), or any other
        span = 0
        if len(traceparent) == 55 and traceparent.startswith(shared.trace_part):
            try:
                span = int(traceparent[36:52], 16)
            except ValueError:
                span = 0
        sent = (trace, span) if span else ids.parse_traceparent(traceparent)
    if sent is not None and task.due_at:
        tracing.emit(
            shared.wait_name,
            trace=trace,
            parent=sent[1],
            start_s=task.due_at,
            end_s=received_at,
            attributes={"dagq.task.name": name, "dagq.attempt": task.attempt},
        )
    span_id = attempt.span_id = ids.new_span_id()
    attempt.traceparent = f"{shared.trace_part}{span_id:016x}-01"
    attempt.started_at = now
    attempt.attributes = {**shared.common, "dagq.task.name": name, "dagq.attempt": task.attempt}
    attempt.links = () if sent is None else (sent,)
    attempt.on_queue = shared
    return attempt


def end(
    attempt: Attempt, *, ok: bool, duration_s: float, error_type: str | None, end_s: float
) -> None:
    """An attempt ended (its report is made)."""
    recorder = metrics.current()
    if recorder is not None:
        recorder.task_finished(attempt.queue, ok, duration_s, attempt.task.workflow_id)
    shared = attempt.on_queue
    if attempt.span_id and shared is not None and tracing.enabled():
        tracing.emit(
            shared.process_name,
            trace=shared.trace,
            span_id=attempt.span_id,
            parent=shared.run_span,
            kind="consumer",
            start_s=attempt.started_at,
            end_s=end_s,
            attributes=attempt.attributes,
            links=attempt.links,
            error=None if ok else (error_type or "task_failed"),
        )
        attempt.span_id = 0
