"""Observability: OpenTelemetry traces, Prometheus metrics and structured logs.

The runtime calls this seam only; OpenTelemetry and prometheus-client (the ``otel``
extra) are imported only when a process turns them on, so without them nothing is
paid. It imports no asyncio either, and its metrics only when asked: a pool process
(:mod:`dagq.runners.child`) imports :mod:`.tracing` through it, and starts faster
without. A command calls :func:`start` (and :func:`ready` before its first work), wraps
its store with :func:`instrument`, and runs inside :func:`watching`. See README "Observability".
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING

from dagq.errors import UsageError
from dagq.observability import tracing

if TYPE_CHECKING:  # the runtime imports these only when metrics are on
    from dagq.observability.metrics import Metrics
    from dagq.observability.sampling import Advancing
    from dagq.stores.base import Store

__all__ = ["instrument", "ready", "start", "stop", "watching"]

log = logging.getLogger("dagq.observability")

#: How long :func:`ready` waits for the span helper at most.
READY_TIMEOUT_S = 30.0

#: Roles that make a few spans (a submit's) and export them themselves; the others make
#: three an attempt and hand them to a helper process (:mod:`.forwarding`).
FEW_SPANS = ("client", "server")


def start(role: str, metrics_port: int | None = None) -> Metrics | None:
    """Turn on what this process was asked for: traces (by the ``OTEL_*``
    environment) and metrics (by ``metrics_port``); the metrics, if on. UsageError
    when metrics are asked for without the ``otel`` extra, or the port is taken."""
    tracing.configure(f"dagq-{role}", forward=role not in FEW_SPANS)
    if metrics_port is None:
        return None
    from dagq.observability import metrics

    try:
        return metrics.serve(metrics_port)
    except ImportError:
        raise UsageError("--metrics-port needs the otel extra: pip install 'dagq[otel]'") from None
    except OSError as exc:
        raise UsageError(f"--metrics-port {metrics_port}: cannot serve metrics: {exc}") from None


def ready(timeout_s: float = READY_TIMEOUT_S) -> None:
    """Return once what :func:`start` turned on is up: the span helper answers (its
    imports done, ~0.3 s of CPU in a process of its own; it sends nothing meanwhile, so
    an unreachable collector delays nothing). A service calls it before it says it is
    ready (a coordinator takes its lease, a worker registers), so that start-up is not
    paid during its first work. If the helper has not answered in ``timeout_s``, this
    says so and returns: the spans it is handed wait for it (and are dropped if it
    never comes)."""
    if not tracing.ready(timeout_s):
        log.warning(
            "the span exporter is not up (it ended, or took over %.0f s): going on", timeout_s
        )


def stop() -> None:
    """Export the spans still buffered (a process ends)."""
    tracing.shutdown()


def instrument(store: Store) -> Store:
    """``store``, counting its requests when metrics are on."""
    from dagq.observability import metrics

    recorder = metrics.current()
    if recorder is None:
        return store
    from dagq.observability import sampling

    return sampling.counted(store, recorder)


@contextlib.asynccontextmanager
async def watching(
    store: Store,
    *,
    queues: Iterable[str] = (),
    coordinator: Advancing | None = None,
    interval_s: float | None = None,
) -> AsyncIterator[None]:
    """While the block runs, keep the sampled metrics (queues, workers, dead letters,
    the coordinator's workflows and lease, the loop's lag) fresh; nothing when metrics
    are off."""
    from dagq.observability import metrics

    recorder = metrics.current()
    if recorder is None:
        yield
        return
    if interval_s is None:
        interval_s = float(os.environ.get("DAGQ_METRICS_INTERVAL_S", "5"))
    from dagq.observability import sampling

    jobs = sampling.start(
        store,
        recorder,
        queues=sampling.default_queues(queues),
        coordinator=coordinator,
        interval_s=interval_s,
    )
    try:
        yield
    finally:
        await sampling.stop(jobs)
