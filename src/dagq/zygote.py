"""Launching the zygote: the process that forks the pool's Python task processes.

Apart from :mod:`dagq.runners.pool` (asyncio, the pipes), and outside the
:mod:`dagq.runners` package (whose task-context classes and msgspec it does not need),
so that ``dagq run`` can launch it *before* it parses its command line
(:mod:`dagq.cli.early`): the new interpreter boots (a tenth of a second) on another core
while this one imports click, reads the file, imports the coordinator and the worker and
submits the run, and the pool adopts it at its first task (:func:`take`) instead of
starting one then. It is the same process either way (:func:`dagq.runners.child.zygote`);
one that is never adopted reads EOF on its control socket when this process exits, and
exits too.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

#: The directory that holds the ``dagq`` package: first on the zygote's path, so it runs
#: this dagq whatever its working directory.
DAGQ_ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
BOOT = (
    "import sys; sys.path.insert(0, sys.argv.pop(1)); "
    "from dagq.runners.child import boot; boot(sys.argv[1:])"
)


class Launched:
    """A zygote launched, and this process's ends of its channels: ``control`` (fork
    requests go out on it) and ``events`` (the read end of a pipe: pids and exit codes)."""

    __slots__ = ("control", "events", "parent", "process")

    def __init__(self, process: subprocess.Popen[bytes], control: socket.socket, events: int):
        self.process, self.control, self.events = process, control, events
        #: The process that launched it (a forked child must launch its own).
        self.parent = os.getpid()

    @property
    def alive(self) -> bool:
        return self.process.poll() is None


def launch() -> Launched:
    """Start a zygote now (it boots while the caller goes on)."""
    control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    events_in, events_out = os.pipe()
    try:
        process = subprocess.Popen(
            [
                sys.executable,
                "-P",  # its imports search not the working directory (the pool's tasks do)
                "-c",
                BOOT,
                DAGQ_ROOT,
                "zygote",
                str(theirs.fileno()),
                str(events_out),
                str(os.getpid()),
            ],
            stdin=subprocess.DEVNULL,
            pass_fds=(theirs.fileno(), events_out),
            start_new_session=True,  # Ctrl-C in a terminal is the worker's to handle
        )
    except BaseException:
        control.close()
        os.close(events_in)
        raise
    finally:
        theirs.close()
        os.close(events_out)
    return Launched(process, control, events_in)


class _Early:
    """The zygote :func:`prestart` launched, until a pool takes it."""

    launched: Launched | None = None


def prestart() -> Launched:
    """Launch a zygote for the first pool of this process to adopt (``dagq run``, once it
    knows the workflow has Python tasks); the one launched already, if any."""
    if _Early.launched is None:
        _Early.launched = launch()
    return _Early.launched


def take() -> Launched:
    """The zygote :func:`prestart` launched, if it is still alive; else a new one."""
    early, _Early.launched = _Early.launched, None
    if early is not None and early.alive and early.parent == os.getpid():
        return early
    if early is not None:
        early.control.close()
        os.close(early.events)
    return launch()
