"""Shell tasks: a subprocess in its own process group, fed and read through files.

A command string runs with ``bash -c`` (``/bin/sh -c`` only where there is no bash),
as ai4s-jobq runs it. The task sees ``DAGQ_WORKFLOW_ID``, ``DAGQ_TASK``,
``DAGQ_ATTEMPT``, ``DAGQ_IDEMPOTENCY_KEY``, ``DAGQ_INPUTS`` (a JSON file of upstream
outputs by parent name), ``DAGQ_OUTPUT`` (JSON written there becomes the output) and
``DAGQ_CANCEL_FILE`` (created when the task must stop); and ai4s-jobq's contract:
``JOBQ_WORKFLOW_ID``, ``JOBQ_WORKFLOW_TASK``, ``JOBQ_WORKFLOW_ATTEMPT``,
``JOBQ_TASK_ID``, ``JOBQ_WORKFLOW_UPSTREAM_REFS`` (a JSON file: each upstream task's
output as JSON text, or null) and ``JOBQ_OUTPUT_FILE`` (the output file, created empty
before the command starts), with ``PYTHONUNBUFFERED=1`` unless the task's env says
otherwise. Upstream outputs are never pasted into the command text.

The output file is read in a thread, never on the event loop, and only if it is a
regular file no larger than ``payloads.MAX_OUTPUT_BYTES``: a task that replaces it
with a FIFO, a device or a huge file fails its own attempt, with one line saying so.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import os
import shutil
import signal
import stat
import tempfile
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from dagq.errors import DagqError
from dagq.messages import TaskSpec
from dagq.payloads import MAX_DEPTH, MAX_OUTPUT_BYTES, encode_json, output_too_large
from dagq.runners import Outcome, TaskContext, dirsync, tail
from dagq.runners.capture import Sink, Tail, render
from dagq.runners.dirsync import DirSync

_T = TypeVar("_T")

KILL_GRACE_S = 5.0
#: How long output may keep flowing after the command exits before leftovers are killed.
LINGER_S = 2.0


async def run_shell(
    spec: TaskSpec, ctx: TaskContext, *, work_dir: str | None = None, live: Sink | None = None
) -> Outcome:
    """Run a shell task to completion, timeout or cancellation (which kills its group).

    What it writes is kept (the tail of each stream) and, as it comes, handed to ``live``.
    """
    with tempfile.TemporaryDirectory(prefix="dagq-", dir=work_dir) as tmp:
        # Upstream outputs may be large: written in a thread, off the event loop.
        # To its end even if cancelled: the folder must not go while the thread writes.
        files = await _to_its_end(asyncio.to_thread(_write_files, Path(tmp), ctx, spec))
        env = _environment(spec, ctx, files)
        sync: DirSync | None = None
        if spec.dirsync_to is not None:
            every_s, warning = dirsync.interval(spec.env)
            sync = DirSync(files.synced, spec.dirsync_to, every_s=every_s, task=ctx.task)
            if warning is not None:
                sync.warnings.append(warning)
        # The output pipes are ours, not asyncio's: on Python 3.11 ``process.wait()``
        # returns only once its own pipes close, which a child the command left running
        # (``cmd &``) keeps open for as long as it lives.
        (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe()
        try:
            process = await _spawn(spec, env, out_w, err_w)
        except BaseException as exc:  # not started, or cancelled (asyncio killed it then)
            for fd in (out_r, err_r):
                os.close(fd)
            if not isinstance(exc, OSError):
                raise
            return Outcome(ok=False, error=f"cannot start the command: {exc}", retryable=False)
        finally:
            os.close(out_w)
            os.close(err_w)
        pipes: list[tuple[asyncio.StreamReader, asyncio.BaseTransport]] = []
        try:
            for fd in (out_r, err_r):
                pipes.append(await _read_end(fd))
        except BaseException:  # cancelled before the wait began: the command must not outlive it
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            _close_unwaited(process)
            for _, transport in pipes:
                transport.close()
            for fd in (out_r, err_r)[len(pipes) + 1 :]:  # not yet handed to a transport
                os.close(fd)
            raise
        if sync is not None:
            sync.start()
        stdout, stderr = Tail(live), Tail(live)
        readers = asyncio.gather(_pump(pipes[0][0], stdout), _pump(pipes[1][0], stderr))
        try:
            return await _finish(
                spec, process, readers=readers, sync=sync, files=files, stdout=stdout, stderr=stderr
            )
        finally:
            for _, transport in pipes:
                transport.close()


def _close_unwaited(process: asyncio.subprocess.Process) -> None:
    """Close the transport of a process killed and never waited for (closing reaps it):
    left open, it warns "unclosed transport" whenever it is collected."""
    transport = getattr(process, "_transport", None)  # asyncio keeps it private
    if transport is not None:
        transport.close()


async def _finish(
    spec: TaskSpec,
    process: asyncio.subprocess.Process,
    *,
    readers: asyncio.Future[Any],
    sync: DirSync | None,
    files: _Files,
    stdout: Tail,
    stderr: Tail,
) -> Outcome:
    """Wait for the command (to its end, timeout or cancellation), then its output."""
    failure: Outcome | None = None
    try:
        await asyncio.wait_for(asyncio.shield(process.wait()), spec.timeout_s)
    except TimeoutError:
        await _kill_group(process)
        with contextlib.suppress(TimeoutError):  # a child that left the group: not waited for
            await asyncio.wait_for(readers, LINGER_S)
        failure = Outcome(
            ok=False,
            error=f"timed out after {spec.timeout_s:g}s; its process group was killed"
            + _stderr_note(stderr),
        )
    except asyncio.CancelledError:
        await _kill_group(process)
        readers.cancel()
        # Collect the readers' cancellation, else asyncio logs it as an error on exit.
        with contextlib.suppress(asyncio.CancelledError):
            await readers
        if sync is not None:
            await sync.finish(final=False)
        raise
    if failure is None:
        try:  # a background child may hold the pipes open after the task itself ended
            await asyncio.wait_for(readers, LINGER_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
    warnings = [] if sync is None else await sync.finish()
    log = _log(stdout, stderr, warnings)
    if failure is None:
        failure = _failure(process.returncode or 0, spec, stderr)
    if failure is None:
        # A thread: reading and parsing (up to the bound) must not hold up the loop.
        return await asyncio.to_thread(_output, files.output, log, spec.jobq)
    failure = dataclasses.replace(failure, log=log)
    if spec.jobq:  # ai4s-jobq keeps what a failed attempt wrote
        return await asyncio.to_thread(_failed_output, failure, files.output)
    return failure


class _Files(msgspec.Struct, frozen=True):
    """The files of one attempt (paths as text), and the directory bg_dirsync_to copies."""

    inputs: str
    refs: str
    output: Path
    previous: str | None
    synced: str


def _write_files(tmp: Path, ctx: TaskContext, spec: TaskSpec) -> _Files:
    """The inputs file (outputs by parent), ai4s-jobq's refs file (each parent's output
    as JSON text, or null), the previous iteration's output, and the output file,
    created empty before the command starts (as ai4s-jobq does)."""
    inputs_file = tmp / "inputs.json"
    inputs_file.write_text(json.dumps(ctx.inputs))
    refs_file = tmp / "upstream_refs.json"
    refs = {name: None if v is None else json.dumps(v) for name, v in ctx.inputs.items()}
    refs_file.write_text(json.dumps(refs))
    output_file = tmp / "output.json"
    output_file.touch()
    previous = None
    if ctx.iteration:  # a loop: what the last iteration wrote
        previous_file = tmp / "previous.json"
        previous_file.write_text(json.dumps(ctx.previous))
        previous = str(previous_file)
    synced = ""
    if spec.dirsync_to is not None:
        # The task's working directory when it names one, else a directory of its own.
        if spec.cwd is not None:
            synced = os.path.abspath(spec.cwd)
        else:
            synced = str(tmp / "dirsync")
            os.mkdir(synced)
    return _Files(str(inputs_file), str(refs_file), output_file, previous, synced)


def _environment(spec: TaskSpec, ctx: TaskContext, files: _Files) -> dict[str, str]:
    output = str(files.output)
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",  # a task's own env may say otherwise
        **spec.env,
        "DAGQ_WORKFLOW_ID": ctx.workflow_id,
        "DAGQ_TASK": ctx.task,
        "DAGQ_ATTEMPT": str(ctx.attempt),
        "DAGQ_IDEMPOTENCY_KEY": ctx.idempotency_key,
        "DAGQ_INPUTS": files.inputs,
        "DAGQ_OUTPUT": output,
        "DAGQ_CANCEL_FILE": ctx.cancel_file,
        # ai4s-jobq's contract, so its scripts (and its helpers) run unchanged.
        "JOBQ_WORKFLOW_ID": ctx.workflow_id,
        "JOBQ_WORKFLOW_TASK": ctx.task,
        "JOBQ_WORKFLOW_ATTEMPT": str(ctx.attempt),
        "JOBQ_TASK_ID": ctx.task_id or f"{ctx.workflow_id}/{ctx.task}/{ctx.attempt}",
        "JOBQ_WORKFLOW_UPSTREAM_REFS": files.refs,
        "JOBQ_OUTPUT_FILE": output,
    }
    if ctx.traceparent:  # the task's own tracing joins the attempt's span
        env["TRACEPARENT"] = ctx.traceparent
        env["TRACESTATE"] = ""  # dagq keeps no vendor state
    if ctx.index >= 0:  # one instance of a foreach: its item (as JSON) and index
        env["DAGQ_ITEM"] = json.dumps(ctx.item)
        env["DAGQ_INDEX"] = str(ctx.index)
    if files.previous is not None:
        env["DAGQ_ITERATION"] = str(ctx.iteration)
        env["DAGQ_PREVIOUS"] = files.previous
    if spec.dirsync_to is not None:
        env["AMLT_DIRSYNC_DIR"] = files.synced
    return env


@functools.cache
def _bash() -> str | None:
    """bash, as ai4s-jobq runs commands with it (``[[ ]]``, ``{1..3}``); None without."""
    return shutil.which("bash")


async def _to_its_end(work: Awaitable[_T]) -> _T:
    """Await ``work`` (a thread's) to its end even if cancelled meanwhile, then raise
    the cancellation: what the thread does must be over before what follows."""
    job = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(job)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await job
        raise


async def _read_end(fd: int) -> tuple[asyncio.StreamReader, asyncio.BaseTransport]:
    """A stream over the read end of a pipe (closed with its transport)."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", buffering=0)
    )
    return reader, transport


