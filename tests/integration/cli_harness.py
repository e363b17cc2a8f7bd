"""Running the real ``dagq`` command as a user would, in a scratch directory.

Not a test module: the end-to-end tests of ``dagq run`` share it. Every run uses an
explicit ``--store sqlite:///<scratch>/dagq.db``, a clean environment (no forced
colours, a wide terminal so table rows do not wrap) and a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import pty
import select
import shutil
import signal
import struct
import subprocess
import sys
import termios
import textwrap
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

from dagq import keys
from dagq.client import Client
from dagq.errors import WorkflowNotFound
from dagq.loading import load_data
from dagq.local import LocalRunner
from dagq.plan import Plan
from dagq.state import WORKFLOW_TERMINAL, RunState
from dagq.stores import open_store
from dagq.stores.base import Lease, Store
from dagq.submitted import Submitted
from dagq.views import RunView, load_run, load_view
from tests.helpers import definition

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
#: How long a coordinator or worker may take to come up: a Python process starting
#: on a loaded 2-core machine took over 15 s (a test with a faster bound says so).
START_S = 60.0

#: The commands that take ``--store``; the harness gives them the scratch store.
STORE_COMMANDS = frozenset(
    {
        "run",
        "coordinator",
        "worker",
        "submit",
        "cancel",
        "retry",
        "status",
        "list",
        "tasks",
        "output",
        "logs",
        "events",
        "graph",
        "doctor",
        "dlq",
        "signal",
        "purge",
        "quarantine",
        "explain",
        "summary",
        "workers",
        "token",
    }
)

#: Variables that would change what a plain pipe shows; a user's pipe has none of them.
_SCRUBBED = (
    "FORCE_COLOR",
    "PY_COLORS",
    "CLICOLOR_FORCE",
    "TTY_COMPATIBLE",
    "TTY_INTERACTIVE",
    "NO_COLOR",
    "DAGQ_STORE",
    "COLUMNS",
    "LINES",
    "JUPYTER_COLUMNS",
    # A configuration of the user's or the machine's must not change what tests run.
    "DAGQ_CONFIG",
    "DAGQ_RUN_WORKERS",
    "DAGQ_RUN_PROCESSOR",
    "DAGQ_WORKER_CONCURRENCY",
    "DAGQ_WORKER_QUEUES",
    "DAGQ_WORKER_IMPORT_PATHS",
    "DAGQ_WORKER_PROCESSOR",
)


def dagq_command() -> list[str]:
    """The installed console script beside this interpreter, else the same entry point."""
    script = Path(sys.executable).with_name("dagq")
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    found = shutil.which("dagq")
    if found:
        return [found]
    return [sys.executable, "-c", "from dagq.cli import main; main()"]


def wait_until(
    check: Callable[[], T], *, timeout_s: float, what: str, interval_s: float = 0.02
) -> T:
    """Poll ``check`` until it returns something truthy; fail naming ``what`` at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what}")
        time.sleep(interval_s)


def wait_for_file(name: str, *, timeout_s: float = 20) -> str:
    """Shell that waits until the file ``name`` exists, giving up after ``timeout_s``.

    Bounded, so a task left behind by a failed test (or a killed worker) ends anyway.
    """
    polls = int(timeout_s / 0.05)
    return f"i=0; while [ ! -f {name} ] && [ $i -lt {polls} ]; do sleep 0.05; i=$((i+1)); done"


def pid_alive(pid: int) -> bool:
    """Whether a process runs (a zombie waiting for its parent to reap it does not)."""
    if not Path("/proc/self/stat").exists():  # no procfs: a zombie counts as alive here
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    # The state follows the command name in parentheses, which may itself hold spaces.
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def read_pids(path: Path) -> list[int]:
    """The PIDs a task wrote to a file, one per line."""
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def lines(path: Path) -> list[str]:
    """The lines of a side-effect file (none if it does not exist yet)."""
    return path.read_text().splitlines() if path.exists() else []


