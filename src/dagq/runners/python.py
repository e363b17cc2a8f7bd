"""Python tasks: ``call: package.module:function``, sync or async.

The function receives its ``args`` (a mapping as keyword arguments, a list as
positional ones), plus ``inputs`` (upstream outputs by parent name) and ``ctx`` (a
:class:`~dagq.runners.TaskContext`) when its signature names them. It returns a
JSON-serialisable output, and may raise :class:`dagq.NonRetryable` or
:class:`dagq.RetryAfter`. A function that cannot be imported fails the task at once.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import sys
import traceback
from collections.abc import Callable, Iterable
from concurrent.futures import Executor
from typing import Any

from dagq.errors import NonRetryable, RetryAfter
from dagq.messages import TaskSpec
from dagq.runners import Outcome, TaskContext, tail


class ImportFailed(Exception):
    """The function named by ``call`` could not be imported."""


#: What the engine passes to a function whose signature names it (never via **kwargs).
PROVIDED = ("inputs", "ctx", "item", "index")


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


def add_import_paths(paths: Iterable[str]) -> None:
    """Let ``call`` find modules under these directories."""
    for path in paths:
        if path not in sys.path:
            sys.path.insert(0, path)
    resolve.cache_clear()


async def run_python(spec: TaskSpec, ctx: TaskContext, args: Any, *, executor: Executor) -> Outcome:
    """Call the task's function and turn its result or exception into an Outcome."""
    try:
        function, is_async, wanted = resolve(spec.call or "")
    except ImportFailed as exc:
        return Outcome(ok=False, error=str(exc), retryable=False)
    positional, keywords = _arguments(args)
    provided = {"inputs": ctx.inputs, "ctx": ctx, "item": ctx.item, "index": ctx.index}
    for name in wanted:
        if name in ("item", "index") and ctx.index < 0:
            continue  # not a foreach instance: the function's own default applies
        keywords[name] = provided[name]
    try:
        if is_async:
            result = await asyncio.wait_for(function(*positional, **keywords), spec.timeout_s)
        else:
            call = functools.partial(function, *positional, **keywords)
            future = asyncio.get_running_loop().run_in_executor(executor, call)
            result = await asyncio.wait_for(future, spec.timeout_s)
    except TimeoutError:
        return Outcome(ok=False, error=f"timed out after {spec.timeout_s:g}s")
    except NonRetryable as exc:
        return Outcome(ok=False, error=_describe(exc), retryable=False)
    except RetryAfter as exc:
        return Outcome(ok=False, error=_describe(exc), retry_after_s=exc.seconds)
    except Exception as exc:  # a task's own failure becomes its error
        return Outcome(
            ok=False, error=_describe(exc, with_trace=True), error_type=type(exc).__name__
        )
    return Outcome(ok=True, output=result)


def _arguments(args: Any) -> tuple[list[Any], dict[str, Any]]:
    if args is None:
        return [], {}
    if isinstance(args, dict):
        return [], dict(args)
    if isinstance(args, list):
        return list(args), {}
    return [args], {}


def _describe(exc: BaseException, *, with_trace: bool = False) -> str:
    text = f"{type(exc).__name__}: {exc}"
    if with_trace:
        frames = traceback.format_exception(exc)
        text += "\n" + tail("".join(frames[1:]), 1500)
    return text
