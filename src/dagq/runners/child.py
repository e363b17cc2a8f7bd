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

import _socket  # (not socket: its enums and helpers are not needed here)
import contextlib
import dataclasses
import fcntl
import functools
import importlib
import inspect
import logging
import operator
import os
import pickle
import select
import signal
import struct
import sys
import termios
import traceback
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import msgspec

from dagq.errors import DamagedData, NonRetryable, RetryAfter
from dagq.jobq import task_scope
from dagq.observability import tracing
from dagq.payloads import MAX_DEPTH, MAX_OUTPUT_BYTES, output_too_large, too_deep
from dagq.runners import StoredInputs, TaskContext
from dagq.runners.held import Held

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
    #: The attempt's stdout or stderr may still hold bytes the worker has not read (False:
    #: both were empty when the call ended, so the worker need not look).
    unread: bool = True


class Request(NamedTuple):
    """One task for a pool process (``paths``: the import path, when it changed).

    On the pipe it is a plain tuple, and so is ``ctx`` (:func:`pack`): a plain tuple
    pickles ten times faster than a named tuple holding a dataclass.
    """

    call: str
    args: Any
    ctx: TaskContext
    paths: list[str] | None = None
    #: ``call`` is the worker's processor, and ``args`` the task's kwargs.
    processor: bool = False
    #: Upstream outputs still encoded, decoded here into ``ctx.inputs``.
    inputs: StoredInputs | None = None
    #: The FIFOs the attempt's stdout and stderr go to (None: left as they are).
    logs: tuple[str, str] | None = None

    def pack(self) -> bytes:
        """The request as it travels."""
        ctx = _context_fields(self.ctx)
        stored = None if self.inputs is None else _inputs_fields(self.inputs)
        request = (self.call, self.args, ctx, self.paths, self.processor, stored, self.logs)
        return pickle.dumps(request, pickle.HIGHEST_PROTOCOL)

    @classmethod
    def unpack(cls, data: bytes) -> "Request":
        call, args, ctx, paths, processor, stored, logs = pickle.loads(data)
        inputs = None if stored is None else StoredInputs(*stored)
        return cls(call, args, TaskContext(*ctx), paths, processor, inputs, logs)

    def wants_inputs(self) -> bool:
        """Does the function see its inputs, by naming ``inputs`` or ``ctx``? (If it
        cannot be imported, no: calling it says why.) One that does not gets them
        decoded only if it asks a :mod:`dagq.jobq` helper for them."""
        try:
            _, _, wanted = resolve(self.call)
        except ImportFailed:
            return False
        return "ctx" in wanted or (not self.processor and "inputs" in wanted)

    def context(self) -> TaskContext:
        """The task's context, its inputs decoded (DamagedData if they cannot be)."""
        if self.inputs is None:
            return self.ctx
        fields = list(_context_fields(self.ctx))
        fields[_INPUTS_AT] = self.inputs.decode()
        return TaskContext(*fields)  # (dataclasses.replace takes several times longer)


#: A context's and stored inputs' fields as a plain tuple, in order (one C call each).
_context_fields = operator.attrgetter(*(f.name for f in dataclasses.fields(TaskContext)))
_inputs_fields = operator.attrgetter(*(f.name for f in dataclasses.fields(StoredInputs)))
_INPUTS_AT = [f.name for f in dataclasses.fields(TaskContext)].index("inputs")


@functools.lru_cache(maxsize=1024)
def resolve(call: str) -> tuple[Callable[..., Any], bool, frozenset[str]]:
    """The function, whether it is async, and which of :data:`PROVIDED` it takes."""
    module_name, _, attribute = call.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            target = getattr(target, part)
    except Exception as exc:
        raise ImportFailed(f"cannot import '{call}': {describe(exc)}") from exc
    if not callable(target):
        raise ImportFailed(f"'{call}' is not callable")
    parameters = inspect.signature(target).parameters
    # Only a parameter that names them explicitly receives inputs / ctx / item / index,
    # so a function taking **kwargs gets exactly its args.
    wanted = frozenset(name for name in PROVIDED if name in parameters)
    return target, inspect.iscoroutinefunction(target), wanted


