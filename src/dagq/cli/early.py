"""What ``dagq run`` starts before it parses its command line.

The zygote that forks the pool's Python task processes (:mod:`dagq.zygote`) is
a new interpreter: it boots on another core while this process imports click, the
command, the loader and the runtime, and is ready long before the first task needs it.
Whether the run has Python tasks is only guessed here, from the command line and the
file's text (the file is parsed later): a wrong yes costs an idle process, which exits
with this one; a wrong no costs nothing more than before (``dagq run`` launches the
zygote once the file has loaded).
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Sequence

#: The suffixes of the files ``dagq run`` reads (a Python file builds its workflow).
DEFINITION_SUFFIXES = (".yaml", ".yml", ".json")
#: How much of a definition file the guess reads at most.
READ_BYTES = 1 << 20


def launch_zygote(args: Sequence[str]) -> None:
    """Launch the zygote now if ``args`` (the command line after ``dagq``) look like a
    run of a file with Python tasks; never fails (the launch is tried again later)."""
    if not runs_python(args):
        return
    from dagq import zygote

    with contextlib.suppress(OSError):
        zygote.prestart()


def runs_python(args: Sequence[str]) -> bool:
    """Do ``args`` look like ``run`` of a workflow with Python tasks: ``--processor``,
    or a file that says ``call`` (or, a Python file, ``.task``)?"""
    if not args or args[0] != "run":
        return False
    for arg in args[1:]:
        if arg == "--processor" or arg.startswith("--processor="):
            return True
    return any(_says_call(arg) for arg in args[1:] if not arg.startswith("-"))


def _says_call(path: str) -> bool:
    suffix = os.path.splitext(path)[1].lower()
    if suffix != ".py" and suffix not in DEFINITION_SUFFIXES:
        return False
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return False  # a pipe is read once, by the loader
        with open(path, "rb") as file:
            text = file.read(READ_BYTES)
    except OSError:
        return False
    # A Python file adds a Python task with Workflow.call or the Workflow.task decorator.
    return b"call" in text or (suffix == ".py" and b".task" in text)