async def _spawn(
    spec: TaskSpec, env: dict[str, str], stdout: int, stderr: int
) -> asyncio.subprocess.Process:
    common = {
        "stdin": asyncio.subprocess.DEVNULL,
        "stdout": stdout,
        "stderr": stderr,
        "env": env,
        "cwd": spec.cwd,
        "start_new_session": True,
    }
    if isinstance(spec.cmd, list):
        return await asyncio.create_subprocess_exec(*spec.cmd, **common)  # type: ignore[arg-type]
    bash = _bash()
    if bash is not None:
        return await asyncio.create_subprocess_exec(bash, "-c", spec.cmd or "", **common)  # type: ignore[arg-type]
    return await asyncio.create_subprocess_shell(spec.cmd or "", **common)  # type: ignore[arg-type]


def _failure(code: int, spec: TaskSpec, stderr: Tail) -> Outcome | None:
    """The failure a non-zero exit code means (None for zero)."""
    if code == 0:
        return None
    reason = f"killed by signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
    retryable = code not in spec.non_retryable_exit_codes
    return Outcome(ok=False, error=reason + _stderr_note(stderr), retryable=retryable)


def _output(output_file: Path, log: bytes, jobq: bool) -> Outcome:
    """The outcome of a command that succeeded: what it wrote to $DAGQ_OUTPUT.

    Under ai4s-jobq semantics, text that is not JSON completes the task with no output
    and a warning (ai4s-jobq does so); under dagq's it fails the task.
    """
    try:
        written = _written(output_file, "$JOBQ_OUTPUT_FILE" if jobq else "$DAGQ_OUTPUT")
    except _Invalid as exc:
        if jobq:
            return Outcome(ok=True, log=log, warning=f"{exc}; the task completed with no output")
        return Outcome(ok=False, error=str(exc), retryable=False, log=log)
    except _Refused as exc:
        return Outcome(ok=False, error=str(exc), retryable=False, log=log)
    if written is None:
        return Outcome(ok=True, output=None, log=log)
    return Outcome(ok=True, output=written[0], output_json=written[1], log=log)


