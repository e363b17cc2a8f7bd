"""Prometheus metrics behind one small seam; nothing at all when they are off.

Metrics are on in a process started with ``--metrics-port`` (``dagq coordinator``,
``worker``, ``server``, ``run``) and the ``otel`` extra installed: :func:`serve` then
makes the metrics below and serves them at ``/metrics`` (Prometheus text, or
OpenMetrics with exemplars when the scraper asks for it). Otherwise :func:`current`
is None and the runtime's hooks skip the work.

Names follow Prometheus' conventions: the ``dagq_`` prefix, base units, ``_total``
counters, ``_seconds`` histograms, and labels of low cardinality (a queue, a status,
a store): never a workflow id. Histograms carry the run's trace id as an exemplar.

The metrics a worker and a coordinator move at every attempt (tasks finished, task
durations, queue waits, workflows finished, batch durations, storage requests) are
kept in plain Python
(:class:`Tally`, :class:`Histogram`) and handed to prometheus-client only when it is
scraped: an observation is then a bisect and two list updates, not the client's
locks, label checks and exemplar checks (~5 µs each, three an attempt; README
"Observability"). The gauges, set by a sampler every few seconds, stay
prometheus-client's own.
"""

from __future__ import annotations

import bisect
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dagq.observability import ids

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

log = logging.getLogger("dagq.observability")

_now = time.time
_bucket = bisect.bisect_left

#: Buckets for task durations and queue waits: from 5 ms to an hour.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
#: Buckets for coordinator batches: from half a millisecond to 10 s.
BATCH_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10)

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


#: A series' latest exemplar: the workflow whose trace it names, the value, when.
Exemplar = tuple[str, float, float]


class Tally:
    """A counter family kept in plain Python (see the module's docstring): per label
    set, a count, when it was first counted, and the latest exemplar."""

    def __init__(self, name: str, help_text: str, labels: Sequence[str]) -> None:
        self.name, self.help, self.labels = name, help_text, tuple(labels)
        self.counts: dict[tuple[str, ...], float] = {}
        self.created: dict[tuple[str, ...], float] = {}
        self.exemplars: dict[tuple[str, ...], Exemplar] = {}

    def inc(self, labels: tuple[str, ...], workflow_id: str = "", at: float = 0.0) -> None:
        """Count one, of the run ``workflow_id`` (its trace is the exemplar), at ``at``
        (seconds since the epoch; 0: now)."""
        counts = self.counts
        count = counts.get(labels)
        if count is None:
            self.created[labels] = at or _now()
            count = 0.0
        counts[labels] = count + 1
        if workflow_id:
            self.exemplars[labels] = (workflow_id, 1.0, at or _now())

    def counter(self, labels: tuple[str, ...]) -> Callable[[], None]:
        """A function that counts one for ``labels`` (no exemplar): a dict update, for
        counts made by the thousand (storage requests)."""
        counts = self.counts
        self.created.setdefault(labels, time.time())
        counts.setdefault(labels, 0.0)

        def count() -> None:
            counts[labels] += 1

        return count

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.metrics_core import CounterMetricFamily

        family = CounterMetricFamily(self.name, self.help, labels=self.labels)
        for labels, count in list(self.counts.items()):
            exemplar = self.exemplars.get(labels)
            family.add_metric(
                labels,
                count,
                created=self.created.get(labels),
                exemplar=None if exemplar is None else _exemplar(exemplar),
            )
        yield family


