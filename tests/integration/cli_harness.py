"""Running the real ``dagq`` command as a user would, in a scratch directory.

Not a test module: the end-to-end tests of ``dagq run`` share it. Every run uses an
explicit ``--store sqlite:///<scratch>/dagq.db``, a clean environment (no forced
colours, a wide terminal so table rows do not wrap) and a deadline.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

from dagq.plan import Plan
from dagq.state import RunState
from dagq.stores import open_store
from dagq.submission import Submitted
from dagq.views import RunView, load_run, load_view

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"

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


def summary_rows(text: str) -> dict[str, list[str]]:
    """Parse the rows of a summary table printed with box-drawing (or ASCII) borders."""
    rows: dict[str, list[str]] = {}
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped[0] not in "│|":
            continue
        cells = [c.strip() for c in stripped.strip("│|").split("│" if "│" in stripped else "|")]
        if len(cells) >= 5 and cells[0] and cells[0] != "task":
            rows[cells[0]] = cells[1:]
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
        self._started: list[Started] = []
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
        """``dagq ARGS`` (``run`` gets the scratch store unless ``store`` is False)."""
        words = [str(a) for a in args]
        if store and words and words[0] == "run":
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
        self._started.append(started)
        return started

    def close(self) -> None:
        """Stop every background ``dagq`` this object started."""
        for started in self._started:
            started.kill()

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

    async def _read(self, read: Callable[[Any], Any]) -> Any:
        store = open_store(self.store_url)
        try:
            return await read(store)
        finally:
            await store.close()
