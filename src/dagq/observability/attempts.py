"""The worker's side of telemetry: an attempt's queue wait and its ``process`` span,
and the task metrics (docs/architecture.md §7)."""

from __future__ import annotations

import functools
import random

import msgspec

from dagq import keys
from dagq.messages import TaskMessage
from dagq.observability import ids, metrics, spans, tracing
from dagq.observability.tracing import SpanRef

_new_id = random.getrandbits


class _OnQueue(msgspec.Struct, frozen=True):
    """What every traced attempt of one run's epoch on one queue shares, made once."""

    trace: int
    #: ``00-TRACE-``: a traceparent of this trace up to its span id.
    trace_part: str
    run_span: int
    #: The ``wait QUEUE`` and ``process QUEUE`` spans' shapes (:data:`tracing.Shape`).
    wait: tracing.Shape
    process: tracing.Shape


@functools.lru_cache(maxsize=1024)
def _on_queue(
    store_url: str, queue: str, workflow_id: str, workflow_name: str, epoch: int
) -> _OnQueue:
    trace = ids.trace_id(workflow_id)
    common = spans.attempt_common(store_url, "process", queue, workflow_id, workflow_name)
    return _OnQueue(
        trace=trace,
        trace_part=ids.trace_part(trace),
        run_span=ids.run_span_id(workflow_id, epoch),
        wait=(f"wait {queue}", "internal", trace, ()),
        process=(f"process {queue}", "consumer", trace, tuple(common.items())),
    )


class Attempt(msgspec.Struct):
    """An attempt being traced on this worker.

    Its spans are emitted when it ends, in one record (:data:`tracing.Attempted`: the
    ``wait`` span and the ``process`` span, told apart by the span helper), with the id
    chosen when it began: the task runs inside the ``process`` span through its
    traceparent (a Python task's context, a shell task's environment), so nothing
    needs a live span meanwhile.
    """

    task: TaskMessage
    queue: str
    name: str
    traceparent: str = ""
    span_id: int = 0
    started_at: float = 0.0
    #: When the message was received (the end of its ``wait`` span).
    received_at: float = 0.0
    #: The attempt's ``send`` span (what its ``process`` span links to), if known.
    sent: SpanRef | None = None
    on_queue: _OnQueue | None = None


def begin(store_url: str, task: TaskMessage, queue: str, received_at: float, now: float) -> Attempt:
    """An attempt starts: its wait in the queue (metric now, span at its end) ended at
    ``received_at``; its ``process QUEUE`` span starts, under the run's span, linked to
    its ``send``."""
    name = keys.attempt_name(task.name, item=task.item_index, undo=task.undo)
    due = task.due_at
    recorder = metrics.current()
    if recorder is not None and due:
        recorder.waited(queue, received_at - due, task.workflow_id, now)
    if not tracing.enabled():
        return Attempt(task, queue, name)
    shared = _on_queue(store_url, queue, task.workflow_id, task.workflow_name, task.epoch)
    sent: SpanRef | None = None
    traceparent = task.traceparent
    if traceparent:  # as the coordinator makes it (a quick check), or any other
        span = 0
        if len(traceparent) == 55 and traceparent.startswith(shared.trace_part):
            try:
                span = int(traceparent[36:52], 16)
            except ValueError:
                span = 0
        sent = (shared.trace, span) if span else ids.parse_traceparent(traceparent)
    span_id = _new_id(64) or 1  # as ids.new_span_id draws it
    # As ids.traceparent_of writes it (inline: an attempt's hooks are made by the thousand).
    traceparent = shared.trace_part + span_id.to_bytes(8, "big").hex() + ids.SAMPLED_END
    return Attempt(task, queue, name, traceparent, span_id, now, received_at, sent, shared)


def end(
    attempt: Attempt, *, ok: bool, duration_s: float, error_type: str | None, end_s: float
) -> None:
    """An attempt ended (its report is made): its spans are emitted."""
    recorder = metrics.current()
    if recorder is not None:
        recorder.task_finished(attempt.queue, ok, duration_s, attempt.task.workflow_id, end_s)
    shared = attempt.on_queue
    if shared is None or not attempt.span_id or not tracing.enabled():
        return
    attempt.span_id, span_id = 0, attempt.span_id
    sent = attempt.sent
    error = None if ok else (error_type or "task_failed")
    task = attempt.task
    if sent is not None and sent[0] == shared.trace:
        due = task.due_at
        if due:  # both spans in one record
            tracing.emit_shaped(
                (
                    shared.process,
                    span_id,
                    shared.run_span,
                    attempt.started_at,
                    end_s,
                    attempt.name,
                    task.attempt,
                    sent[1],
                    error,
                    shared.wait,
                    due,
                    attempt.received_at,
                )
            )
            return
    else:
        _waited(attempt, span_id)
    span: tracing.Shaped = (
        shared.process,
        span_id,
        shared.run_span,
        attempt.started_at,
        end_s,
        attempt.name,
        task.attempt,
        0 if sent is None else sent[1],
        error,
    )
    if sent is None or sent[0] == shared.trace:
        tracing.emit_shaped(span)
    else:  # linked to a send of another trace (a message not made by dagq's coordinator)
        name, trace, span_id, parent, kind, attributes, _, _, _, error = tracing.expand(span)
        tracing.emit(
            name,
            trace=trace,
            span_id=span_id,
            parent=parent,
            kind=kind,
            start_s=attempt.started_at,
            end_s=end_s,
            attributes=attributes,
            links=(sent,),
            error=error,
        )


def abandoned(attempt: Attempt) -> None:
    """An attempt that began here will not end here (the worker stops, its report could
    not be made): its ``wait`` span is emitted alone (its message comes back, and its
    next attempt is traced afresh)."""
    if attempt.span_id and attempt.on_queue is not None and tracing.enabled():
        attempt.span_id, span_id = 0, attempt.span_id
        _waited(attempt, span_id)


def _waited(attempt: Attempt, span_id: int) -> None:
    """The ``wait`` span of an attempt alone (as an :data:`tracing.Attempted` record
    makes it), when it has one: its message named its send, and when it was due."""
    shared, sent, due = attempt.on_queue, attempt.sent, attempt.task.due_at
    if shared is None or sent is None or not due:
        return
    tracing.emit_shaped(
        (
            shared.wait,
            tracing.wait_span_id(span_id),
            sent[1],
            due,
            attempt.received_at,
            attempt.name,
            attempt.task.attempt,
            0,
            None,
        )
    )