def prepare(
    call: str, args: Any, ctx: TaskContext, *, processor: bool = False
) -> tuple[Callable[..., Any], bool, list[Any], dict[str, Any]]:
    """The function to call, whether it is async, and its arguments (ImportFailed if it
    cannot be imported).

    A processor (``processor``) gets the task's kwargs (``args``) as keyword arguments,
    and ``ctx`` if its signature names it (and no kwarg has that name): nothing else.
    """
    function, is_async, wanted = resolve(call)
    if processor:
        keywords = dict(args) if isinstance(args, dict) else {}
        if "ctx" in wanted and "ctx" not in keywords:
            keywords["ctx"] = ctx
        return function, is_async, [], keywords
    positional, keywords = _arguments(args)
    provided = {"inputs": ctx.inputs, "ctx": ctx, "item": ctx.item, "index": ctx.index}
    for name in wanted:
        if name in ("item", "index") and ctx.index < 0:
            continue  # not a foreach instance: the function's own default applies
        keywords[name] = provided[name]
    return function, is_async, positional, keywords


def call_task(
    call: str,
    args: Any,
    ctx: TaskContext,
    *,
    processor: bool = False,
    load: Callable[[], dict[str, Any]] | None = None,
) -> Reply:
    """Run the task's function to its end, here, and say how it ended.

    While it runs, :mod:`dagq.jobq`'s helpers serve it (``load``: decodes the inputs
    ``ctx`` leaves out, if a helper asks for them); a value it gave ``set_output`` is
    its output if it returns None.
    """
    try:
        function, is_async, positional, keywords = prepare(call, args, ctx, processor=processor)
    except ImportFailed as exc:
        return Reply(ok=False, error=str(exc), retryable=False)
    with task_scope(ctx, load) as scope, tracing.joined(ctx.traceparent):
        try:
            if is_async:
                result = _event_loop().run_until_complete(function(*positional, **keywords))
            else:
                result = function(*positional, **keywords)
        except BaseException as exc:  # whatever the task raised is its failure
            return failure(exc)
    if result is None and scope.has_output:
        result = scope.output
    return encode_output(result)


def failure(exc: BaseException) -> Reply:
    """The reply for an exception a task raised: its type and message as the error, its
    traceback for the log (as far as it can be formatted: the exception is the task's
    own code, and its ``__str__`` may raise too)."""
    trace = formatted_traceback(exc)
    if isinstance(exc, NonRetryable):
        return Reply(ok=False, error=describe(exc), retryable=False, log=trace)
    if isinstance(exc, RetryAfter):
        return Reply(ok=False, error=describe(exc), retry_after_s=exc.seconds, log=trace)
    return Reply(ok=False, error=describe(exc), error_type=type(exc).__name__, log=trace)


def describe(exc: BaseException) -> str:
    """``ExceptionType: message`` (no traceback: that goes to the attempt's log).

    An exception whose ``__str__`` fails is ``ExceptionType: <unprintable: ...>``.
    """
    message = printable(exc)
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def printable(exc: BaseException) -> str:
    """``str(exc)``, or what went wrong making it (never an exception)."""
    try:
        return str(exc)
    except Exception as inner:
        try:
            why = f"{type(inner).__name__}: {inner}"
        except Exception:
            why = type(inner).__name__
        return f"<unprintable: str() raised {why}>"


def formatted_traceback(exc: BaseException) -> str:
    """The traceback of ``exc`` for a log; if it cannot be formatted whole (a broken
    ``__str__`` is handled by :mod:`traceback`, other oddities may not be), its frames."""
    try:
        return "".join(traceback.format_exception(exc))
    except Exception:
        try:
            frames = "".join(traceback.format_tb(exc.__traceback__))
        except Exception:
            frames = ""
        return f"Traceback (most recent call last):\n{frames}{describe(exc)}\n"


