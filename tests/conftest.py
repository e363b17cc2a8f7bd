"""Fixtures every test directory may use: the Azurite emulator for the azure backend,
and a throw-away PostgreSQL cluster for the postgres backend.

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

from tests import postgres
from tests.azurite import Azurite, AzuriteMissing, start

_STARTED = "azurite.json"
_PG_STARTED = "postgres.json"
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


@pytest.fixture(scope="session")
def postgres_cluster(tmp_path_factory: pytest.TempPathFactory) -> postgres.Cluster:
    """One PostgreSQL cluster for the whole run, shared by the xdist workers: the first
    that needs it starts it under a lock; the controller stops it (by PID) at the end.
    Skips without the binaries, except in CI."""
    shared = _shared(tmp_path_factory)
    with (shared / "postgres.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        record = shared / _PG_STARTED
        if record.is_file():
            known = json.loads(record.read_text())
            if postgres.alive(known["pid"]):
                return postgres.Cluster(Path(known["directory"]), known["port"], known["pid"])
        try:
            cluster = postgres.start()
        except postgres.PostgresMissing as exc:
            if os.environ.get("CI", "").lower() == "true":
                pytest.fail(f"CI=true, so the postgres tests must run, but {exc}", pytrace=False)
            pytest.skip(f"postgres tests skipped: {exc}")
        started = {"pid": cluster.pid, "port": cluster.port, "directory": str(cluster.directory)}
        record.write_text(json.dumps(started))
    return cluster


def postgres_url(cluster: postgres.Cluster) -> str:
    """A store URL in a fresh schema of ``cluster``: each test gets tables of its own."""
    return f"{cluster.url}?schema=t{secrets.token_hex(6)}"


def pytest_sessionfinish(session: pytest.Session) -> None:
    """On the controller: stop the Azurite and the PostgreSQL the workers started (by PID)."""
    if _worker() or not hasattr(session.config, "_tmp_path_factory"):
        return
    base = session.config._tmp_path_factory.getbasetemp()
    pg_record = base / _PG_STARTED
    if pg_record.is_file():
        known = json.loads(pg_record.read_text())
        postgres.stop(known["pid"], Path(known["directory"]))
        pg_record.unlink()
    record = base / _STARTED
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
