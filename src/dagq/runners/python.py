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
from collections.abc import Iterable
from concurrent.futures import Executor
from typing import Any

from dagq.messages import TaskSpec
from dagq.runners import Outcome, StoredInputs, TaskContext
from dagq.runners.child import ImportFailed, Reply, failure, prepare, resolve
from dagq.runners.pool import TaskPool

__all__ = ["ImportFailed", "add_import_paths", "resolve", "run_python"]


def add_import_paths(paths: Iterable[str]) -> None:
    """Let ``call`` find modules under these directories (here and in pool processes)."""
    for path in paths:
        if path not in sys.path:
            sys.path.insert(0, path)
    resolve.cache_clear()


async def run_python(
    spec: TaskSpec,
    ctx: TaskContext,
    args: Any,
    *,
    pool: TaskPool | None = None,
    executor: Executor | None = None,
    inputs: StoredInputs | None = None,
) -> Outcome:
    """Call the task's function — in ``pool``, else on ``executor``'s threads — and
    turn its result or exception into an Outcome. ``inputs`` (with a pool only) are
    decoded in the pool process into ``ctx.inputs``."""
    if pool is not None:
        return await pool.run(spec.call or "", args, ctx, spec.timeout_s, inputs)
    if inputs is not None:
        raise ValueError("stored inputs are decoded by pool processes only")
    return await _run_in_thread(spec, ctx, args, executor)


async def _run_in_thread(
    spec: TaskSpec, ctx: TaskContext, args: Any, executor: Executor | None
) -> Outcome:
    try:
        function, is_async, positional, keywords = prepare(spec.call or "", args, ctx)
    except ImportFailed as exc:
        return Outcome(ok=False, error=str(exc), retryable=False)
    try:
        if is_async:
            result = await asyncio.wait_for(function(*positional, **keywords), spec.timeout_s)
        else:
            call = functools.partial(function, *positional, **keywords)
            future = asyncio.get_running_loop().run_in_executor(executor, call)
            result = await asyncio.wait_for(future, spec.timeout_s)
    except TimeoutError:
        return Outcome(ok=False, error=f"timed out after {spec.timeout_s:g}s")
    except Exception as exc:  # a task's own failure becomes its error
        return _outcome(failure(exc))
    return Outcome(ok=True, output=result)


def _outcome(reply: Reply) -> Outcome:
    return Outcome(
        ok=False,
        error=reply.error,
        retryable=reply.retryable,
        retry_after_s=reply.retry_after_s,
        error_type=reply.error_type,
        log=reply.log.encode("utf-8", "replace"),
    )
