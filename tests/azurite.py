"""Azurite, the Azure Storage emulator, for the tests (and the benchmark).

``start()`` uses an Azurite already listening on 127.0.0.1:10000-10002 (``.ci/run``
starts one), or starts one: ``node_modules/.bin/azurite`` under ``.ci/`` or the
repository root, else ``azurite`` on PATH, with its data in a temporary directory
(not ``--inMemoryPersistence``: its message cleanup can freeze the emulator for
minutes after many deletes). ``stop()`` ends the one it started, by PID.

    python -m tests.azurite       # start one and keep it running until Ctrl-C
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"
PORTS = (10000, 10001, 10002)
START_TIMEOUT_S = 60.0


class AzuriteMissing(RuntimeError):
    """No Azurite is running and none is installed."""


def find_azurite(root: Path = ROOT) -> Path | None:
    """The azurite executable: the repository's npm install first, then PATH."""
    for candidate in (
        root / ".ci" / "node_modules" / ".bin" / "azurite",
        root / "node_modules" / ".bin" / "azurite",
    ):
        if candidate.is_file():
            return candidate
    found = shutil.which("azurite")
    return Path(found) if found else None


def listening(port: int, host: str = HOST) -> bool:
    """Does something accept connections on ``host:port``?"""
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
        return True
    return False


@dataclass
class Azurite:
    """A running emulator; ``process`` is None when it was already running."""

    process: subprocess.Popen[bytes] | None
    location: Path | None

    def stop(self) -> None:
        """Stop the emulator this started (by PID) and remove its data."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        if self.location is not None:
            shutil.rmtree(self.location, ignore_errors=True)


def start(root: Path = ROOT, *, timeout_s: float = START_TIMEOUT_S) -> Azurite:
    """An Azurite listening on the three ports: the running one, or a new one."""
    if all(listening(port) for port in PORTS):
        return Azurite(None, None)
    executable = find_azurite(root)
    if executable is None:
        raise AzuriteMissing(
            "Azurite is not installed: run `npm install --prefix .ci azurite@3.35` "
            "(needs Node.js 20) or start one on 127.0.0.1:10000-10002"
        )
    location = Path(tempfile.mkdtemp(prefix="dagq-azurite-"))
    log = (location / "azurite.log").open("wb")
    command = [
        str(executable),
        "--silent",
        "--skipApiVersionCheck",
        "--disableTelemetry",
        "--location",
        str(location),
        "--blobHost",
        HOST,
        "--queueHost",
        HOST,
        "--tableHost",
        HOST,
    ]
    process = subprocess.Popen(
        command,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    log.close()
    azurite = Azurite(process, location)
    deadline = time.monotonic() + timeout_s
    while not all(listening(port) for port in PORTS):
        if process.poll() is not None or time.monotonic() > deadline:
            output = (location / "azurite.log").read_text(errors="replace")[-2000:]
            azurite.stop()
            raise RuntimeError(
                f"Azurite ({executable}) did not start listening on {HOST}:"
                f"{PORTS[0]}-{PORTS[-1]} within {timeout_s:.0f}s:\n{output}"
            )
        time.sleep(0.05)
    return azurite


def main() -> None:
    """Start Azurite and keep it running until interrupted."""
    azurite = start()
    print(f"Azurite listening on {HOST}:{PORTS[0]}-{PORTS[-1]}; Ctrl-C stops it", flush=True)
    try:
        while azurite.process is None or azurite.process.poll() is None:
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        azurite.stop()
    sys.exit(0)


if __name__ == "__main__":
    main()
