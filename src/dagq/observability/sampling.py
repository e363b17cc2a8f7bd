"""What the metrics learn by looking rather than by being told: queue depths, dead
letters, live workers, the coordinator's workflows and lease, the event loop's lag,
and every storage request (counted by wrapping the store)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from dagq import keys, registry
from dagq.errors import DagqError
from dagq.observability.metrics import Metrics, Tally
from dagq.stores.base import Store, wrapped_committer

log = logging.getLogger("dagq.observability")

#: How many dead letters are counted at most per sample.
DEAD_LETTER_SCAN = 1000


class Advancing(Protocol):
    """What the sampler reads of a coordinator."""

    def status_counts(self) -> dict[str, int]: ...

    @property
    def holds_lease(self) -> bool: ...


def counted(store: Store, metrics: Metrics) -> Store:
    """A view of ``store`` that counts each operation in ``dagq_storage_requests_total``
    (``store``: the URL's scheme; ``kind``: ``documents.put``, ``queues.receive``, ...,
    ``batch.commit`` for a batch committed natively).

    A count is a dict update in plain Python (:class:`~dagq.observability.metrics.Tally`),
    made by a wrapper made once per method and kept on the view (each call then finds
    it as an attribute): the call itself is the store's own, its awaitable returned as
    is (no coroutine of the view's in between). A batch counts once: its writes inside
    are not counted again (:func:`dagq.stores.intercepting.intercepted`, ``rebind``)."""
    scheme = store.url.split(":", 1)[0] or "store"
    tally = metrics.storage_requests
    view = Store(
        url=store.url,
        documents=_Counted(store.documents, "documents", scheme, tally),
        queues=_Counted(store.queues, "queues", scheme, tally),
        index=_Counted(store.index, "index", scheme, tally),
        leases=_Counted(store.leases, "leases", scheme, tally),
        closers=[store.close],
        transactions=store.transactions,
        changes=store.changes,
    )
    committer = store.committer
    if committer is not None:
        counting = _counting(committer, tally.counter((scheme, "batch.commit")))
        view.committer = wrapped_committer(committer, counting, atomic=True)
    return view


class _Counted:
    """One part of a store (its documents, queues, ...), counting each call of its
    methods (attributes that are not methods, and ``wait``, a local sleep, as they are)."""

    def __init__(self, inner: Any, prefix: str, scheme: str, tally: Tally) -> None:
        self._inner, self._prefix, self._scheme, self._tally = inner, prefix, scheme, tally

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._inner, name)
        if not callable(attribute) or name == "wait":
            return attribute
        wrapper = _counting(
            attribute, self._tally.counter((self._scheme, f"{self._prefix}.{name}"))
        )
        self.__dict__[name] = wrapper  # found as an attribute from now on
        return wrapper


def _counting(call: Any, count: Callable[[], None]) -> Any:
    """``call``, counting each call."""

    def counted(*args: Any, **kwargs: Any) -> Any:
        count()
        return call(*args, **kwargs)

    return counted


def start(
    store: Store,
    metrics: Metrics,
    *,
    queues: Callable[[], list[str]],
    coordinator: Advancing | None,
    interval_s: float,
) -> list[asyncio.Task[None]]:
    """The sampler and the loop-lag watch, running (:func:`dagq.observability.watching`)."""
    return [
        asyncio.create_task(
            sample(store, metrics, queues=queues, coordinator=coordinator, interval_s=interval_s),
            name="dagq-metrics-sampler",
        ),
        asyncio.create_task(watch_loop(metrics), name="dagq-loop-lag"),
    ]


async def stop(jobs: list[asyncio.Task[None]]) -> None:
    """Cancel what :func:`start` started, and wait for it to end."""
    for job in jobs:
        job.cancel()
    for job in jobs:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await job


async def sample(
    store: Store,
    metrics: Metrics,
    *,
    queues: Callable[[], Iterable[str]],
    coordinator: Advancing | None = None,
    interval_s: float = 5.0,
) -> None:
    """Refresh the sampled gauges every ``interval_s`` until cancelled."""
    while True:
        try:
            await sample_once(store, metrics, queues=queues, coordinator=coordinator)
        except DagqError as exc:
            log.warning("sampling metrics failed: %s", exc)
        await asyncio.sleep(interval_s)


async def sample_once(
    store: Store,
    metrics: Metrics,
    *,
    queues: Callable[[], Iterable[str]],
    coordinator: Advancing | None = None,
) -> None:
    """Refresh the sampled gauges once."""
    workers = await registry.live_workers(store.documents, now=time.time())
    served: Counter[str] = Counter(q for w in workers for q in w.queues)
    names = {*queues(), *served}
    for queue in sorted(names):
        depth = await store.queues.depth(queue)
        metrics.queue_depth.labels(queue).set(depth.visible + depth.invisible)
        metrics.queue_oldest.labels(queue).set(depth.oldest_age_s)
    for queue in names:
        metrics.workers.labels(queue).set(served.get(queue, 0))
    dead = Counter(d.queue for d in await store.queues.dead_letters(None, limit=DEAD_LETTER_SCAN))
    for queue in names | set(dead):
        metrics.dead_letters.labels(queue).set(dead.get(queue, 0))
    if coordinator is not None:
        metrics.lease_held.set(1 if coordinator.holds_lease else 0)
        counts = coordinator.status_counts()
        for status in ("running", "cancelling", "compensating", "quarantined", *counts):
            metrics.workflows.labels(status).set(counts.get(status, 0))


async def watch_loop(metrics: Metrics, interval_s: float = 0.25) -> None:
    """Measure how late this event loop wakes from a sleep, until cancelled."""
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + interval_s
        await asyncio.sleep(interval_s)
        metrics.loop_lag.set(max(0.0, loop.time() - due))


def default_queues(extra: Iterable[str] = ()) -> Callable[[], list[str]]:
    """The queues a process samples: the completion queue and ``extra``."""
    names = [keys.COMPLETIONS_QUEUE, *extra]
    return lambda: names
