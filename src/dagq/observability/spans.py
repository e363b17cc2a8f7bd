"""The spans of a run, made where the runtime knows what happened (docs/architecture.md §7).

One trace per run (:mod:`dagq.observability.ids`)::

    submit                          the client (or the server) stored the workflow
    └── run                         activation → final status, one per epoch
        ├── send QUEUE              the coordinator sent an attempt (producer)
        │   └── wait QUEUE          the message waited in its queue (due → received)
        ├── process QUEUE           a worker ran the attempt (consumer; linked to its send)
        │   └── (the task's own spans: a Python task runs inside it)
        └── wait signal|timer       a task waited for a signal or a timer

Coordinator batches (``process _completions``) are traces of their own, linked to the
runs they advanced. Attributes follow OpenTelemetry's messaging conventions, with
``messaging.system`` naming the store (``dagq.sqlite``, ``dagq.azure``, ...), plus
``dagq.workflow.id``, ``dagq.workflow.name``, ``dagq.task.name``, ``dagq.attempt``,
``dagq.queue``, and ``error.type`` on failures. Every function returns at once when
tracing is off.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence

from dagq.observability import ids, tracing
from dagq.observability.tracing import Attributes, SpanRef

#: Links a batch span keeps at most (one per workflow it advanced).
MAX_BATCH_LINKS = 32


def system(store_url: str) -> str:
    """``messaging.system`` for a store: ``dagq.`` and its URL's scheme."""
    return "dagq." + (store_url.split(":", 1)[0] or "store")


def run_attributes(workflow_id: str, workflow_name: str) -> dict[str, str | int | float | bool]:
    """The attributes every span of a run has."""
    return {"dagq.workflow.id": workflow_id, "dagq.workflow.name": workflow_name}


def attempt_attributes(
    *,
    store_url: str,
    operation: str,
    queue: str,
    workflow_id: str,
    workflow_name: str,
    task: str,
    attempt: int,
) -> dict[str, str | int | float | bool]:
    """Attributes of an attempt's ``process`` span."""
    common = attempt_common(store_url, operation, queue, workflow_id, workflow_name)
    return {**common, "dagq.task.name": task, "dagq.attempt": attempt}


@functools.lru_cache(maxsize=1024)
def attempt_common(
    store_url: str, operation: str, queue: str, workflow_id: str, workflow_name: str
) -> dict[str, str | int | float | bool]:
    """What the attempts of a run on a queue share, made once (copy it: never change
    it)."""
    out = run_attributes(workflow_id, workflow_name)
    out.update(
        {
            "messaging.system": system(store_url),
            "messaging.operation.type": operation,
            "messaging.destination.name": queue,
            "dagq.queue": queue,
        }
    )
    return out


def submitted(workflow_id: str, workflow_name: str, start_s: float, end_s: float) -> None:
    """The trace's root: a client stored the workflow (linked to the caller's span, if
    there is one)."""
    if not tracing.enabled():
        return
    trace = ids.trace_id(workflow_id)
    caller = _current()
    tracing.emit(
        "submit",
        trace=trace,
        span_id=ids.submit_span_id(workflow_id),
        kind="producer",
        start_s=start_s,
        end_s=end_s,
        attributes=run_attributes(workflow_id, workflow_name),
        links=() if caller is None or caller[0] == trace else (caller,),
    )


def run_ended(
    workflow_id: str,
    workflow_name: str,
    *,
    epoch: int,
    status: str,
    start_s: float,
    end_s: float,
    error: str | None = None,
) -> None:
    """The run span of one epoch: from activation (or the epoch's start) to its end."""
    if not tracing.enabled():
        return
    attributes = run_attributes(workflow_id, workflow_name)
    attributes["dagq.workflow.status"] = status
    attributes["dagq.workflow.epoch"] = epoch
    failed = status not in ("completed", "running")
    tracing.emit(
        "run",
        trace=ids.trace_id(workflow_id),
        span_id=ids.run_span_id(workflow_id, epoch),
        parent=ids.submit_span_id(workflow_id),
        start_s=start_s,
        end_s=end_s,
        attributes=attributes,
        error=(error or f"workflow_{status}") if failed else None,
    )


def sent(
    store_url: str,
    *,
    workflow_id: str,
    workflow_name: str,
    epoch: int,
    queue: str,
    sends: Iterable[tuple[int, str, int, str]],
    start_s: float,
    end_s: float,
) -> None:
    """``send QUEUE`` spans: (span id, attempt name, attempt, message id) per message."""
    if not tracing.enabled():
        return
    flat: list[int | str] = []
    for span_id, name, attempt, _message_id in sends:
        if span_id:
            flat += (span_id, name, attempt)
    sent_flat(store_url, workflow_id, epoch, queue, flat, start_s=start_s, end_s=end_s)


def sent_flat(
    store_url: str,
    workflow_id: str,
    epoch: int,
    queue: str,
    flat: list[int | str],
    *,
    start_s: float,
    end_s: float,
) -> None:
    """``send QUEUE`` spans of one step, in one record (:data:`tracing.Sends`): ``flat``
    holds each span's id (never 0), attempt name and attempt, one after the other."""
    if flat and tracing.enabled():
        parent = ids.run_span_id(workflow_id, epoch)
        tracing.emit_shaped(
            (send_shape(store_url, queue, workflow_id), parent, start_s, end_s, flat)
        )


@functools.lru_cache(maxsize=1024)
def send_shape(store_url: str, queue: str, workflow_id: str) -> tracing.Shape:
    """What a run's ``send QUEUE`` spans share (:data:`tracing.Shape`). Spans made by
    the thousand carry what tells them apart; the run's span and the process spans
    carry the rest (workflow id and name, dagq.queue)."""
    common = (
        ("messaging.system", system(store_url)),
        ("messaging.operation.type", "send"),
        ("messaging.destination.name", queue),
    )
    return (f"send {queue}", "producer", ids.trace_id(workflow_id), common)


def waited(
    name: str, *, workflow_id: str, workflow_name: str, epoch: int, start_s: float, end_s: float
) -> None:
    """A task waited for a signal or a timer (``wait signal`` / ``wait timer``)."""
    if not tracing.enabled():
        return
    tracing.emit(
        f"wait {name}",
        trace=ids.trace_id(workflow_id),
        parent=ids.run_span_id(workflow_id, epoch),
        start_s=start_s,
        end_s=end_s,
        attributes=run_attributes(workflow_id, workflow_name),
    )


def batch(
    store_url: str, message_count: int, *, workflow_ids: Sequence[str], start_s: float, end_s: float
) -> None:
    """A coordinator batch (``process _completions``), linked to the runs it advanced."""
    if not tracing.enabled():
        return
    links: list[SpanRef] = [
        (ids.trace_id(w), ids.run_span_id(w)) for w in workflow_ids[:MAX_BATCH_LINKS]
    ]
    attributes: Attributes = {
        "messaging.system": system(store_url),
        "messaging.operation.type": "process",
        "messaging.destination.name": "_completions",
        "messaging.batch.message_count": message_count,
    }
    tracing.emit(
        "process _completions",
        trace=ids.new_span_id() << 64 | ids.new_span_id(),
        kind="consumer",
        start_s=start_s,
        end_s=end_s,
        attributes=attributes,
        links=links,
    )


def _current() -> SpanRef | None:
    try:
        from opentelemetry import trace
    except ImportError:
        return None
    context = trace.get_current_span().get_span_context()
    return (context.trace_id, context.span_id) if context.is_valid else None