@dataclass(frozen=True)
class Finished:
    """A finished ``dagq`` process."""

    code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def summary_rows(self) -> dict[str, list[str]]:
        """The summary table's rows by task name: [state, attempts, duration, error]."""
        return summary_rows(self.stdout)

    def verdict(self) -> str:
        """The last line that gives the workflow's verdict (completed / failed / ...)."""
        found = [
            line for line in self.stdout.splitlines() if line.lstrip("✔✘ ").startswith("workflow ")
        ]
        assert found, f"no verdict line in:\n{self.stdout}"
        return found[-1]


#: The summary's columns that ``summary_rows`` returns, in this order.
SUMMARY_COLUMNS = ("state", "attempts", "duration", "error")


def summary_rows(text: str, columns: tuple[str, ...] = SUMMARY_COLUMNS) -> dict[str, list[str]]:
    """The rows of a summary table by task name: the cells of ``columns``.

    Piped, the table is a header line starting with ``task`` and one tab-separated line
    per task; on a terminal it has box-drawing borders.
    """
    rows: dict[str, list[str]] = {}
    header: list[str] | None = None
    for line in text.splitlines():
        if "\t" in line:
            cells = line.split("\t")
        elif line.strip()[:1] in ("│", "┃"):
            cells = [c.strip() for c in line.strip().strip("│┃").replace("┃", "│").split("│")]
        else:
            header = None if not line.strip().startswith(("┏", "┡", "├", "└")) else header
            continue
        if cells[0] == "task":
            header = cells
        elif header is not None and len(cells) == len(header) and cells[0]:
            by_name = dict(zip(header, cells, strict=True))
            rows[cells[0]] = [by_name.get(column, "") for column in columns]
    return rows


class Started:
    """A ``dagq`` process running in the background; its output goes to files."""

    def __init__(self, process: subprocess.Popen[bytes], stdout: Path, stderr: Path) -> None:
        self.process = process
        self.stdout_file = stdout
        self.stderr_file = stderr

    @property
    def pid(self) -> int:
        return self.process.pid

    def send(self, sig: signal.Signals) -> None:
        self.process.send_signal(sig)

    def wait(self, timeout_s: float) -> Finished:
        """Wait for the process to end (failing the test after ``timeout_s``)."""
        try:
            code = self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"dagq did not exit within {timeout_s:g}s; output so far:\n{self._text()}"
            ) from None
        return Finished(code, *self._text_parts())

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()

    def stderr(self) -> str:
        """What the process has written to stderr so far (its log)."""
        return self.stderr_file.read_text(encoding="utf-8", errors="replace")

    def stop(self, sig: signal.Signals = signal.SIGTERM, *, timeout_s: float = 10) -> Finished:
        """Send ``sig`` and wait for the process to exit."""
        self.send(sig)
        return self.wait(timeout_s)

    def _text_parts(self) -> tuple[str, str]:
        return (
            self.stdout_file.read_text(encoding="utf-8", errors="replace"),
            self.stderr_file.read_text(encoding="utf-8", errors="replace"),
        )

    def _text(self) -> str:
        return "".join(self._text_parts())


