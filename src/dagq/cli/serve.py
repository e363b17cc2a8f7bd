"""``dagq coordinator`` and ``dagq worker``: the long-running processes of a cluster."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable

from dagq import keys, observability
from dagq.cli import log_output
from dagq.coordinator import Coordinator, CoordinatorOptions
from dagq.errors import DagqError, LeaseHeld, LeaseLost
from dagq.stores import open_store
from dagq.stores.base import Store
from dagq.supervision import BackgroundFailed, Supervisor
from dagq.worker import TASK_THREAD_PREFIX, Worker, WorkerOptions

log = logging.getLogger("dagq")


def setup_logging(verbose: bool = False) -> None:
    """One line per event on stderr, with a timestamp — unless the command configured
    logging already (``--log-level``, ``--log-format``: :mod:`dagq.cli.log_output`)."""
    if not logging.getLogger().handlers:
        log_output.configure("debug" if verbose else "info")


def serve(body: Callable[[asyncio.Event], Awaitable[int]]) -> int:
    """Run ``body`` until it returns or SIGTERM/SIGINT asks it to stop gracefully."""

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, _stopper(stop, sig))
        return await body(stop)

    return asyncio.run(main())


def _stopper(stop: asyncio.Event, sig: signal.Signals) -> Callable[[], None]:
    def handle() -> None:
        if stop.is_set():
            log.warning("second %s: exiting at once", sig.name)
            raise SystemExit(130)
        log.info("%s received: finishing current work, then exiting", sig.name)
        stop.set()

    return handle


def run_coordinator(
    store_url: str,
    *,
    break_lease: bool,
    log_interval_s: float,
    lease_ttl_s: float = 30.0,
    metrics_port: int | None = None,
) -> int:
    """The body of ``dagq coordinator``; returns the exit code.

    2 when another coordinator holds the lease (refused at start); 1 when the lease is
    lost (taken over, or not renewed in time), or when the lease keeper died: the
    process never goes on writing without it.
    """
    setup_logging()
    observability.start("coordinator", metrics_port)
    observability.ready()  # up before it takes the lease: not during its first batches

    async def body(stop: asyncio.Event) -> int:
        store = observability.instrument(open_store(store_url))
        coordinator = Coordinator(store, CoordinatorOptions(lease_ttl_s=lease_ttl_s))
        supervisor = Supervisor("coordinator")
        supervisor.start(
            "reporter", lambda: _report(coordinator, store, log_interval_s), restart=True
        )
        try:
            async with observability.watching(store, coordinator=coordinator):
                await coordinator.run(stop, break_lease=break_lease)
        except LeaseHeld as held:
            print(
                f"error: another coordinator serves this store: {held}; stop it first, or "
                "pass --break-lease if it is dead",
                file=sys.stderr,
                flush=True,
            )
            return 2  # refused before doing anything, like any usage error
        except (LeaseLost, BackgroundFailed) as exc:
            log.error("coordinator stopped: %s", exc)
            return 1
        finally:
            await supervisor.close()
            await store.close()
        log.info("coordinator stopped; lease released")
        return 0

    try:
        return serve(body)
    finally:
        observability.stop()


async def _report(coordinator: Coordinator, store: Store, interval_s: float) -> None:
    """One log line per interval: throughput and backlog."""
    last = time.monotonic()
    events, dispatched = 0, 0
    while True:
        await asyncio.sleep(interval_s)
        now = time.monotonic()
        stats = coordinator.stats
        try:
            depth = await store.queues.depth(keys.COMPLETIONS_QUEUE)
        except DagqError as exc:
            log.warning("cannot read the completion queue depth: %s", exc)
            continue
        span = now - last
        log.info(
            "%.1f events/s, %.1f tasks dispatched/s, %d active workflow(s), "
            "%d event message(s) waiting (oldest %.0fs)",
            (stats.events - events) / span,
            (stats.dispatched - dispatched) / span,
            coordinator.active_count,
            depth.visible + depth.invisible,
            depth.oldest_age_s,
        )
        last, events, dispatched = now, stats.events, stats.dispatched


def run_worker(store_url: str, options: WorkerOptions, *, metrics_port: int | None = None) -> int:
    """The body of ``dagq worker``; returns the exit code."""
    setup_logging()
    observability.start("worker", metrics_port)
    observability.ready()  # up before it registers: not during its first tasks

    async def body(stop: asyncio.Event) -> int:
        store = observability.instrument(open_store(store_url))
        worker = Worker(store, options)
        log.info(
            "worker %s serving %s on %s with %d slot(s)",
            options.name,
            ", ".join(options.queues),
            store.url,
            options.concurrency,
        )
        try:
            async with observability.watching(store, queues=options.queues):
                await worker.run(stop)
        except DagqError as exc:  # a background task kept failing (its traceback is logged)
            log.error("worker stopped: %s", exc)
            return 1
        except Exception:
            log.critical("worker failed", exc_info=True)
            return 1
        finally:
            await store.close()
        log.info("worker stopped after %d task(s)", worker.completed)
        return 0

    try:
        code = serve(body)
    finally:
        observability.stop()
    _leave_stuck_task_threads(code)
    return code


def _leave_stuck_task_threads(code: int) -> None:
    """Exit at once if a Python task's thread outlived the grace period.

    A thread cannot be killed, and the interpreter would wait for it before exiting;
    its message is back in the queue already, so nothing is lost by leaving it.
    """
    deadline = time.monotonic() + 0.5  # idle pool threads need a moment to wind down
    stuck = [t for t in threading.enumerate() if t.name.startswith(TASK_THREAD_PREFIX)]
    for thread in stuck:
        thread.join(max(0.0, deadline - time.monotonic()))
    if any(thread.is_alive() for thread in stuck):
        log.warning("leaving Python task(s) still running past the grace period")
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
