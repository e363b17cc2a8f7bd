"""ai4s-jobq's ``bg_dirsync_to``: a task's directory copied to a target while it runs.

Every ``AMLT_DIRSYNC_FREQ`` seconds (from the task's env; 30 by default), and once
when the task ends, files that are new or changed since the last copy (by size and
modification time) are copied to the target; nothing is ever deleted there. The
target is a directory, or ``azure://ACCOUNT/CONTAINER[/PREFIX]``: blobs named
``PREFIX/<relative path>``, signed in as dagq's azure store signs in to that account
(the container is created if missing; the azure extra must be installed). The
copying happens in a thread, never on the event loop. A copy that fails is a warning
in the task's log, never the task's failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import threading
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

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
        self._destination: _Destination | None = None

    def start(self) -> None:
        """Begin copying every ``every_s`` seconds."""
        try:
            if self.target.startswith("azure://"):
                self._destination = _Blobs(self.target)
            else:
                self._destination = _Directory(self.target)
        except ValueError as exc:
            self._warn(f"bg_dirsync_to {self.target!r}: {exc}; nothing is copied")
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
        destination = self._destination
        if destination is not None:
            await asyncio.to_thread(self._close, destination)
        return self.warnings

    def _close(self, destination: _Destination) -> None:
        with self._lock:
            destination.close()

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
            destination = self._destination
            assert destination is not None
            destination.open()
            copied, failures = 0, []
            for folder, dirs, files in os.walk(self.source):
                # A target inside the source is not copied into itself.
                dirs[:] = [d for d in dirs if not destination.holds(os.path.join(folder, d))]
                relative = os.path.relpath(folder, self.source)
                for name in files:
                    path = os.path.join(folder, name)
                    key = os.path.normpath(os.path.join(relative, name))
                    try:
                        info = os.stat(path)
                        stamp = (info.st_size, info.st_mtime_ns)
                        if self._copied.get(key) == stamp:
                            continue
                        destination.put(key, path)
                    except FileNotFoundError:
                        continue  # gone since it was listed: nothing to copy
                    except Exception as exc:  # an OS or a storage error: said, and tried again
                        failures.append(f"cannot copy {key}: {type(exc).__name__}: {exc}")
                        continue
                    self._copied[key] = stamp
                    copied += 1
            return copied, failures[:3]

    def _warn(self, text: str) -> None:
        if len(self.warnings) < MAX_WARNINGS and text not in self.warnings:
            log.warning("task %s: %s", self.task, text)
            self.warnings.append(text)


class _Destination(Protocol):
    def open(self) -> None: ...
    def holds(self, folder: str) -> bool: ...
    def put(self, key: str, path: str) -> None: ...
    def close(self) -> None: ...


class _Directory:
    """A directory (created if missing)."""

    def __init__(self, target: str) -> None:
        self.root = os.path.realpath(target)

    def open(self) -> None:
        os.makedirs(self.root, exist_ok=True)

    def holds(self, folder: str) -> bool:
        return os.path.realpath(folder) == self.root

    def put(self, key: str, path: str) -> None:
        destination = Path(self.root, key)
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, destination)

    def close(self) -> None:
        pass


class _Blobs:
    """``azure://ACCOUNT/CONTAINER[/PREFIX]``: blobs, written with the (sync) SDK."""

    def __init__(self, target: str) -> None:
        parts = urlsplit(target)
        container, _, prefix = parts.path.strip("/").partition("/")
        if not parts.netloc or not container or parts.query or parts.fragment:
            raise ValueError("write azure://ACCOUNT/CONTAINER or azure://ACCOUNT/CONTAINER/PREFIX")
        self.account, self.container_name = parts.netloc, container
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self._container: Any = None
        self._credential: Any = None

    def open(self) -> None:
        if self._container is not None:
            return
        try:
            from azure.core.credentials import AzureNamedKeyCredential, AzureSasCredential
            from azure.core.exceptions import ResourceExistsError
            from azure.storage.blob import ContainerClient
        except ImportError:
            raise RuntimeError(
                "azure:// targets need the azure extra: pip install 'dagq[azure]'"
            ) from None
        from dagq.stores.azure_auth import resolve_auth

        auth = resolve_auth(self.account, os.environ)
        credential: Any
        if auth.key is not None:
            credential = AzureNamedKeyCredential(self.account, auth.key)
        elif auth.sas is not None:
            credential = AzureSasCredential(auth.sas)
        else:
            from azure.identity import DefaultAzureCredential

            credential = self._credential = DefaultAzureCredential()
        container = ContainerClient(
            auth.endpoints.blob, self.container_name, credential=credential, retry_total=2
        )
        with contextlib.suppress(ResourceExistsError):
            container.create_container()
        self._container = container

    def holds(self, folder: str) -> bool:
        return False

    def put(self, key: str, path: str) -> None:
        name = self.prefix + Path(key).as_posix()
        with open(path, "rb") as data:
            self._container.upload_blob(name, data, overwrite=True)

    def close(self) -> None:
        for client in (self._container, self._credential):
            if client is not None:
                with contextlib.suppress(Exception):
                    client.close()
        self._container = self._credential = None