def encode_output(result: Any) -> Reply:
    """A task's return value as JSON, or the reason it cannot be an output (not JSON,
    nested too deep, or over ``MAX_OUTPUT_BYTES``)."""
    if too_deep(result):
        return Reply(
            ok=False,
            error=f"the output is nested more than {MAX_DEPTH} levels deep",
            retryable=False,
        )
    try:
        encoded = msgspec.json.encode(result)
    except (TypeError, ValueError, OverflowError, RecursionError, msgspec.EncodeError) as exc:
        return Reply(ok=False, error=f"the output is not JSON-serialisable: {exc}", retryable=False)
    if len(encoded) > MAX_OUTPUT_BYTES:  # refused here: it never crosses the pipe
        error = output_too_large(len(encoded), MAX_OUTPUT_BYTES)
        return Reply(ok=False, error=error, retryable=False)
    return Reply(ok=True, output=encoded)


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


# --- the pool process and the process that forks them -------------------------------


def zygote(argv: list[str]) -> None:
    """Fork pool processes on request, and report how they end.

    Requests come on the socket ``argv[0]``, each with the two pipe ends of a new
    pool process (its requests and its replies); the new process's pid, and later its
    exit code, go out on the pipe ``argv[1]``. Forking this small single-threaded
    process, which has imported all a pool process needs, takes a few milliseconds; a
    fresh interpreter takes a tenth of a second. It ends when the parent (pid
    ``argv[2]``) closes the socket or dies; its pool processes die with it.
    """
    control = _socket.socket(fileno=int(argv[0]))
    events, parent = int(argv[1]), int(argv[2])
    _die_with(parent)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    while True:
        ready, _, _ = select.select([control.fileno(), wake_r], [], [])
        if wake_r in ready:
            os.read(wake_r, 4096)
            _report_exits(events)
        if control.fileno() in ready:
            message, fds = _receive_fds(control, 2)
            if not message:
                return
            pid = os.fork()
            if pid == 0:
                _become_pool_process(fds, [control.fileno(), events, wake_r, wake_w])
            for fd in fds:
                os.close(fd)
            _write(events, pickle.dumps(("forked", pid)))


def _receive_fds(control: _socket.socket, most: int) -> tuple[bytes, list[int]]:
    """A message on ``control`` and the file descriptors it carries (at most ``most``)."""
    message, ancillary, _, _ = control.recvmsg(16, _socket.CMSG_LEN(most * _FD.size))
    fds: list[int] = []
    for level, kind, data in ancillary:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            fds.extend(fd for (fd,) in _FD.iter_unpack(data[: len(data) - len(data) % _FD.size]))
    return message, fds


_FD = struct.Struct("i")


def _become_pool_process(fds: list[int], zygote_fds: list[int]) -> None:
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for fd in zygote_fds:
        os.close(fd)
    os.setsid()  # its own process group: killing it kills what the task started
    _as_batch()
    code = 0
    try:
        main([str(fds[0]), str(fds[1]), str(os.getppid())])
    except BaseException:  # whatever happened, this process must not return to the loop
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _as_batch() -> None:
    """Be scheduled as a batch process (Linux): handing this process a task then
    does not preempt the worker at once, so the worker hands out a few and reads
    answers in between, instead of switching processes at every task."""
    if hasattr(os, "SCHED_BATCH"):
        with contextlib.suppress(OSError):
            os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))


def _report_exits(events: int) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _write(events, pickle.dumps(("exited", pid, os.waitstatus_to_exitcode(status))))