def _failed_output(failure: Outcome, output_file: Path) -> Outcome:
    """A failed attempt under ai4s-jobq semantics, with the output it wrote (if any)."""
    try:
        written = _written(output_file, "$JOBQ_OUTPUT_FILE")
    except (_Invalid, _Refused) as exc:
        return dataclasses.replace(failure, warning=f"its output was not kept: {exc}")
    if written is None:
        return failure
    return dataclasses.replace(failure, output=written[0], output_json=written[1])


def _written(output_file: Path, name: str) -> tuple[Any, bytes] | None:
    """What the task wrote to its output file (``name`` in errors): the value and its
    JSON, or None if it wrote nothing."""
    try:
        data = _read_output(output_file, name)
    except OSError as exc:
        raise _Refused(f"cannot read {name}: {exc}") from None
    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        raise _Invalid(f"cannot read {name}: {exc}") from None
    if not text.strip():
        return None
    try:
        output = json.loads(text)
    except RecursionError:  # deeper than any parser's stack: over the bound in any case
        raise _Refused(f"the output is nested more than {MAX_DEPTH} levels deep ({name})") from None
    except ValueError as exc:
        raise _Invalid(f"the task wrote invalid JSON to {name}: {exc}") from None
    try:
        encoded = encode_json(output, "the output")
    except DagqError as exc:
        raise _Refused(str(exc)) from None
    if len(encoded) > MAX_OUTPUT_BYTES:  # re-encoded, it can weigh more than the file
        raise _Refused(output_too_large(len(encoded), MAX_OUTPUT_BYTES))
    return output, encoded


