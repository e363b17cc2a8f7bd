"""Changes of a sqlite file made by any process, for the store's change feed.

SQLite has no notifications, but ``PRAGMA data_version`` on a connection changes
whenever another connection (of this process or another) commits to the file, and
asking costs ~20 µs (it reads the WAL index in shared memory). One task per process
and file asks every :data:`INTERVAL_S` while some watcher is open and announces a
broad change when the answer moves: every watcher wakes and reads what it watches.
With no watcher open the task ends, so an idle store costs nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from pathlib import Path

from dagq.stores.changes import ChangeFeed

log = logging.getLogger("dagq.stores.sqlite")

#: How often the file is asked whether it changed while someone watches.
INTERVAL_S = 0.02


class DataVersionWatch:
    """The cross-process source of one sqlite file's change feed."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._task: asyncio.Task[None] | None = None

    async def __call__(self, feed: ChangeFeed) -> bool:
        """Start watching the file (if not already, in this loop); True: it works."""
        task = self._task
        if task is not None and not task.done() and not task.get_loop().is_closed():
            return True
        try:
            conn = sqlite3.connect(self._path, timeout=0.05, isolation_level=None)
            version = _version(conn)
        except sqlite3.Error as exc:
            log.warning("sqlite store %s: cannot watch for changes (%s)", self._path, exc)
            return False
        self._task = asyncio.create_task(self._watch(feed, conn, version), name="dagq-sqlite-watch")
        return True

    async def _watch(self, feed: ChangeFeed, conn: sqlite3.Connection, version: int) -> None:
        try:
            while feed.watched:
                await asyncio.sleep(INTERVAL_S)
                try:
                    now = _version(conn)
                except sqlite3.Error:  # busy for a moment (a checkpoint): look again
                    continue
                if now != version:
                    version = now
                    feed.notify_all()
        finally:
            with contextlib.suppress(sqlite3.Error):
                conn.close()


def _version(conn: sqlite3.Connection) -> int:
    row = conn.execute("PRAGMA data_version").fetchone()
    return int(row[0])
