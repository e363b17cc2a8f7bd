"""Task functions used by tests (importable by workers as ``tests.sample_tasks:...``)."""

from __future__ import annotations

import asyncio
from typing import Any

from dagq import NonRetryable, RetryAfter, TaskContext


def echo(**kwargs: Any) -> dict[str, Any]:
    return kwargs


def big(size: int) -> str:
    return "x" * size


def length(inputs: dict[str, Any]) -> int:
    return sum(len(v) for v in inputs.values())


def inputs_of(inputs: dict[str, Any]) -> dict[str, Any]:
    return inputs


def context(ctx: TaskContext) -> dict[str, Any]:
    return {"task": ctx.task, "attempt": ctx.attempt, "key": ctx.idempotency_key}


async def nap(seconds: float) -> str:
    await asyncio.sleep(seconds)
    return "rested"


def refuse() -> None:
    raise NonRetryable("bad input, do not retry")


def busy_once(ctx: TaskContext) -> int:
    if ctx.attempt == 1:
        raise RetryAfter(0.01, "busy")
    return ctx.attempt


def unserialisable() -> object:
    return object()


def chunks(n: int) -> dict[str, Any]:
    return {"chunks": [f"chunk-{k}" for k in range(n)]}


def summarise(item: str, index: int) -> dict[str, Any]:
    return {"item": item, "index": index}


def count_items(inputs: dict[str, Any]) -> int:
    return len(inputs["work"])


def long_error_on(fail: int, index: int) -> int:
    """Fails instance ``fail`` of a foreach with a 60,000-character error."""
    if index == fail:
        raise ValueError(f"item {index}: " + "x" * 60_000)
    return index


def raise_long(size: int) -> None:
    """Fail with an error text of ``size`` characters (as a pandas or subprocess error can)."""
    raise ValueError("x" * size)


def pid(**_: Any) -> int:
    """The process this task runs in."""
    import os

    return os.getpid()


def pid_then_sleep(path: str, seconds: float) -> None:
    """Write this process's pid to ``path``, then sleep."""
    import os
    import time

    with open(path, "w") as f:
        f.write(str(os.getpid()))
    time.sleep(seconds)


async def async_pid(seconds: float = 0.0) -> int:
    import os

    await asyncio.sleep(seconds)
    return os.getpid()


def fork_then_crash(path: str) -> None:
    """Leave a forked child (its pid in ``path``) holding this process's pipes, then die."""
    import os
    import signal
    import time

    child = os.fork()
    if child == 0:
        time.sleep(30)
        os._exit(0)
    with open(path, "w") as f:
        f.write(str(child))
    os.kill(os.getpid(), signal.SIGSEGV)