def main(argv: list[str]) -> None:
    """Serve requests from the pipe ``argv[0]``, replying on ``argv[1]``, until the
    parent (pid ``argv[2]``) closes it or dies."""
    requests, replies, parent = int(argv[0]), int(argv[1]), int(argv[2])
    _die_with(parent)
    for stream in (sys.stdout, sys.stderr):  # as tasks have them: then set once, not each time
        with contextlib.suppress(AttributeError, ValueError):
            stream.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    frames = _Frames(requests)
    held = Held()  # the stored inputs the worker sent, kept for the requests after
    while True:
        frame = frames.next()
        if frame is None:
            return
        request = Request.unpack(frame)
        if request.paths is not None:
            sys.path[:] = request.paths
            importlib.invalidate_caches()
            resolve.cache_clear()
        try:
            if request.inputs is not None:  # every request, to stay in step with the worker
                request = request._replace(inputs=held.fill_in(request.inputs))
        except DamagedData as exc:  # out of step: this process ends, a fresh one follows
            reply = Reply(ok=False, error=f"cannot load upstream outputs: {exc}")
            with contextlib.suppress(BrokenPipeError):
                _write(replies, pickle.dumps(tuple(reply), protocol=pickle.HIGHEST_PROTOCOL))
            return
        with redirected(request.logs):
            load = None
            try:
                if request.inputs is None or request.wants_inputs():
                    ctx = request.context()
                else:
                    ctx, load = request.ctx, request.inputs.decode
            except DamagedData as exc:
                reply = Reply(ok=False, error=f"cannot load upstream outputs: {exc}")
            else:
                try:
                    reply = call_task(
                        request.call, request.args, ctx, processor=request.processor, load=load
                    )
                except Exception as exc:  # a fault here fails this task, not the process
                    reply = Reply(ok=False, error=f"the pool process failed it: {describe(exc)}")
                if tracing.enabled():  # its spans out before the reply (it may be killed)
                    tracing.flush()
        if not _send_reply(replies, reply, request.logs):
            return  # the parent is gone


def _send_reply(replies: int, reply: Reply, logs: tuple[str, str] | None) -> bool:
    """Send ``reply``, saying whether the attempt's output FIFOs still hold unread bytes;
    False if the parent is gone."""
    if logs is not None and not _redirection.unread(logs):
        reply = reply._replace(unread=False)
    try:
        _write(replies, pickle.dumps(tuple(reply), protocol=pickle.HIGHEST_PROTOCOL))
    except BrokenPipeError:
        return False
    return True


#: How ``logging`` records of a task show in its log, when the task set up no handler.
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _Redirection:
    """What :func:`redirected` opens once and reuses from attempt to attempt: the
    FIFOs (the worker keeps them for the life of this process), this process's own
    stdout and stderr, and the logging handler."""

    def __init__(self) -> None:
        self.fifos: dict[tuple[str, str], tuple[int, int]] = {}
        self.originals: tuple[int, int] | None = None
        self.handler: logging.Handler | None = None

    def targets(self, paths: tuple[str, str]) -> tuple[int, int]:
        fds = self.fifos.get(paths)
        if fds is None:
            out = os.open(paths[0], os.O_WRONLY | os.O_CLOEXEC)
            try:
                err = os.open(paths[1], os.O_WRONLY | os.O_CLOEXEC)
            except OSError:
                os.close(out)
                raise
            fds = self.fifos[paths] = (out, err)
        if self.originals is None:
            self.originals = (
                fcntl.fcntl(1, fcntl.F_DUPFD_CLOEXEC, 3),
                fcntl.fcntl(2, fcntl.F_DUPFD_CLOEXEC, 3),
            )
        return fds

    def unread(self, paths: tuple[str, str]) -> bool:
        """May the FIFOs ``paths`` hold bytes not yet read? (An attempt's writes are all
        in them once it ended; the worker reads them as they come, so mostly not.)"""
        fds = self.fifos.get(paths)
        if fds is None:
            return True
        try:
            return any(_pending(fd) for fd in fds)
        except OSError:
            return True

    def log_handler(self) -> logging.Handler:
        if self.handler is None:
            self.handler = logging.StreamHandler(_StderrNow())
            self.handler.setFormatter(logging.Formatter(LOG_FORMAT))
        return self.handler


