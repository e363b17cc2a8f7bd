"""Fixtures every test directory may use: the Azurite emulator for the azure backend.

The suite runs in parallel (pytest-xdist): the first worker that needs Azurite and finds
none listening starts one, under a lock that the other workers wait on, and leaves its PID
in the directory all workers share; the controller stops it when the run ends.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.azurite import Azurite, AzuriteMissing, start

_STARTED = "azurite.json"
#: The emulator this worker started and the controller stops.
_KEPT: list[Azurite] = []


def _worker() -> bool:
    return "PYTEST_XDIST_WORKER" in os.environ


def _shared(factory: pytest.TempPathFactory) -> Path:
    """A directory every worker of this run shares (the controller's base temp)."""
    base = factory.getbasetemp()
    return base.parent if _worker() else base


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    """A running Azurite (started here if none listens): skip without one, except in CI."""
    shared = _shared(tmp_path_factory)
    with (shared / "azurite.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            server = start()
        except AzuriteMissing as exc:
            if os.environ.get("CI", "").lower() == "true":
                pytest.fail(f"CI=true, so the azure tests must run, but {exc}", pytrace=False)
            pytest.skip(f"azure tests skipped: {exc}")
        if server.process is not None and _worker():  # other workers may still use it
            started = {"pid": server.process.pid, "location": str(server.location)}
            (shared / _STARTED).write_text(json.dumps(started))
            _KEPT.append(server)  # never collected while it runs (Popen would warn)
    yield server
    if not _worker():
        server.stop()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """On the controller: stop the Azurite a worker started (by its PID)."""
    if _worker() or not hasattr(session.config, "_tmp_path_factory"):
        return
    record = session.config._tmp_path_factory.getbasetemp() / _STARTED
    if not record.is_file():
        return
    started = json.loads(record.read_text())
    with contextlib.suppress(ProcessLookupError):
        os.killpg(started["pid"], signal.SIGTERM)
        deadline = time.monotonic() + 10
        while _alive(started["pid"]) and time.monotonic() < deadline:
            time.sleep(0.05)  # not our child: no wait() to block on
        if _alive(started["pid"]):
            os.killpg(started["pid"], signal.SIGKILL)
    shutil.rmtree(started["location"], ignore_errors=True)  # it writes its files as it stops
    record.unlink()


def _alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


def azure_prefix() -> str:
    """A fresh, valid store prefix: each test gets a container, table and queues of its own."""
    return f"t{secrets.token_hex(6)}"