class _Refused(Exception):
    """The output file is not something an output is read from (or breaks a bound)."""


class _Invalid(Exception):
    """The output file does not hold JSON text."""


def _read_output(output_file: Path, name: str = "$DAGQ_OUTPUT") -> bytes:
    """The bytes of the output file (none if it is missing), never more than the bound.

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
            raise _Refused(f"{name} is not a regular file ({_file_kind(info.st_mode)})")
        if info.st_size > MAX_OUTPUT_BYTES:
            raise _Refused(output_too_large(info.st_size, MAX_OUTPUT_BYTES, name))
        data = bytearray()
        while len(data) <= MAX_OUTPUT_BYTES:  # it may have grown since fstat
            chunk = os.read(fd, min(1024 * 1024, MAX_OUTPUT_BYTES + 1 - len(data)))
            if not chunk:
                return bytes(data)
            data += chunk
    finally:
        os.close(fd)
    raise _Refused(output_too_large(len(data), MAX_OUTPUT_BYTES, f"{name} (at least)"))


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
    """SIGTERM the task's process group, then SIGKILL what is left after a grace period.

    Cancelled during the grace period (a worker told to stop now, or a loop shutting
    down), it SIGKILLs at once: a group that ignores SIGTERM is never left running.
    """
    try:
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
    except asyncio.CancelledError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        raise


async def _pump(stream: asyncio.StreamReader | None, sink: Tail) -> None:
    if stream is None:
        return
    while chunk := await stream.read(65536):
        sink.add(chunk)


def _stderr_note(stderr: Tail) -> str:
    text = tail(stderr.text(), 1500)
    return f"; stderr: {text}" if text else ""


def _log(stdout: Tail, stderr: Tail, warnings: list[str] | None = None) -> bytes:
    # bg_dirsync_to trouble: the task's log says so, the task goes on
    notes = ["\n--- warnings ---\n", "\n".join(warnings)] if warnings else None
    return render(stdout, stderr, notes)
