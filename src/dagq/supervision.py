"""Supervised background tasks: none of them may die in silence.

A coordinator and a worker each run a few long-lived background tasks beside their
main loop (the lease keeper, heartbeats, the outbox). Started with a bare
``asyncio.create_task`` and never watched, a task that raised would simply stop — the
lease would lapse unnoticed, messages would stop being extended. A
:class:`Supervisor` owns them instead: when one ends with an exception it is logged
with its traceback, then either restarted after a backoff (``restart=True``: the work
can pick up where it left) or declared fatal, which :meth:`Supervisor.check` turns into
:class:`BackgroundFailed` in the main loop, so the process stops with a clear error
and a non-zero exit.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import msgspec

from dagq.errors import DagqError

log = logging.getLogger("dagq.supervision")

#: Restart backoff: doubling from the first, up to the last; reset once a restarted
#: task has run this long without failing.
FIRST_RESTART_S = 0.5
MAX_RESTART_S = 30.0
HEALTHY_AFTER_S = 60.0


class BackgroundFailed(DagqError):
    """A background task that cannot be restarted failed; the process must stop."""


class _Child(msgspec.Struct, eq=False):
    name: str
    work: Callable[[], Awaitable[None]]
    restart: bool
    task: asyncio.Task[None] | None = None
    restarts: int = 0
    #: Failures in a row (none of the runs between them lasted HEALTHY_AFTER_S), and
    #: how many are tolerated before a restartable task is fatal too (None: no bound).
    failures: int = 0
    max_failures: int | None = None


class Supervisor:
    """Starts background tasks, watches them, restarts or escalates their failures."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self._children: dict[str, _Child] = {}
        self._failure: BaseException | None = None
        self._failed_name = ""
        self._failed_times = ""
        #: Set when a task that may not be restarted failed (see :meth:`check`).
        self.failed = asyncio.Event()
        self._closing = False

    def start(
        self,
        name: str,
        work: Callable[[], Awaitable[None]],
        *,
        restart: bool,
        max_failures: int | None = None,
    ) -> None:
        """Run ``work()`` in the background under supervision.

        ``restart``: after a failure, call ``work()`` again (with backoff); otherwise a
        failure is fatal to the process. ``max_failures``: a restartable task that fails
        this many times in a row is fatal all the same (it is broken, not unlucky). A
        task that returns normally is done.
        """
        if name in self._children:
            raise ValueError(f"a background task named {name!r} is running already")
        child = _Child(name, work, restart, max_failures=max_failures)
        self._children[name] = child
        child.task = asyncio.create_task(self._watch(child), name=f"{self.owner}-{name}")

    def check(self) -> None:
        """Raise :class:`BackgroundFailed` if a task that may not be restarted failed."""
        if self._failure is not None:
            raise BackgroundFailed(
                f"{self.owner}: background task {self._failed_name!r} failed{self._failed_times}: "
                f"{type(self._failure).__name__}: {self._failure}"
            ) from self._failure

    def running(self, name: str) -> bool:
        """Is the named task still running (or waiting to be restarted)?"""
        child = self._children.get(name)
        return child is not None and child.task is not None and not child.task.done()

    async def stop(self, name: str) -> None:
        """Cancel one task and wait for it to end."""
        child = self._children.pop(name, None)
        if child is not None and child.task is not None:
            child.task.cancel()
            await asyncio.gather(child.task, return_exceptions=True)

    async def close(self) -> None:
        """Cancel every task and wait for them to end."""
        self._closing = True
        for name in list(self._children):
            await self.stop(name)

    async def _watch(self, child: _Child) -> None:
        delay = FIRST_RESTART_S
        loop = asyncio.get_running_loop()
        while True:
            began = loop.time()
            try:
                await child.work()
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self._closing:
                    return
                if loop.time() - began >= HEALTHY_AFTER_S:
                    delay, child.failures = FIRST_RESTART_S, 0
                child.failures += 1
                limit = child.max_failures
                if not child.restart or (limit is not None and child.failures >= limit):
                    times = f" {child.failures} times in a row" if child.restart else ""
                    log.critical(
                        "%s: background task %r failed%s; stopping",
                        self.owner,
                        child.name,
                        times,
                        exc_info=exc,
                    )
                    if self._failure is None:
                        self._failure, self._failed_name, self._failed_times = (
                            exc,
                            child.name,
                            times,
                        )
                    self.failed.set()
                    return
                child.restarts += 1
                log.error(
                    "%s: background task %r failed (restart %d in %.1fs)",
                    self.owner,
                    child.name,
                    child.restarts,
                    delay,
                    exc_info=exc,
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_RESTART_S)
