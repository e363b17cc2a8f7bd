"""A store's change channel: wakes readers that wait for a part of the store to change.

A reader (a server's event stream) watches a *topic*: the directory of the documents
it reads (``history/<id>/``, everything up to a key's last ``/``) or
:data:`INDEX_TOPIC` for the listing rows. Writers announce what they changed:
every committed :class:`~dagq.stores.base.Batch` does, in this process; some backends
also carry announcements across processes (PostgreSQL's LISTEN/NOTIFY, SQLite's
``data_version``, which says only *that* the file changed, so every watcher wakes).

A feed is *complete* when every change of the store reaches it, from any process:
then a watcher needs no polling beyond a slow safety net. Where it is not (Azure,
or PostgreSQL behind a pooler that drops notifications) a watcher still polls.

Waiting costs nothing per watcher: each parks one future of its own event loop, and
a backend's cross-process source (one per process and store) runs only while some
watcher is open.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence

import msgspec

#: The topic of the listing rows (``Index.upsert`` and batched upserts).
INDEX_TOPIC = "#index"
#: What a broad announcement (the store changed, where is unknown) is delivered as.
ANY = "#any"


def topic_of(key: str) -> str:
    """The topic of a document: its directory (``history/w1/`` of ``history/w1/0001``)."""
    return key[: key.rfind("/") + 1]


class Watcher(msgspec.Struct, eq=False):
    """One reader's subscription to a topic; :meth:`wait` returns at its next change."""

    topic: str
    feed: ChangeFeed
    _loop: asyncio.AbstractEventLoop = msgspec.field(default_factory=asyncio.get_running_loop)
    _pending: str | None = None
    _future: asyncio.Future[None] | None = None

    @property
    def complete(self) -> bool:
        """Whether every change of the store reaches this watcher (no need to poll)."""
        return self.feed.complete

    async def wait(self, timeout_s: float) -> str | None:
        """Return at the next change announced since the last wait (at once if one
        came in between), or after ``timeout_s``: the change's topic (:data:`ANY` for
        a broad one), or None after the timeout."""
        with self.feed.lock:
            found, self._pending = self._pending, None
            if found is None:
                self._future = self._loop.create_future()
            future = self._future
        if found is not None or future is None:
            return found
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(future, timeout_s)
        finally:
            with self.feed.lock:
                self._future = None
                found, self._pending = self._pending, None
        return found

    def _announce(self, topic: str) -> None:
        """Note a change (under the feed's lock) and wake the waiter, from any thread."""
        if self._pending != self.topic:  # a precise change outranks a broad one
            self._pending = topic
        future = self._future
        if future is None or future.done():
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: its waiter is gone
            self._loop.call_soon_threadsafe(_wake, future)


class ChangeFeed:
    """The watchers of one store in this process (shared by every handle on it)."""

    def __init__(
        self,
        *,
        complete: bool = False,
        source: Callable[[ChangeFeed], Awaitable[bool]] | None = None,
    ) -> None:
        self.lock = threading.Lock()
        self._complete = complete
        #: Started when a watcher opens; says whether changes from other processes
        #: arrive (True) or not (False: the feed is not complete).
        self._source = source
        self._sourced = source is None
        self._watchers: dict[str, set[Watcher]] = {}

    @property
    def complete(self) -> bool:
        """Whether every change of the store, from any process, is announced here."""
        return self._complete and self._sourced

    @property
    def watched(self) -> bool:
        """Whether any watcher is open (a cross-process source stops when not)."""
        return bool(self._watchers)

    @contextlib.asynccontextmanager
    async def watch(self, topic: str) -> AsyncIterator[Watcher]:
        """A watcher of ``topic`` for the duration of the block."""
        watcher = Watcher(topic, self)
        with self.lock:
            self._watchers.setdefault(topic, set()).add(watcher)
        try:
            if self._source is not None:
                self._sourced = await self._source(self)
            yield watcher
        finally:
            with self.lock:
                watchers = self._watchers.get(topic, set())
                watchers.discard(watcher)
                if not watchers:
                    self._watchers.pop(topic, None)

    def notify(self, topics: Iterable[str]) -> None:
        """Announce changes of ``topics``: wakes their watchers."""
        with self.lock:
            for topic in set(topics):
                for watcher in self._watchers.get(topic, ()):
                    watcher._announce(topic)

    def notify_all(self) -> None:
        """Announce that something changed, where unknown: wakes every watcher."""
        with self.lock:
            for watchers in self._watchers.values():
                for watcher in watchers:
                    watcher._announce(ANY)


def batch_topics(keys: Sequence[str], upserts: int) -> set[str]:
    """The topics a batch that wrote documents ``keys`` and ``upserts`` rows changed."""
    topics = {topic_of(key) for key in keys}
    # A state document carries its workflow's last history chunks (dagq.history).
    topics.update(f"history/{key[7:]}/" for key in keys if key.startswith("states/"))
    if upserts:
        topics.add(INDEX_TOPIC)
    return topics


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
