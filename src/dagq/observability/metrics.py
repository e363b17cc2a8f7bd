"""Prometheus metrics behind one small seam; nothing at all when they are off.

Metrics are on in a process started with ``--metrics-port`` (``dagq coordinator``,
``worker``, ``server``, ``run``) and the ``otel`` extra installed: :func:`serve` then
makes the metrics below and serves them at ``/metrics`` (Prometheus text, or
OpenMetrics with exemplars when the scraper asks for it). Otherwise :func:`current`
is None and the runtime's hooks skip the work.

Names follow Prometheus' conventions: the ``dagq_`` prefix, base units, ``_total``
counters, ``_seconds`` histograms, and labels of low cardinality (a queue, a status,
a store): never a workflow id. Histograms carry the run's trace id as an exemplar.
"""

from __future__ import annotations

import bisect
import functools
import logging
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dagq.observability import ids

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

log = logging.getLogger("dagq.observability")

#: Buckets for task durations and queue waits: from 5 ms to an hour.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
#: Buckets for coordinator batches: from half a millisecond to 10 s.
BATCH_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10)

#: An exemplar at most this often per bucket of a series (see :func:`_exemplar`).
EXEMPLAR_EVERY_S = 1.0

#: Every metric dagq exports: name (as exposed) → help. The Grafana dashboard
#: (docs/grafana/dagq.json) queries only these.
METRICS: dict[str, str] = {
    "dagq_tasks_finished_total": "Attempts finished by workers, by queue and status (ok, failed).",
    "dagq_task_duration_seconds": "How long attempts ran on a worker, by queue.",
    "dagq_queue_wait_seconds": "How long task messages waited in their queue (due to received).",
    "dagq_queue_depth": "Messages in a queue (visible and in flight).",
    "dagq_queue_oldest_message_age_seconds": "Age of the oldest message in a queue.",
    "dagq_workflows": "Unfinished workflows the coordinator is advancing, by status.",
    "dagq_workflows_finished_total": "Workflows that ended, by final status.",
    "dagq_coordinator_batch_seconds": "How long the coordinator took per batch of events.",
    "dagq_coordinator_lease_held": "1 while this coordinator holds the lease, else 0.",
    "dagq_storage_requests_total": "Storage operations made, by store and kind.",
    "dagq_dead_letters": "Messages in the dead-letter queue, by the queue they died on.",
    "dagq_workers": "Live workers serving a queue (from their records).",
    "dagq_event_loop_lag_seconds": "How late this process's event loop last woke up.",
}


@dataclass(frozen=True, slots=True)
class Metrics:
    """The metric objects of one process (one registry)."""

    registry: CollectorRegistry
    tasks_finished: Any
    task_duration: Any
    queue_wait: Any
    queue_depth: Any
    queue_oldest: Any
    workflows: Any
    workflows_finished: Any
    batch: Any
    lease_held: Any
    storage_requests: Any
    dead_letters: Any
    workers: Any
    loop_lag: Any

    def task_finished(self, queue: str, ok: bool, duration_s: float, workflow_id: str) -> None:
        """An attempt ended on this worker."""
        finished = _child(self.tasks_finished, queue, "ok" if ok else "failed")
        finished.inc(1, exemplar=_exemplar(finished, 0, workflow_id))
        _observe(_child(self.task_duration, queue), DURATION_BUCKETS, duration_s, workflow_id)

    def waited(self, queue: str, seconds: float, workflow_id: str) -> None:
        """A task message was received ``seconds`` after it was due."""
        _observe(_child(self.queue_wait, queue), DURATION_BUCKETS, seconds, workflow_id)

    def workflow_finished(self, status: str, workflow_id: str) -> None:
        """A workflow reached a final status."""
        finished = _child(self.workflows_finished, status)
        finished.inc(1, exemplar=_exemplar(finished, 0, workflow_id))


@functools.lru_cache(maxsize=1024)
def _child(metric: Any, *labels: str) -> Any:
    """``metric.labels(*labels)``, made once: a per-attempt hook then costs a lookup."""
    return metric.labels(*labels)


