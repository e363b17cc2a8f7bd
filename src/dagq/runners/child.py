"""Calling a Python task's function, and the loop of a pool process that does it.

:func:`call_task` imports the function named by ``call`` (``package.module:function``),
passes it its ``args`` (a mapping as keyword arguments, a list as positional ones)
plus ``inputs``, ``ctx``, ``item`` and ``index`` when its signature names them, runs
it (sync, or async on an event loop of its own) and turns what happens into a
:class:`Reply`: the output encoded as JSON, or the error — ``ExceptionType: message``,
with the traceback kept apart for the attempt's log.

:func:`main` is a pool process (:mod:`dagq.runners.pool`): it reads requests from one
pipe and writes replies to another, one task at a time, until its parent closes the
pipe or dies. It imports little, so that it starts fast; the tasks' own modules are
imported on first use and stay imported for the tasks after.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import pickle
import signal
import struct
import sys
import traceback
from collections.abc import Callable
from typing import Any, NamedTuple

import msgspec

from dagq.errors import NonRetryable, RetryAfter
from dagq.payloads import MAX_DEPTH, too_deep
from dagq.runners import TaskContext

#: What the engine passes to a function whose signature names it (never via **kwargs).
PROVIDED = ("inputs", "ctx", "item", "index")
#: A frame on the pipes: its length, then a pickle.
HEADER = struct.Struct("!I")
PR_SET_PDEATHSIG = 1


class ImportFailed(Exception):
    """The function named by ``call`` could not be imported."""


class Reply(NamedTuple):
    """How a call ended, as it travels back from a pool process."""

    ok: bool
    #: The output, encoded as JSON (when ``ok``).
    output: bytes = b""
    error: str | None = None
    retryable: bool = True
    retry_after_s: float | None = None
    error_type: str | None = None
    #: For the attempt's log: the traceback of the exception that failed it.
    log: str = ""


class Request(NamedTuple):
    """One task for a pool process (``paths``: the import path, when it changed)."""

    call: str
    args: Any
    ctx: TaskContext
    paths: list[str] | None = None


@functools.lru_cache(maxsize=1024)
def resolve(call: str) -> tuple[Callable[..., Any], bool, frozenset[str]]:
    """The function, whether it is async, and which of :data:`PROVIDED` it takes."""
    module_name, _, attribute = call.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            target = getattr(target, part)
    except Exception as exc:
        raise ImportFailed(f"cannot import '{call}': {type(exc).__name__}: {exc}") from exc
    if not callable(target):
        raise ImportFailed(f"'{call}' is not callable")
    parameters = inspect.signature(target).parameters
    # Only a parameter that names them explicitly receives inputs / ctx / item / index,
    # so a function taking **kwargs gets exactly its args.
    wanted = frozenset(name for name in PROVIDED if name in parameters)
    return target, inspect.iscoroutinefunction(target), wanted


def prepare(
    call: str, args: Any, ctx: TaskContext
) -> tuple[Callable[..., Any], bool, list[Any], dict[str, Any]]:
    """The function to call, whether it is async, and its arguments (ImportFailed if it
    cannot be imported)."""
    function, is_async, wanted = resolve(call)
    positional, keywords = _arguments(args)
    provided = {"inputs": ctx.inputs, "ctx": ctx, "item": ctx.item, "index": ctx.index}
    for name in wanted:
        if name in ("item", "index") and ctx.index < 0:
            continue  # not a foreach instance: the function's own default applies
        keywords[name] = provided[name]
    return function, is_async, positional, keywords


def call_task(call: str, args: Any, ctx: TaskContext) -> Reply:
    """Run the task's function to its end, here, and say how it ended."""
    try:
        function, is_async, positional, keywords = prepare(call, args, ctx)
    except ImportFailed as exc:
        return Reply(ok=False, error=str(exc), retryable=False)
    try:
        if is_async:
            result = _event_loop().run_until_complete(function(*positional, **keywords))
        else:
            result = function(*positional, **keywords)
    except BaseException as exc:  # whatever the task raised is its failure
        return failure(exc)
    return encode_output(result)


def failure(exc: BaseException) -> Reply:
    """The reply for an exception a task raised: its type and message as the error, its
    traceback for the log."""
    trace = "".join(traceback.format_exception(exc))
    if isinstance(exc, NonRetryable):
        return Reply(ok=False, error=describe(exc), retryable=False, log=trace)
    if isinstance(exc, RetryAfter):
        return Reply(ok=False, error=describe(exc), retry_after_s=exc.seconds, log=trace)
    return Reply(ok=False, error=describe(exc), error_type=type(exc).__name__, log=trace)


def describe(exc: BaseException) -> str:
    """``ExceptionType: message`` (no traceback: that goes to the attempt's log)."""
    message = str(exc)
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def encode_output(result: Any) -> Reply:
    """A task's return value as JSON, or the reason it cannot be an output."""
    if too_deep(result):
        return Reply(
            ok=False,
            error=f"the output is nested more than {MAX_DEPTH} levels deep",
            retryable=False,
        )
    try:
        return Reply(ok=True, output=msgspec.json.encode(result))
    except (TypeError, ValueError, OverflowError, RecursionError, msgspec.EncodeError) as exc:
        return Reply(ok=False, error=f"the output is not JSON-serialisable: {exc}", retryable=False)


def _arguments(args: Any) -> tuple[list[Any], dict[str, Any]]:
    if args is None:
        return [], {}
    if isinstance(args, dict):
        return [], dict(args)
    if isinstance(args, list):
        return list(args), {}
    return [args], {}


@functools.cache
def _event_loop() -> Any:
    """The event loop async tasks run on in a pool process (one, reused)."""
    import asyncio

    return asyncio.new_event_loop()


# --- the pool process ---------------------------------------------------------------


def main(argv: list[str]) -> None:
    """Serve requests from the pipe ``argv[0]``, replying on ``argv[1]``, until the
    parent (pid ``argv[2]``) closes it or dies."""
    requests, replies, parent = int(argv[0]), int(argv[1]), int(argv[2])
    _die_with(parent)
    while True:
        frame = _read(requests)
        if frame is None:
            return
        request: Request = pickle.loads(frame)
        if request.paths is not None:
            sys.path[:] = request.paths
            importlib.invalidate_caches()
            resolve.cache_clear()
        reply = call_task(request.call, request.args, request.ctx)
        sys.stdout.flush()
        sys.stderr.flush()
        _write(replies, pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL))


def _die_with(parent: int) -> None:
    """Be killed when the parent dies (Linux), rather than run on as an orphan."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # it died before we asked
        os._exit(0)


def _read(fd: int) -> bytes | None:
    header = _read_exactly(fd, HEADER.size)
    if header is None:
        return None
    return _read_exactly(fd, HEADER.unpack(header)[0])


def _read_exactly(fd: int, n: int) -> bytes | None:
    chunks = bytearray()
    while len(chunks) < n:
        chunk = os.read(fd, n - len(chunks))
        if not chunk:
            return None
        chunks += chunk
    return bytes(chunks)


def _write(fd: int, data: bytes) -> None:
    view = memoryview(HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


if __name__ == "__main__":
    main(sys.argv[1:])
