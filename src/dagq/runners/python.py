"""Python tasks: ``call: package.module:function``, sync or async.

The function receives its ``args`` (a mapping as keyword arguments, a list as
positional ones), plus ``inputs`` (upstream outputs by parent name) and ``ctx`` (a
:class:`~dagq.runners.TaskContext`) when its signature names them. It returns a
JSON-serialisable output, and may raise :class:`dagq.NonRetryable` or
:class:`dagq.RetryAfter`. A function that cannot be imported fails the task at once.
A failed attempt's error is ``ExceptionType: message``; the traceback goes to the
attempt's log (``dagq logs``).

By default a task runs in one of the worker's pool processes
(:mod:`dagq.runners.pool`), where it can crash, hang or be killed alone. A worker may
opt in to running trusted tasks on its own threads instead (``isolation="thread"``):
a little faster, but a task that crashes takes the worker with it, and a sync task
past its timeout cannot be stopped (its thread runs on, holding nothing).
"""

from __future__ import annotations

import asyncio
import functools
import sys
from collections.abc import Callable, Iterable
from concurrent.futures import Executor
from typing import Any

from dagq.errors import DagqError
from dagq.jobq import task_scope
from dagq.messages import TaskSpec
from dagq.runners import Outcome, StoredInputs, TaskContext
from dagq.runners.capture import Sink
from dagq.runners.child import ImportFailed, Reply, encode_output, failure, prepare, resolve
from dagq.runners.pool import TaskPool, output_value

__all__ = ["ImportFailed", "add_import_paths", "check_processor", "resolve", "run_python"]


def add_import_paths(paths: Iterable[str]) -> None:
    """Let ``call`` find modules under these directories (here and in pool processes)."""
    for path in paths:
        if path not in sys.path:
            sys.path.insert(0, path)
    resolve.cache_clear()


def check_processor(processor: str) -> None:
    """Refuse (one line) a processor that is not ``module:function``, cannot be
    imported with the current import path, or is not callable."""
    module, colon, function = processor.partition(":")
    if not (module and colon and function):
        raise DagqError(
            f"--processor '{processor}': expected MODULE:FUNCTION (e.g. mypkg.tasks:process)"
        )
    try:
        resolve(processor)
    except ImportFailed as exc:
        lines = str(exc).strip().splitlines() or [""]
        raise DagqError(f"--processor: {lines[0][:300]}") from None


async def run_python(
    spec: TaskSpec,
    ctx: TaskContext,
    args: Any,
    *,
    pool: TaskPool | None = None,
    executor: Executor | None = None,
    processor: bool = False,
    inputs: StoredInputs | None = None,
    live: Sink | None = None,
) -> Outcome:
    """Call the task's function — in ``pool``, else on ``executor``'s threads — and
    turn its result or exception into an Outcome.

    ``processor``: ``spec.call`` is the worker's processor, and ``args`` the task's
    kwargs, given as keyword arguments (with ``ctx`` if it names it). ``inputs`` (with a
    pool only) are decoded in the pool process into ``ctx.inputs``. In a pool, what the
    task writes is captured for its log, and handed to ``live`` as it comes (on threads
    it is not: they share the worker's stdout).
    """
    if pool is not None:
        return await pool.run(
            spec.call or "",
            args,
            ctx,
            spec.timeout_s,
            processor=processor,
            inputs=inputs,
            live=live,
        )
    if inputs is not None:
        raise ValueError("stored inputs are decoded by pool processes only")
    return await _run_in_thread(spec, ctx, args, executor, processor)


async def _run_in_thread(
    spec: TaskSpec, ctx: TaskContext, args: Any, executor: Executor | None, processor: bool
) -> Outcome:
    try:
        function, is_async, positional, keywords = prepare(
            spec.call or "", args, ctx, processor=processor
        )
    except ImportFailed as exc:
        return Outcome(ok=False, error=str(exc), retryable=False)
    try:
        if is_async:
            with task_scope(ctx) as scope:
                coroutine = function(*positional, **keywords)
                result = await asyncio.wait_for(coroutine, spec.timeout_s)
            if result is None and scope.has_output:
                result = scope.output
            # Encoding a large output takes time: not on the event loop.
            reply = await asyncio.to_thread(encode_output, result)
        else:
            # The output is encoded (and checked) in the task's own thread.
            call = functools.partial(_call_and_encode, function, positional, keywords, ctx)
            future = asyncio.get_running_loop().run_in_executor(executor, call)
            reply = await asyncio.wait_for(future, spec.timeout_s)
    except TimeoutError:
        return Outcome(ok=False, error=f"timed out after {spec.timeout_s:g}s")
    except Exception as exc:  # a task's own failure becomes its error
        reply = failure(exc)
    return _outcome(reply)


def _call_and_encode(
    function: Callable[..., Any], positional: list[Any], keywords: dict[str, Any], ctx: TaskContext
) -> Reply:
    with task_scope(ctx) as scope:
        result = function(*positional, **keywords)
    if result is None and scope.has_output:
        result = scope.output
    return encode_output(result)


def _outcome(reply: Reply) -> Outcome:
    if reply.ok:
        return Outcome(ok=True, output=output_value(reply.output), output_json=reply.output)
    return Outcome(
        ok=False,
        error=reply.error,
        retryable=reply.retryable,
        retry_after_s=reply.retry_after_s,
        error_type=reply.error_type,
        log=reply.log.encode("utf-8", "replace"),
    )
