"""ai4s-jobq's ``bg_dirsync_to``: a task's directory copied to a target while it runs.

Every ``AMLT_DIRSYNC_FREQ`` seconds (from the task's env; 30 by default), and once
when the task ends, files that are new or changed since the last copy (by size and
modification time) are copied to the target directory; nothing is ever deleted
there. The copying happens in a thread, never on the event loop. A copy that fails
is a warning in the task's log, never the task's failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import threading
from pathlib import Path

log = logging.getLogger("dagq.worker")

#: Seconds between copies unless the task's ``AMLT_DIRSYNC_FREQ`` says otherwise.
DEFAULT_EVERY_S = 30.0
#: Warnings kept per task (the first ones): a target that keeps failing says so once.
MAX_WARNINGS = 20


def interval(env: dict[str, str]) -> tuple[float, str | None]:
    """The seconds between copies a task asks for, and a warning if it asked wrongly."""
    text = env.get("AMLT_DIRSYNC_FREQ")
    if text is None:
        return DEFAULT_EVERY_S, None
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds > 0 or seconds == float("inf"):
        return DEFAULT_EVERY_S, (
            f"AMLT_DIRSYNC_FREQ={text!r} is not a positive number of seconds; "
            f"using {DEFAULT_EVERY_S:g}"
        )
    return seconds, None


class DirSync:
    """Copies ``source`` to ``target`` in the background while a task runs."""

    def __init__(self, source: str, target: str, *, every_s: float, task: str) -> None:
        self.source = source
        self.target = target
        self.every_s = every_s
        self.task = task
        self.warnings: list[str] = []
        #: What was copied last: relative path -> (size, mtime in ns).
        self._copied: dict[str, tuple[int, int]] = {}
        #: One copy at a time: the final copy waits for one still in its thread.
        self._lock = threading.Lock()
        self._loop: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Begin copying every ``every_s`` seconds."""
        if self.target.startswith("azure://"):
            self._warn(
                f"bg_dirsync_to {self.target!r}: azure:// targets are not supported by this "
                "worker; nothing is copied (use a directory, e.g. a mounted container)"
            )
            return
        self._loop = asyncio.create_task(self._every(), name=f"dagq-dirsync-{self.task}")

    async def finish(self, *, final: bool = True) -> list[str]:
        """Stop copying; copy once more (unless ``final`` is false); the warnings."""
        if self._loop is None:
            return self.warnings
        self._loop.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._loop
        if final:
            await self._copy()
        return self.warnings

    async def _every(self) -> None:
        while True:
            await asyncio.sleep(self.every_s)
            await self._copy()

    async def _copy(self) -> None:
        try:
            copied, failures = await asyncio.to_thread(self._copy_changed)
        except Exception as exc:  # the target is unusable: say so, the task goes on
            self._warn(f"bg_dirsync_to {self.target!r}: {type(exc).__name__}: {exc}")
            return
        for failure in failures:
            self._warn(f"bg_dirsync_to {self.target!r}: {failure}")
        if copied:
            log.debug("task %s: %d file(s) copied to %s", self.task, copied, self.target)

    def _copy_changed(self) -> tuple[int, list[str]]:
        """Copy new and changed files; how many, and what failed (a few, said once)."""
        with self._lock:
            target = os.path.realpath(self.target)
            os.makedirs(target, exist_ok=True)
            copied, failures = 0, []
            for folder, dirs, files in os.walk(self.source):
                # A target inside the source is not copied into itself.
                dirs[:] = [d for d in dirs if os.path.realpath(os.path.join(folder, d)) != target]
                relative = os.path.relpath(folder, self.source)
                for name in files:
                    path = os.path.join(folder, name)
                    key = os.path.normpath(os.path.join(relative, name))
                    try:
                        info = os.stat(path)
                        stamp = (info.st_size, info.st_mtime_ns)
                        if self._copied.get(key) == stamp:
                            continue
                        destination = Path(target, key)
                        destination.parent.mkdir(parents=True, exist_ok=True)
                        shutil.copy2(path, destination)
                    except FileNotFoundError:
                        continue  # gone since it was listed: nothing to copy
                    except OSError as exc:
                        failures.append(f"cannot copy {key}: {exc}")
                        continue
                    self._copied[key] = stamp
                    copied += 1
            return copied, failures[:3]

    def _warn(self, text: str) -> None:
        if len(self.warnings) < MAX_WARNINGS and text not in self.warnings:
            log.warning("task %s: %s", self.task, text)
            self.warnings.append(text)
