"""A throw-away PostgreSQL cluster for the tests (and the benchmark).

``start()`` makes a cluster with ``initdb`` in a new temporary directory and starts it
with ``pg_ctl`` on 127.0.0.1 and a free port (trust authentication, nothing else
listens); ``stop()`` ends it by the PID in its ``postmaster.pid`` and removes the
directory. The binaries are looked for in ``/usr/lib/postgresql/*/bin`` (Debian's
``postgresql`` package) and on PATH. PostgreSQL refuses to run as root, so as root the
cluster belongs to, and runs as, the unprivileged ``nobody``.

    python -m tests.postgres       # start one, print its URL, keep it until Ctrl-C
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HOST = "127.0.0.1"
START_TIMEOUT_S = 60.0
#: The unprivileged account the cluster runs as when the tests run as root.
UNPRIVILEGED = "nobody"


class PostgresMissing(RuntimeError):
    """The PostgreSQL server binaries are not installed."""


def find_bin() -> Path | None:
    """The directory holding ``initdb``, ``pg_ctl`` and ``postgres`` (newest version)."""
    versions = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
    )
    if versions:
        return versions[-1].parent
    found = shutil.which("initdb")
    return Path(found).parent if found else None


def free_port() -> int:
    """A TCP port nothing listens on now."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Cluster:
    """A running cluster: its data directory, port and postmaster PID."""

    directory: Path
    port: int
    pid: int

    @property
    def url(self) -> str:
        """The URL of its ``postgres`` database, as the superuser ``postgres``."""
        return f"postgresql://postgres@{HOST}:{self.port}/postgres"

    def stop(self) -> None:
        """Stop it (fast shutdown, by PID) and remove its files."""
        stop(self.pid, self.directory)


def _as_user(command: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return command
    return ["runuser", "-u", UNPRIVILEGED, "--", *command]


def start(*, timeout_s: float = START_TIMEOUT_S) -> Cluster:
    """Make and start a new cluster; PostgresMissing if the binaries are absent."""
    bindir = find_bin()
    if bindir is None:
        raise PostgresMissing(
            "PostgreSQL is not installed (no initdb in /usr/lib/postgresql/*/bin or on "
            "PATH); install it with: apt-get install postgresql"
        )
    directory = Path(tempfile.mkdtemp(prefix="dagq-pg-"))
    data = directory / "data"
    if os.geteuid() == 0:
        account = pwd.getpwnam(UNPRIVILEGED)
        os.chown(directory, account.pw_uid, account.pw_gid)
    directory.chmod(0o700)
    port = free_port()
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.PIPE, "cwd": directory}
    initdb = [str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust"]
    initdb += ["--encoding=UTF8", "--locale=C", "--no-sync"]
    done = subprocess.run(_as_user(initdb), check=False, timeout=timeout_s, **quiet)  # type: ignore[call-overload]
    if done.returncode != 0:
        shutil.rmtree(directory, ignore_errors=True)
        raise RuntimeError(f"initdb failed: {done.stderr.decode(errors='replace')}")
    options = (
        f"-p {port} -h {HOST} -k {directory} -c fsync=off -c synchronous_commit=off "
        "-c full_page_writes=off -c max_connections=300 -c shared_buffers=128MB"
    )
    pg_ctl = [str(bindir / "pg_ctl"), "-D", str(data), "-o", options]
    pg_ctl += ["-l", str(directory / "log"), "-w", "-t", str(int(timeout_s)), "start"]
    done = subprocess.run(_as_user(pg_ctl), check=False, timeout=timeout_s + 5, **quiet)  # type: ignore[call-overload]
    if done.returncode != 0:
        log = (
            (directory / "log").read_text(errors="replace") if (directory / "log").exists() else ""
        )
        shutil.rmtree(directory, ignore_errors=True)
        raise RuntimeError(f"pg_ctl start failed: {done.stderr.decode(errors='replace')}{log}")
    pid = int((data / "postmaster.pid").read_text().split()[0])
    return Cluster(directory, port, pid)


def stop(pid: int, directory: Path, *, timeout_s: float = 20.0) -> None:
    """Stop the postmaster ``pid`` (SIGINT: fast shutdown) and remove ``directory``."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGINT)
        deadline = time.monotonic() + timeout_s
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)  # not our child: no wait() to block on
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(directory, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (our own child, not yet reaped) is gone for our purpose.
    with contextlib.suppress(OSError):
        if Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
            return False
    return True


def alive(pid: int) -> bool:
    """Is the postmaster ``pid`` still running?"""
    return _alive(pid)


if __name__ == "__main__":
    stops = {signal.SIGINT, signal.SIGTERM}
    cluster = start()
    # Blocked (after the cluster's processes started, so they do not inherit the mask) for
    # sigwait to receive them: a handler or the default action would otherwise take them
    # first and leave the cluster running.
    signal.pthread_sigmask(signal.SIG_BLOCK, stops)
    print(cluster.url, flush=True)
    try:
        signal.sigwait(stops)
    finally:
        cluster.stop()
    sys.exit(0)
