"""The worker's side of telemetry: an attempt's queue wait and its ``process`` span,
and the task metrics (docs/architecture.md §7)."""

from __future__ import annotations

from dataclasses import dataclass, field

from dagq import keys
from dagq.messages import TaskMessage
from dagq.observability import ids, metrics, spans, tracing
from dagq.observability.tracing import SpanRef


@dataclass(slots=True)
class Attempt:
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
    attributes: dict[str, str | int | float | bool] = field(default_factory=dict)
    links: tuple[SpanRef, ...] = ()


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
    trace = ids.trace_id(task.workflow_id)
    sent: SpanRef | None = None
    if task.traceparent:  # as the coordinator makes it (a quick check), or any other
        span = ids.span_in(task.traceparent, trace)
        sent = (trace, span) if span else ids.parse_traceparent(task.traceparent)
    if sent is not None and task.due_at:
        tracing.emit(
            f"wait {queue}",
            trace=trace,
            parent=sent[1],
            start_s=task.due_at,
            end_s=received_at,
            attributes={"dagq.task.name": name, "dagq.attempt": task.attempt},
        )
    attempt.span_id = ids.new_span_id()
    attempt.traceparent = ids.traceparent(trace, attempt.span_id)
    attempt.started_at = now
    attempt.attributes = spans.attempt_attributes(
        store_url=store_url,
        operation="process",
        queue=queue,
        workflow_id=task.workflow_id,
        workflow_name=task.workflow_name,
        task=name,
        attempt=task.attempt,
    )
    attempt.links = () if sent is None else (sent,)
    return attempt


def end(
    attempt: Attempt, *, ok: bool, duration_s: float, error_type: str | None, end_s: float
) -> None:
    """An attempt ended (its report is made)."""
    recorder = metrics.current()
    if recorder is not None:
        recorder.task_finished(attempt.queue, ok, duration_s, attempt.task.workflow_id)
    if attempt.span_id and tracing.enabled():
        task = attempt.task
        tracing.emit(
            f"process {attempt.queue}",
            trace=ids.trace_id(task.workflow_id),
            span_id=attempt.span_id,
            parent=ids.run_span_id(task.workflow_id, task.epoch),
            kind="consumer",
            start_s=attempt.started_at,
            end_s=end_s,
            attributes=attempt.attributes,
            links=attempt.links,
            error=None if ok else (error_type or "task_failed"),
        )
        attempt.span_id = 0
