"""When a stream looks at the store again.

A stream waits on the store's change feed (:mod:`dagq.stores.changes`) for the topic
it reads. Where every change of the store reaches the feed (memory, sqlite, PostgreSQL
with LISTEN working) a look follows each change at once, and an idle stream only looks
every ``idle_s`` (a safety net): it costs one parked future, no CPU. Where the feed
cannot see other processes (Azure), a stream polls: every ``poll_s`` after a look that
found something, backing off to ``max_poll_s`` while nothing changes.

A broad change (the sqlite file changed, where is unknown) wakes every stream of the
store; such wakes are spaced at least ``gap_s`` apart per stream, so a busy store
costs each open stream at most ``1 / gap_s`` looks a second.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import anyio

from dagq.stores.changes import ANY, Watcher

#: How much longer the poll interval grows after each look that found nothing.
BACK_OFF = 1.5


@dataclass(kw_only=True)
class Pace:
    """The pace of one stream's looks at the store."""

    watcher: Watcher
    poll_s: float
    max_poll_s: float
    idle_s: float
    gap_s: float
    _interval: float = field(init=False)
    _last: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        self._interval = self.poll_s

    def looked(self, *, found: bool) -> None:
        """Note a look at the store, and whether it found anything new."""
        self._last = time.monotonic()
        if found:
            self._interval = self.poll_s
        else:
            self._interval = min(self._interval * BACK_OFF, max(self.max_poll_s, self.poll_s))

    async def wait(self, stopping: anyio.Event) -> None:
        """Return when it is time to look again, or once ``stopping`` is set."""
        timeout = self.idle_s if self.watcher.complete else self._interval
        topic: str | None = None

        async def changed() -> None:
            nonlocal topic
            topic = await self.watcher.wait(timeout)
            scope.cancel()

        async def stopped() -> None:
            await stopping.wait()
            scope.cancel()

        async with anyio.create_task_group() as group:
            scope = group.cancel_scope
            group.start_soon(changed)
            group.start_soon(stopped)
        if topic == ANY and not stopping.is_set():
            with anyio.move_on_after(self._last + self.gap_s - time.monotonic()):
                await stopping.wait()