class _StderrNow:
    """Whatever ``sys.stderr`` is when a record is written."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


_redirection = _Redirection()


@contextlib.contextmanager
def redirected(paths: tuple[str, str] | None) -> Iterator[None]:
    """For one attempt: file descriptors 1 and 2 go to the FIFOs ``paths`` (stdout,
    stderr), ``sys.stdout`` is line-buffered (so each line shows as it is printed),
    and the root logger, if nothing set it up, writes INFO and above to stderr.

    Everything is put back afterwards, even if the task replaced ``sys.stdout`` or
    changed the root logger's level. A FIFO that cannot be opened leaves the output
    where it was (the attempt runs all the same).
    """
    sys.stdout.flush()
    sys.stderr.flush()
    if paths is None:
        yield
        return
    try:
        targets = _redirection.targets(paths)
    except OSError as exc:
        print(f"dagq: the task's output is not captured: {exc}", file=sys.stderr)
        yield
        return
    streams = (sys.stdout, sys.stderr)
    buffering = [getattr(stream, "line_buffering", False) for stream in streams]
    os.dup2(targets[0], 1)
    os.dup2(targets[1], 2)
    for stream, was in zip(streams, buffering, strict=True):
        if not was:  # (a pool process's own are line-buffered from the start)
            with contextlib.suppress(AttributeError, ValueError):
                stream.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    root = logging.getLogger()
    level, handler = root.level, None
    if not root.handlers:
        handler = _redirection.log_handler()
        root.addHandler(handler)
        if root.level > logging.INFO or root.level == logging.NOTSET:
            root.setLevel(logging.INFO)
    try:
        yield
    finally:
        if handler is not None:
            root.removeHandler(handler)
            root.setLevel(level)
        sys.stdout, sys.stderr = streams
        for stream, was in zip(streams, buffering, strict=True):
            with contextlib.suppress(Exception):
                stream.flush()
            if getattr(stream, "line_buffering", was) != was:
                with contextlib.suppress(AttributeError, ValueError):
                    stream.reconfigure(line_buffering=was)  # type: ignore[union-attr]
        assert _redirection.originals is not None
        os.dup2(_redirection.originals[0], 1)
        os.dup2(_redirection.originals[1], 2)


def _pending(fd: int) -> int:
    """How many bytes wait in the pipe or FIFO ``fd`` (either end)."""
    (count,) = _COUNT.unpack(fcntl.ioctl(fd, termios.FIONREAD, _COUNT_BUFFER))
    return int(count)


_COUNT = struct.Struct("i")
_COUNT_BUFFER = bytes(_COUNT.size)


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


class _Frames:
    """The frames coming on a pipe, read in as few system calls as they came in (a
    small request: one read, not one for its header and one for the rest)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._buffer = bytearray()

    def next(self) -> bytes | None:
        """The next frame (None at the end of the pipe)."""
        if not self._fill(HEADER.size):
            return None
        (size,) = HEADER.unpack_from(self._buffer)
        if not self._fill(HEADER.size + size):
            return None
        frame = bytes(self._buffer[HEADER.size : HEADER.size + size])
        del self._buffer[: HEADER.size + size]
        return frame

    def _fill(self, n: int) -> bool:
        while len(self._buffer) < n:
            chunk = os.read(self._fd, max(n - len(self._buffer), _READ_BYTES))
            if not chunk:
                return False
            self._buffer += chunk
        return True


#: How much is read from a pipe at once.
_READ_BYTES = 64 * 1024


def _write(fd: int, data: bytes) -> None:
    view = memoryview(HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


def boot(argv: list[str]) -> None:
    """The entry point of a new interpreter: ``zygote ...``, or a pool process."""
    try:
        if argv and argv[0] == "zygote":
            zygote(argv[1:])
        else:
            main(argv)
    except (BrokenPipeError, ConnectionError):
        pass  # the worker is gone: so are we, quietly
