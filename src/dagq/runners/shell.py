"""Shell tasks: a subprocess in its own process group, fed and read through files.

The task sees ``DAGQ_WORKFLOW_ID``, ``DAGQ_TASK``, ``DAGQ_ATTEMPT``,
``DAGQ_IDEMPOTENCY_KEY``, ``DAGQ_INPUTS`` (a JSON file of upstream outputs by
parent name) and ``DAGQ_OUTPUT`` (JSON written there becomes the output;
``JOBQ_OUTPUT_FILE`` names the same file for ai4s-jobq scripts). Upstream outputs
are never pasted into the command text.

The output file is read in a thread, never on the event loop, and only if it is a
regular file no larger than ``payloads.MAX_OUTPUT_BYTES``: a task that replaces it
with a FIFO, a device or a huge file fails its own attempt, with one line saying so.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import stat
import tempfile
from pathlib import Path

from dagq.errors import DagqError
from dagq.messages import TaskSpec
from dagq.payloads import MAX_DEPTH, MAX_OUTPUT_BYTES, encode_json, output_too_large
from dagq.runners import Outcome, TaskContext, tail

#: How much of stdout and of stderr is kept, from the end.
LOG_LIMIT = 64 * 1024
KILL_GRACE_S = 5.0
#: How long output may keep flowing after the command exits before leftovers are killed.
LINGER_S = 2.0


async def run_shell(spec: TaskSpec, ctx: TaskContext, *, work_dir: str | None = None) -> Outcome:
    """Run a shell task to completion, timeout or cancellation (which kills its group)."""
    with tempfile.TemporaryDirectory(prefix="dagq-", dir=work_dir) as tmp:
        inputs_file = Path(tmp, "inputs.json")
        output_file = Path(tmp, "output.json")
        inputs_file.write_text(json.dumps(ctx.inputs))
        env = {
            **os.environ,
            **spec.env,
            "DAGQ_WORKFLOW_ID": ctx.workflow_id,
            "DAGQ_TASK": ctx.task,
            "DAGQ_ATTEMPT": str(ctx.attempt),
            "DAGQ_IDEMPOTENCY_KEY": ctx.idempotency_key,
            "DAGQ_INPUTS": str(inputs_file),
            "DAGQ_OUTPUT": str(output_file),
            "JOBQ_OUTPUT_FILE": str(output_file),
        }
        if ctx.index >= 0:  # one instance of a foreach: its item (as JSON) and index
            env["DAGQ_ITEM"] = json.dumps(ctx.item)
            env["DAGQ_INDEX"] = str(ctx.index)
        if ctx.iteration:  # a loop: which iteration, and what the last one wrote
            previous_file = Path(tmp, "previous.json")
            previous_file.write_text(json.dumps(ctx.previous))
            env["DAGQ_ITERATION"] = str(ctx.iteration)
            env["DAGQ_PREVIOUS"] = str(previous_file)
        try:
            process = await _spawn(spec, env)
        except OSError as exc:
            return Outcome(ok=False, error=f"cannot start the command: {exc}", retryable=False)
        stdout, stderr = _Tail(), _Tail()
        readers = asyncio.gather(_pump(process.stdout, stdout), _pump(process.stderr, stderr))
        try:
            await asyncio.wait_for(asyncio.shield(process.wait()), spec.timeout_s)
        except TimeoutError:
            await _kill_group(process)
            await readers
            return Outcome(
                ok=False,
                error=f"timed out after {spec.timeout_s:g}s; its process group was killed"
                + _stderr_note(stderr),
                log=_log(stdout, stderr),
            )
        except asyncio.CancelledError:
            await _kill_group(process)
            readers.cancel()
            # Collect the readers' cancellation, else asyncio logs it as an error on exit.
            with contextlib.suppress(asyncio.CancelledError):
                await readers
            raise
        try:  # a background child may hold the pipes open after the task itself ended
            await asyncio.wait_for(readers, LINGER_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        return await _outcome(process.returncode or 0, spec, output_file, stdout, stderr)


async def _spawn(spec: TaskSpec, env: dict[str, str]) -> asyncio.subprocess.Process:
    common = {
        "stdin": asyncio.subprocess.DEVNULL,
        "stdout": asyncio.subprocess.PIPE,
        "stderr": asyncio.subprocess.PIPE,
        "env": env,
        "cwd": spec.cwd,
        "start_new_session": True,
    }
    if isinstance(spec.cmd, list):
        return await asyncio.create_subprocess_exec(*spec.cmd, **common)  # type: ignore[arg-type]
    return await asyncio.create_subprocess_shell(spec.cmd or "", **common)  # type: ignore[arg-type]


async def _outcome(
    code: int, spec: TaskSpec, output_file: Path, stdout: _Tail, stderr: _Tail
) -> Outcome:
    log = _log(stdout, stderr)
    if code != 0:
        if code < 0:
            reason = f"killed by signal {signal.Signals(-code).name}"
        else:
            reason = f"exit code {code}"
        retryable = code not in spec.non_retryable_exit_codes
        return Outcome(ok=False, error=reason + _stderr_note(stderr), retryable=retryable, log=log)
    # A thread: reading and parsing (up to the bound) must not hold up the event loop.
    return await asyncio.to_thread(_output, output_file, log)


def _output(output_file: Path, log: bytes) -> Outcome:
    """The outcome of a command that succeeded: what it wrote to $DAGQ_OUTPUT."""

    def failed(error: str) -> Outcome:
        return Outcome(ok=False, error=error, retryable=False, log=log)

    try:
        data = _read_output(output_file)
    except _Refused as exc:
        return failed(str(exc))
    except OSError as exc:
        return failed(f"cannot read $DAGQ_OUTPUT: {exc}")
    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        return failed(f"cannot read $DAGQ_OUTPUT: {exc}")
    if not text.strip():
        return Outcome(ok=True, output=None, log=log)
    try:
        output = json.loads(text)
    except RecursionError:  # deeper than any parser's stack: over the bound in any case
        return failed(f"the output is nested more than {MAX_DEPTH} levels deep ($DAGQ_OUTPUT)")
    except ValueError as exc:
        return failed(f"the task wrote invalid JSON to $DAGQ_OUTPUT: {exc}")
    try:
        encoded = encode_json(output, "the output")
    except DagqError as exc:
        return failed(str(exc))
    if len(encoded) > MAX_OUTPUT_BYTES:  # re-encoded, it can weigh more than the file
        return failed(output_too_large(len(encoded), MAX_OUTPUT_BYTES))
    return Outcome(ok=True, output=output, output_json=encoded, log=log)


class _Refused(Exception):
    """$DAGQ_OUTPUT is not something an output is read from."""


def _read_output(output_file: Path) -> bytes:
    """The bytes of $DAGQ_OUTPUT (none if it is missing), never more than the bound.

    Opened without blocking (a FIFO with no writer would block the open), then refused
    unless it is a regular file: a FIFO or a device could be read from forever.
    """
    try:
        fd = os.open(output_file, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return b""
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _Refused(f"$DAGQ_OUTPUT is not a regular file ({_file_kind(info.st_mode)})")
        if info.st_size > MAX_OUTPUT_BYTES:
            raise _Refused(output_too_large(info.st_size, MAX_OUTPUT_BYTES, "$DAGQ_OUTPUT"))
        data = bytearray()
        while len(data) <= MAX_OUTPUT_BYTES:  # it may have grown since fstat
            chunk = os.read(fd, min(1024 * 1024, MAX_OUTPUT_BYTES + 1 - len(data)))
            if not chunk:
                return bytes(data)
            data += chunk
    finally:
        os.close(fd)
    raise _Refused(output_too_large(len(data), MAX_OUTPUT_BYTES, "$DAGQ_OUTPUT (at least)"))


def _file_kind(mode: int) -> str:
    kinds = (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    )
    return next((name for test, name in kinds if test(mode)), "not a file")


async def _kill_group(process: asyncio.subprocess.Process) -> None:
    """SIGTERM the task's process group, then SIGKILL what is left after a grace period."""
    for sig, wait in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, None)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            await asyncio.wait_for(asyncio.shield(process.wait()), wait)
            if sig is signal.SIGTERM:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)  # stragglers in the group
            return
        except TimeoutError:
            continue


class _Tail:
    """The last LOG_LIMIT bytes of a stream."""

    def __init__(self) -> None:
        self.data = bytearray()

    def add(self, chunk: bytes) -> None:
        self.data += chunk
        if len(self.data) > 2 * LOG_LIMIT:
            del self.data[: len(self.data) - LOG_LIMIT]

    def bytes(self) -> bytes:
        return bytes(self.data[-LOG_LIMIT:])

    def text(self) -> str:
        return self.bytes().decode("utf-8", "replace")


async def _pump(stream: asyncio.StreamReader | None, sink: _Tail) -> None:
    if stream is None:
        return
    while chunk := await stream.read(65536):
        sink.add(chunk)


def _stderr_note(stderr: _Tail) -> str:
    text = tail(stderr.text(), 1500)
    return f"; stderr: {text}" if text else ""


def _log(stdout: _Tail, stderr: _Tail) -> bytes:
    out, err = stdout.bytes(), stderr.bytes()
    if not out and not err:
        return b""
    return b"--- stdout ---\n" + out + b"\n--- stderr ---\n" + err