class DagqCli:
    """The ``dagq`` command in one scratch directory with one store."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.store_url = f"sqlite:///{workdir / 'dagq.db'}"
        self.env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED}
        self.env["COLUMNS"] = "200"
        self.env["PYTHONUNBUFFERED"] = "1"
        self.env["XDG_CONFIG_HOME"] = str(workdir / ".config")
        self.processes: list[Started] = []
        self._outputs = 0

    # --- files --------------------------------------------------------------------

    def write(self, name: str, text: str) -> Path:
        """Write a file (dedented) into the scratch directory."""
        path = self.workdir / name
        path.write_text(textwrap.dedent(text).lstrip())
        return path

    def workflow(self, name: str, data: dict[str, Any]) -> Path:
        """Write a workflow definition as YAML."""
        path = self.workdir / name
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    # --- running ------------------------------------------------------------------

    def command(self, *args: str | Path, store: bool = True) -> list[str]:
        """``dagq ARGS``; commands taking a store get the scratch one unless given one."""
        words = [str(a) for a in args]
        if store and words and words[0] in STORE_COMMANDS and "--store" not in words:
            words += ["--store", self.store_url]
        return [*dagq_command(), *words]

    def run(
        self,
        *args: str | Path,
        timeout_s: float = 60,
        store: bool = True,
        env: dict[str, str] | None = None,
    ) -> Finished:
        """Run ``dagq`` to its end and return its exit code and output."""
        done = subprocess.run(
            self.command(*args, store=store),
            cwd=self.workdir,
            env={**self.env, **(env or {})},
            capture_output=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
            check=False,
        )
        return Finished(
            done.returncode,
            done.stdout.decode("utf-8", "replace"),
            done.stderr.decode("utf-8", "replace"),
        )

    def run_on_terminal(
        self, *args: str | Path, columns: int = 200, timeout_s: float = 60
    ) -> Finished:
        """Run ``dagq`` on a pseudo-terminal ``columns`` wide, as a person at a terminal
        would; ``stdout`` is what the terminal received (escape sequences and all)."""
        controller, terminal = pty.openpty()
        fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
        process = subprocess.Popen(
            self.command(*args),
            cwd=self.workdir,
            env={**self.env, "TERM": "xterm-256color", "COLUMNS": str(columns)},
            stdin=subprocess.DEVNULL,
            stdout=terminal,
            stderr=terminal,
        )
        os.close(terminal)
        chunks = []
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                ready, _, _ = select.select([controller], [], [], 0.1)
                if not ready:
                    if process.poll() is not None:
                        break
                    continue
                try:
                    chunk = os.read(controller, 65536)
                except OSError:  # EIO: the command has closed the terminal
                    break
                if not chunk:
                    break
                chunks.append(chunk)
        finally:
            os.close(controller)
        try:
            code = process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise AssertionError(f"dagq did not end within {timeout_s:g}s") from None
        return Finished(code, b"".join(chunks).decode("utf-8", "replace"), "")

    def run_many(
        self, commands: dict[str, list[str]], *, timeout_s: float = 60
    ) -> dict[str, Finished]:
        """Run independent ``dagq`` commands side by side, a few at a time; results by key.

        Each command has ``timeout_s`` from its own start (on a loaded machine the last
        of many would not get its share of one deadline for all)."""
        pending = list(commands.items())
        running: dict[str, subprocess.Popen[bytes]] = {}
        deadlines: dict[str, float] = {}
        results: dict[str, Finished] = {}
        try:
            while pending or running:
                while pending and len(running) < 2 * (os.cpu_count() or 1):
                    key, args = pending.pop()
                    running[key] = subprocess.Popen(
                        self.command(*args),
                        cwd=self.workdir,
                        env=self.env,
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE,
                    )
                    deadlines[key] = time.monotonic() + timeout_s
                key, process = next(iter(running.items()))
                left = max(0.1, deadlines[key] - time.monotonic())
                out, err = process.communicate(timeout=left)
                del running[key]
                results[key] = Finished(
                    process.returncode,
                    out.decode("utf-8", "replace"),
                    err.decode("utf-8", "replace"),
                )
        finally:
            for process in running.values():
                process.kill()
                process.wait()
        return results

    def json(self, *args: str | Path, timeout_s: float = 30) -> Any:
        """Run ``dagq ARGS --json``, expect exit code 0, and parse what it printed."""
        result = self.run(*args, "--json", timeout_s=timeout_s)
        assert result.code == 0, result.output
        return json.loads(result.stdout)

    def start(self, *args: str | Path) -> Started:
        """Start ``dagq`` in the background (stopped at teardown if still running)."""
        self._outputs += 1
        stdout = self.workdir / f"dagq-{self._outputs}.out"
        stderr = self.workdir / f"dagq-{self._outputs}.err"
        with stdout.open("wb") as out, stderr.open("wb") as err:
            process = subprocess.Popen(
                self.command(*args),
                cwd=self.workdir,
                env=self.env,
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
            )
        started = Started(process, stdout, stderr)
        self.processes.append(started)
        return started

    def start_coordinator(self, *args: str | Path, timeout_s: float = START_S) -> Started:
        """Start ``dagq coordinator ARGS`` and wait until it holds the store's lease."""
        started = self.start("coordinator", *args)
        wait_until(
            lambda: self.holds_lease(started) or started.process.poll() is not None,
            timeout_s=timeout_s,
            what="the coordinator to take the lease",
        )
        assert started.process.poll() is None, f"the coordinator exited:\n{started.stderr()}"
        return started

    def holds_lease(self, started: Started) -> bool:
        """Whether the coordinator lease belongs to that process."""
        lease = self.lease()
        return lease is not None and f":{started.pid}:" in lease.owner

    def start_worker(self, *args: str | Path, timeout_s: float = START_S) -> Started:
        """Start ``dagq worker ARGS`` and wait until it says it is serving."""
        started = self.start("worker", *args)
        wait_until(
            lambda: " serving " in started.stderr() or started.process.poll() is not None,
            timeout_s=timeout_s,
            what="the worker to start serving",
        )
        assert started.process.poll() is None, f"the worker exited:\n{started.stderr()}"
        return started

    def close(self) -> None:
        """Stop every background ``dagq`` this object started."""
        self.stop_processes()

    def stop_processes(self, since: int = 0) -> None:
        """Kill the background ``dagq`` processes started after the first ``since``."""
        for started in self.processes[since:]:
            started.kill()

    @contextlib.contextmanager
    def scope(self) -> Iterator[DagqCli]:
        """This harness, for one test of a module sharing it: the processes the test
        starts are killed when it ends."""
        mark = len(self.processes)
        try:
            yield self
        finally:
            self.stop_processes(since=mark)

    def __enter__(self) -> DagqCli:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the store ----------------------------------------------------------------

    def view(self, workflow_id: str) -> RunView:
        """The run as the summary sees it, read from the store."""
        return asyncio.run(self._read(lambda store: load_view(store, workflow_id)))

    def run_state(self, workflow_id: str) -> tuple[Submitted, Plan, RunState]:
        """Definition, plan and runtime state, read from the store."""
        return asyncio.run(self._read(lambda store: load_run(store, workflow_id)))

    def statuses(self, workflow_id: str) -> dict[str, str]:
        """Each task's state, by name."""
        return {row.name: row.status for row in self.view(workflow_id).tasks}

    def workflow_status(self, workflow_id: str) -> str | None:
        """The workflow's status from its runtime state (None before the state exists)."""
        try:
            return self.run_state(workflow_id)[2].status
        except WorkflowNotFound:
            return None

    def wait_for_end(self, workflow_id: str, *, timeout_s: float) -> str:
        """Poll the store until the workflow is terminal; its final status."""
        return wait_until(
            lambda: _terminal(self.workflow_status(workflow_id)),
            timeout_s=timeout_s,
            what=f"workflow {workflow_id} to end",
        )

    def submit_here(self, workflow_id: str, workflow: dict[str, Any]) -> None:
        """Submit a workflow from this process, as a Python client would (faster than
        ``dagq submit`` where submitting is not what a test is about)."""
        definition = load_data(workflow, source=f"{workflow_id}.yaml")

        async def send(store: Store) -> None:
            await Client(store).submit(definition, workflow_id=workflow_id)

        self.with_store(send)

    def run_here(self, workflow_id: str, tasks: list[dict[str, Any]]) -> str:
        """Run a workflow to its end in this process, on the scratch store; its status."""

        async def drive(store: Store) -> str:
            runner = LocalRunner(store, workers=2)
            await runner.submit(definition(tasks), params={}, workflow_id=workflow_id)
            return await asyncio.wait_for(runner.drive(), 20)

        return self.with_store(drive)

    def lease(self) -> Lease | None:
        """The coordinator lease as the store holds it (None when free or expired)."""
        return self.with_store(lambda store: store.leases.get(keys.COORDINATOR_LEASE))

    def with_store(self, use: Callable[[Store], Awaitable[T]]) -> T:
        """Open the scratch store in this process, run ``use`` on it, close it."""
        result: T = asyncio.run(self._read(use))
        return result

    async def _read(self, read: Callable[[Any], Any]) -> Any:
        store = open_store(self.store_url)
        try:
            return await read(store)
        finally:
            await store.close()


def _terminal(status: str | None) -> str | None:
    return status if status in WORKFLOW_TERMINAL else None