class Histogram:
    """A histogram family kept in plain Python (see the module's docstring): per label
    set, a count per bucket, the sum, and each bucket's latest exemplar (Prometheus
    keeps only a bucket's latest one)."""

    def __init__(
        self, name: str, help_text: str, labels: Sequence[str], buckets: tuple[float, ...]
    ) -> None:
        self.name, self.help, self.labels = name, help_text, tuple(labels)
        self.buckets = buckets
        #: Label set → [count in each bucket (the last: above every bound)..., sum].
        self.series: dict[tuple[str, ...], list[float]] = {}
        self.exemplars: dict[tuple[str, ...], list[Exemplar | None]] = {}

    def observe(
        self, labels: tuple[str, ...], value: float, workflow_id: str = "", at: float = 0.0
    ) -> None:
        """Observe ``value`` (negative counts as 0), of the run ``workflow_id``, at
        ``at`` (seconds since the epoch, the exemplar's time; 0: now)."""
        value = value if value > 0.0 else 0.0  # max() is a call
        series, exemplars = self.series_of(labels)
        bucket = _bucket(self.buckets, value)
        series[bucket] += 1
        series[-1] += value
        if workflow_id:
            exemplars[bucket] = (workflow_id, value, at or _now())

    def series_of(self, labels: tuple[str, ...]) -> tuple[list[float], list[Exemplar | None]]:
        """The live lists of one label set (made empty if new): the counts by bucket
        and the sum, and each bucket's latest exemplar (what :meth:`observe` updates)."""
        series = self.series.get(labels)
        if series is None:
            series = self.series[labels] = [0.0] * (len(self.buckets) + 2)
            self.exemplars[labels] = [None] * (len(self.buckets) + 1)
        return series, self.exemplars[labels]

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.metrics_core import HistogramMetricFamily
        from prometheus_client.utils import floatToGoString

        bounds = [*(floatToGoString(b) for b in self.buckets), "+Inf"]  # type: ignore[no-untyped-call]
        family = HistogramMetricFamily(self.name, self.help, labels=self.labels)
        for labels, live in list(self.series.items()):
            counts = list(live)  # one copy: the counts and the sum agree
            exemplars = list(self.exemplars[labels])
            buckets: list[Any] = []
            total = 0.0
            for bound, count, exemplar in zip(bounds, counts[:-1], exemplars, strict=True):
                total += count
                if exemplar is None:
                    buckets.append((bound, total))
                else:
                    buckets.append((bound, total, _exemplar(exemplar)))
            family.add_metric(labels, buckets, sum_value=counts[-1])
        yield family


def _exemplar(exemplar: Exemplar) -> Any:
    from prometheus_client.samples import Exemplar as PrometheusExemplar

    workflow_id, value, at = exemplar
    return PrometheusExemplar({"trace_id": ids.trace_hex(workflow_id)}, value, at)


#: What counts observations made but not counted yet
#: (:func:`dagq.observability.attempts.fold`): called before each scrape.
before_scrape: list[Callable[[], None]] = []


class _Collector:
    """Hands the plain-Python families to a registry at each scrape (after
    :data:`before_scrape`)."""

    def __init__(self, families: Sequence[Tally | Histogram]) -> None:
        self.families = families

    def describe(self) -> list[Metric]:
        from prometheus_client.metrics_core import Metric

        kinds = {Tally: "counter", Histogram: "histogram"}
        return [
            Metric(f.name.removesuffix("_total"), f.help, kinds[type(f)]) for f in self.families
        ]

    def collect(self) -> Iterator[Metric]:
        for count_pending in before_scrape:
            count_pending()
        for family in self.families:
            yield from family.collect()


class _OnQueue:
    """What an attempt on one queue updates (:meth:`Metrics.task_finished`,
    :meth:`Metrics.waited`), found once by the queue's name: the label sets of its
    counts and the live lists of its histograms' series."""

    __slots__ = ("durations", "failed", "ok", "waits")

    def __init__(self, queue: str) -> None:
        self.ok, self.failed = (queue, "ok"), (queue, "failed")
        #: The histograms' series, made at their first observation (as ``observe``).
        self.durations: tuple[list[float], list[Exemplar | None]] | None = None
        self.waits: tuple[list[float], list[Exemplar | None]] | None = None


