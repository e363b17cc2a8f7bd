"""The worker's side of telemetry: an attempt's queue wait and its ``process`` span,
and the task metrics (docs/architecture.md §7).

An attempt's hooks (:func:`begin`, :func:`end`) do only what cannot wait — its span id
and traceparent, for the task to run in — and leave the rest (its metrics, its spans)
to :func:`fold`, which does it for many attempts at once."""

from __future__ import annotations

import collections
import functools
import random
import threading
from typing import Any

import msgspec

from dagq import keys
from dagq.messages import TaskMessage
from dagq.observability import ids, metrics, spans, tracing
from dagq.observability.tracing import SpanRef

_new_id = random.getrandbits
_trace_part = ids.run_trace_part
_SAMPLED = ids.SAMPLED_END


class _OnQueue(msgspec.Struct, frozen=True):
    """What every traced attempt of one run's epoch on one queue shares, made once."""

    workflow_id: str
    epoch: int
    queue: str
    store_url: str
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
        workflow_id=workflow_id,
        epoch=epoch,
        queue=queue,
        store_url=store_url,
        trace=trace,
        trace_part=ids.trace_part(trace),
        run_span=ids.run_span_id(workflow_id, epoch),
        wait=(f"wait {queue}", "internal", trace, ()),
        process=(f"process {queue}", "consumer", trace, tuple(common.items())),
    )


class Attempt(msgspec.Struct, gc=False):
    """An attempt being counted and traced on this worker.

    Its spans (the ``wait`` span and the ``process`` span) are emitted after it ends,
    with others' in one record (:data:`tracing.Ran`), with the id chosen when it
    began: the task runs inside the ``process`` span through its traceparent (a Python
    task's context, a shell task's environment), so nothing needs a live span
    meanwhile. (Not tracked by the garbage collector: it refers to
    nothing that refers back to it.)
    """

    task: TaskMessage
    queue: str
    name: str
    traceparent: str = ""
    #: The ``process`` span's id: 0 once its spans are on their way (or when untraced).
    span_id: int = 0
    started_at: float = 0.0
    #: When the message was received (the end of its ``wait`` span).
    received_at: float = 0.0
    store_url: str = ""


#: An ended attempt waiting to be counted and traced: the attempt, its ``process`` span's
#: id (0: untraced), whether it succeeded, how long it ran, its error type, its end.
_Ended = tuple[Attempt, int, bool, float, str | None, float]

#: How many ended attempts wait for :func:`fold` at most (on the event loop that ends
#: them); the span forwarder's thread, a scrape of the metrics and a flush fold sooner.
FOLD_AT = 256


class _Backlog:
    """Attempts begun (their queue wait to count) and ended (their metrics and spans),
    not yet folded. Appended to by the event loop; emptied by :func:`fold`, in any
    thread: a deque's ``append`` and ``popleft`` need no lock, the folding does (the
    metrics are updated in place)."""

    def __init__(self) -> None:
        self.began: collections.deque[Attempt] = collections.deque()
        self.ended: collections.deque[_Ended] = collections.deque()
        self.lock = threading.Lock()


_backlog = _Backlog()


def begin(store_url: str, task: TaskMessage, queue: str, received_at: float, now: float) -> Attempt:
    """An attempt starts: its wait in the queue ended at ``received_at`` (counted at the
    next :func:`fold`; its span is emitted with its ``process`` span); its ``process
    QUEUE`` span starts now, under the run's span, linked to its ``send``."""
    name = keys.attempt_name(task.name, item=task.item_index, undo=task.undo)
    span_id, traceparent = 0, ""
    if tracing.enabled():
        span_id = _new_id(64) or 1  # as ids.new_span_id draws it
        # As ids.traceparent_of writes it (inline: attempts begin by the thousand).
        traceparent = _trace_part(task.workflow_id) + span_id.to_bytes(8, "big").hex() + _SAMPLED
    attempt = Attempt(task, queue, name, traceparent, span_id, now, received_at, store_url)
    if task.due_at and metrics.current() is not None:
        began = _backlog.began
        began.append(attempt)
        if len(began) >= FOLD_AT:  # attempts that never end here must not pile up
            fold()
    return attempt


def end(
    attempt: Attempt, *, ok: bool, duration_s: float, error_type: str | None, end_s: float
) -> None:
    """An attempt ended (its report is made): it is counted, and its spans emitted, at
    the next :func:`fold` — at once if traced with no span forwarder (whose thread folds
    every moment) in this process: the SDK's processors in process."""
    attempt.span_id, span_id = 0, attempt.span_id
    if not span_id and metrics.current() is None:
        return
    ended = _backlog.ended
    ended.append((attempt, span_id, ok, duration_s, error_type, end_s))
    if len(ended) >= FOLD_AT or (span_id and not tracing.forwarding()):
        fold()