def _observe(child: Any, buckets: tuple[float, ...], seconds: float, workflow_id: str) -> None:
    seconds = max(seconds, 0.0)
    exemplar = _exemplar(child, bisect.bisect_left(buckets, seconds), workflow_id)
    child.observe(seconds, exemplar=exemplar)


#: When each series' bucket last got an exemplar (``id`` of the series, bucket).
_exemplified: dict[tuple[int, int], float] = {}


def _exemplar(series: Any, bucket: int, workflow_id: str) -> dict[str, str] | None:
    """The run's trace id as an exemplar, for at most one observation a second per
    bucket of a series: Prometheus keeps only a bucket's latest one, and checking one
    costs prometheus-client more than the observation (a bucket seldom hit, the slow
    outlier one wants a trace of, always gets its own)."""
    key = (id(series), bucket)
    now = time.monotonic()
    if now - _exemplified.get(key, -EXEMPLAR_EVERY_S) < EXEMPLAR_EVERY_S:
        return None
    _exemplified[key] = now
    return {"trace_id": ids.trace_hex(workflow_id)}


class _Slot:
    metrics: Metrics | None = None


_slot = _Slot()


def current() -> Metrics | None:
    """This process's metrics, or None when they are off."""
    return _slot.metrics


def create() -> Metrics:
    """Make this process's metrics (in a registry of their own) and switch them on."""
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

    registry = CollectorRegistry(auto_describe=True)

    def help_of(name: str) -> str:
        return METRICS[name]

    def counter(name: str, labels: tuple[str, ...]) -> Any:
        return Counter(name.removesuffix("_total"), help_of(name), labels, registry=registry)

    def gauge(name: str, labels: tuple[str, ...] = ()) -> Any:
        return Gauge(name, help_of(name), labels, registry=registry)

    def histogram(name: str, labels: tuple[str, ...], buckets: tuple[float, ...]) -> Any:
        return Histogram(name, help_of(name), labels, registry=registry, buckets=buckets)

    _slot.metrics = Metrics(
        registry=registry,
        tasks_finished=counter("dagq_tasks_finished_total", ("queue", "status")),
        task_duration=histogram("dagq_task_duration_seconds", ("queue",), DURATION_BUCKETS),
        queue_wait=histogram("dagq_queue_wait_seconds", ("queue",), DURATION_BUCKETS),
        queue_depth=gauge("dagq_queue_depth", ("queue",)),
        queue_oldest=gauge("dagq_queue_oldest_message_age_seconds", ("queue",)),
        workflows=gauge("dagq_workflows", ("status",)),
        workflows_finished=counter("dagq_workflows_finished_total", ("status",)),
        batch=histogram("dagq_coordinator_batch_seconds", (), BATCH_BUCKETS),
        lease_held=gauge("dagq_coordinator_lease_held"),
        storage_requests=counter("dagq_storage_requests_total", ("store", "kind")),
        dead_letters=gauge("dagq_dead_letters", ("queue",)),
        workers=gauge("dagq_workers", ("queue",)),
        loop_lag=gauge("dagq_event_loop_lag_seconds"),
    )
    return _slot.metrics


def disable() -> None:
    """Switch metrics off in this process (tests)."""
    _slot.metrics = None
    _child.cache_clear()
    _exemplified.clear()


def serve(port: int) -> Metrics:
    """Make the metrics and serve them on ``port`` at ``/metrics``, on the address
    ``DAGQ_METRICS_ADDR`` names (default 127.0.0.1: set it to 0.0.0.0 for a scraper on
    another machine). Raises ImportError without the ``otel`` extra."""
    from prometheus_client import start_http_server

    metrics = _slot.metrics or create()
    address = os.environ.get("DAGQ_METRICS_ADDR", "127.0.0.1")
    start_http_server(port, addr=address, registry=metrics.registry)
    log.info("metrics at http://%s:%d/metrics", address, port)
    return metrics