@dataclass(frozen=True, slots=True)
class Metrics:
    """The metric objects of one process (one registry)."""

    registry: CollectorRegistry
    tasks_finished: Tally
    task_duration: Histogram
    queue_wait: Histogram
    queue_depth: Any
    queue_oldest: Any
    workflows: Any
    workflows_finished: Tally
    batch: Histogram
    lease_held: Any
    storage_requests: Tally
    dead_letters: Any
    workers: Any
    loop_lag: Any
    #: Queue name → what its attempts update (made at its first).
    queues: dict[str, _OnQueue] = field(default_factory=dict)

    def _on(self, queue: str) -> _OnQueue:
        found = self.queues.get(queue)
        if found is None:
            found = self.queues[queue] = _OnQueue(queue)
        return found

    # The two calls a worker makes at every attempt update the queue's lists in place
    # (as Tally.inc and Histogram.observe would, a fraction of the time: no label
    # tuple to make and hash, no call per family).

    def task_finished(
        self, queue: str, ok: bool, duration_s: float, workflow_id: str, at: float = 0.0
    ) -> None:
        """An attempt ended on this worker (at ``at``, seconds since the epoch; 0: now)."""
        on = self.queues.get(queue) or self._on(queue)
        if not at:
            at = _now()
        labels = on.ok if ok else on.failed
        tally = self.tasks_finished
        counts = tally.counts
        count = counts.get(labels)
        if count is None:
            tally.created[labels] = at
            count = 0.0
        counts[labels] = count + 1
        duration_s = duration_s if duration_s > 0.0 else 0.0  # max() is a call
        durations = on.durations
        if durations is None:
            durations = on.durations = self.task_duration.series_of((queue,))
        series, exemplars = durations
        bucket = _bucket(self.task_duration.buckets, duration_s)
        series[bucket] += 1
        series[-1] += duration_s
        if workflow_id:
            tally.exemplars[labels] = (workflow_id, 1.0, at)
            exemplars[bucket] = (workflow_id, duration_s, at)

    def waited(self, queue: str, seconds: float, workflow_id: str, at: float = 0.0) -> None:
        """A task message was received ``seconds`` after it was due (at ``at``, seconds
        since the epoch; 0: now)."""
        on = self.queues.get(queue) or self._on(queue)
        seconds = seconds if seconds > 0.0 else 0.0  # max() is a call
        waits = on.waits
        if waits is None:
            waits = on.waits = self.queue_wait.series_of((queue,))
        series, exemplars = waits
        bucket = _bucket(self.queue_wait.buckets, seconds)
        series[bucket] += 1
        series[-1] += seconds
        if workflow_id:
            exemplars[bucket] = (workflow_id, seconds, at or _now())

    def workflow_finished(self, status: str, workflow_id: str) -> None:
        """A workflow reached a final status."""
        self.workflows_finished.inc((status,), workflow_id)

    def batch_took(self, seconds: float) -> None:
        """The coordinator handled a batch of events in ``seconds``."""
        self.batch.observe((), seconds)


class _Slot:
    metrics: Metrics | None = None


_slot = _Slot()


def current() -> Metrics | None:
    """This process's metrics, or None when they are off."""
    return _slot.metrics


def create() -> Metrics:
    """Make this process's metrics (in a registry of their own) and switch them on."""
    from prometheus_client import CollectorRegistry, Gauge

    registry = CollectorRegistry(auto_describe=True)

    def help_of(name: str) -> str:
        return METRICS[name]

    def tally(name: str, labels: tuple[str, ...]) -> Tally:
        return Tally(name, help_of(name), labels)

    def gauge(name: str, labels: tuple[str, ...] = ()) -> Any:
        return Gauge(name, help_of(name), labels, registry=registry)

    def histogram(name: str, labels: tuple[str, ...], buckets: tuple[float, ...]) -> Histogram:
        return Histogram(name, help_of(name), labels, buckets)

    tasks_finished = tally("dagq_tasks_finished_total", ("queue", "status"))
    task_duration = histogram("dagq_task_duration_seconds", ("queue",), DURATION_BUCKETS)
    queue_wait = histogram("dagq_queue_wait_seconds", ("queue",), DURATION_BUCKETS)
    workflows_finished = tally("dagq_workflows_finished_total", ("status",))
    batch = histogram("dagq_coordinator_batch_seconds", (), BATCH_BUCKETS)
    storage_requests = tally("dagq_storage_requests_total", ("store", "kind"))
    registry.register(
        _Collector(
            [tasks_finished, task_duration, queue_wait, workflows_finished, batch, storage_requests]
        )
    )
    _slot.metrics = Metrics(
        registry=registry,
        tasks_finished=tasks_finished,
        task_duration=task_duration,
        queue_wait=queue_wait,
        queue_depth=gauge("dagq_queue_depth", ("queue",)),
        queue_oldest=gauge("dagq_queue_oldest_message_age_seconds", ("queue",)),
        workflows=gauge("dagq_workflows", ("status",)),
        workflows_finished=workflows_finished,
        batch=batch,
        lease_held=gauge("dagq_coordinator_lease_held"),
        storage_requests=storage_requests,
        dead_letters=gauge("dagq_dead_letters", ("queue",)),
        workers=gauge("dagq_workers", ("queue",)),
        loop_lag=gauge("dagq_event_loop_lag_seconds"),
    )
    return _slot.metrics


def disable() -> None:
    """Switch metrics off in this process (tests)."""
    _slot.metrics = None


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