def fold() -> None:
    """Count the attempts begun and ended since the last fold, and emit the ended ones'
    spans: a few tight loops over many attempts, instead of the same work spread over
    the event loop between everything else it does (three to four times as long
    there), and one :data:`tracing.Ran` record for the attempts of a run on a queue
    instead of one record each. Called by the event loop every :data:`FOLD_AT`
    attempts, by the span forwarder before it sends, before the metrics are scraped,
    before a flush, and when a worker stops."""
    backlog = _backlog
    began, ended = backlog.began, backlog.ended
    if not began and not ended:
        return
    with backlog.lock:
        recorder = metrics.current()
        for _ in range(len(began)):
            attempt = began.popleft()
            if recorder is not None:
                task = attempt.task
                recorder.waited(
                    attempt.queue,
                    attempt.received_at - task.due_at,
                    task.workflow_id,
                    attempt.started_at,
                )
        finished = None if recorder is None else recorder.task_finished
        traced = tracing.enabled()
        shared: _OnQueue | None = None
        flat: list[Any] = []
        for _ in range(len(ended)):
            attempt, span_id, ok, duration_s, error_type, end_s = ended.popleft()
            task = attempt.task
            if finished is not None:
                finished(attempt.queue, ok, duration_s, task.workflow_id, end_s)
            if not span_id or not traced:
                continue
            # The attempts of one run on one queue come together: their shapes are
            # found once (a message's strings are new ones each time: the cache's
            # lookup would hash them; comparing them is cheaper).
            if (
                shared is None
                or task.workflow_id != shared.workflow_id
                or task.epoch != shared.epoch
                or attempt.queue != shared.queue
                or attempt.store_url != shared.store_url
            ):
                if flat:
                    _ran(shared, flat)
                    flat = []
                shared = _on_queue(
                    attempt.store_url,
                    attempt.queue,
                    task.workflow_id,
                    task.workflow_name,
                    task.epoch,
                )
            error = None if ok else (error_type or "task_failed")
            traceparent = task.traceparent
            linked = 0
            if len(traceparent) == 55 and traceparent.startswith(shared.trace_part):
                linked = _span_of(traceparent)  # as the coordinator makes it: a quick look
            if not linked and traceparent:  # not as the coordinator makes it: parsed
                sent = ids.parse_traceparent(traceparent)
                if sent is not None and sent[0] != shared.trace:
                    _linked_elsewhere(attempt, span_id, shared, sent, error=error, end_s=end_s)
                    continue
                linked = 0 if sent is None else sent[1]
            flat += (
                span_id,
                linked,
                attempt.started_at,
                end_s,
                attempt.name,
                task.attempt,
                error,
                task.due_at,
                attempt.received_at,
            )
        if flat:
            _ran(shared, flat)


def _span_of(traceparent: str) -> int:
    """The span id of a 55-character traceparent (0 if it is not hexadecimal)."""
    try:
        return int(traceparent[36:52], 16)
    except ValueError:
        return 0


def _ran(shared: _OnQueue | None, flat: list[Any]) -> None:
    assert shared is not None
    tracing.emit_ran((shared.process, shared.wait, shared.run_span, flat))


tracing.before_export.append(fold)
metrics.before_scrape.append(fold)


def _sent(task: TaskMessage, shared: _OnQueue) -> SpanRef | None:
    """The ``send`` span a task message names (its traceparent's), if it names one."""
    traceparent = task.traceparent
    if not traceparent:
        return None
    if len(traceparent) == 55 and traceparent.startswith(shared.trace_part):
        span = _span_of(traceparent)  # as the coordinator makes it: a quick look
        if span:
            return shared.trace, span
    return ids.parse_traceparent(traceparent)


def _linked_elsewhere(
    attempt: Attempt,
    span_id: int,
    shared: _OnQueue,
    sent: SpanRef,
    *,
    error: str | None,
    end_s: float,
) -> None:
    """The spans of an attempt whose message names a send of another trace (a message
    not made by dagq's coordinator): its ``wait`` span, and its ``process`` span linked
    to that send."""
    _waited(attempt, span_id, shared, sent)
    name, trace, span_id, parent, kind, attributes, _, _, _, error = tracing.expand(
        (
            shared.process,
            span_id,
            shared.run_span,
            attempt.started_at,
            end_s,
            attempt.name,
            attempt.task.attempt,
            0,
            error,
        )
    )
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
    not be made): its ``wait`` span is emitted alone, now (its message comes back, and
    its next attempt is traced afresh)."""
    if attempt.span_id and tracing.enabled():
        attempt.span_id, span_id = 0, attempt.span_id
        task = attempt.task
        shared = _on_queue(
            attempt.store_url, attempt.queue, task.workflow_id, task.workflow_name, task.epoch
        )
        _waited(attempt, span_id, shared, _sent(task, shared))


def _waited(attempt: Attempt, span_id: int, shared: _OnQueue, sent: SpanRef | None) -> None:
    """The ``wait`` span of an attempt alone (as a :data:`tracing.Ran` record makes
    it), when it has one: its message named its send, and when it was due."""
    due = attempt.task.due_at
    if sent is None or not due:
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
