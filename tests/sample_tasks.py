"""Task functions used by tests (importable by workers as ``tests.sample_tasks:...``)."""

from __future__ import annotations

import asyncio
from typing import Any

from dagq import NonRetryable, RetryAfter, TaskContext


def echo(**kwargs: Any) -> dict[str, Any]:
    return kwargs


def big(size: int) -> str:
    return "x" * size


def padded(word: str, size: int) -> dict[str, Any]:
    """``word`` in an output of over ``size`` bytes (stored by reference when large)."""
    return {"word": word, "pad": "x" * size}


def length(inputs: dict[str, Any]) -> int:
    return sum(len(v) for v in inputs.values())


def inputs_of(inputs: dict[str, Any]) -> dict[str, Any]:
    return inputs


def context(ctx: TaskContext) -> dict[str, Any]:
    return {"task": ctx.task, "attempt": ctx.attempt, "key": ctx.idempotency_key}


async def nap(seconds: float) -> str:
    await asyncio.sleep(seconds)
    return "rested"


#: What ``tick`` was called with, in this process (a worker with isolation "thread").
TICKS: list[int] = []


def tick(i: int) -> int:
    TICKS.append(i)
    return i


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


def parent_pid(**_: Any) -> int:
    """The process that started the one this task runs in (a pool's zygote)."""
    import os

    return os.getppid()


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


class Unprintable(Exception):
    """An exception whose text cannot be made: its ``__str__`` raises."""

    def __str__(self) -> str:
        raise RuntimeError("str fails")


def unprintable() -> None:
    raise Unprintable()


# --- ai4s-jobq's helpers and custom processors ------------------------------------------


def jobq_helpers(ctx: TaskContext) -> None:
    """Reads its parents with dagq.jobq's helpers and sets its output (returns None)."""
    from dagq.jobq import get_upstream_output, get_upstream_outputs, is_cancelled, set_output

    try:
        get_upstream_output("not-a-parent")
        missing = ""
    except KeyError as exc:
        missing = str(exc)
    set_output("overwritten")
    set_output(
        {
            "a": get_upstream_output("a"),
            "all": get_upstream_outputs(),
            "missing": missing,
            "cancelled": is_cancelled(),
            "task": ctx.task,
        }
    )


def upstream_by_helper() -> Any:
    """Names neither inputs nor ctx: reads its parents through a dagq.jobq helper."""
    from dagq.jobq import get_upstream_outputs

    return get_upstream_outputs()


def returns_despite_set_output() -> str:
    from dagq.jobq import set_output

    set_output("ignored")
    return "returned"


def processor(ctx: TaskContext, **kwargs: Any) -> dict[str, Any]:
    """A custom processor: its kwargs, and which task it ran."""
    return {"kwargs": kwargs, "task": ctx.task, "task_id": ctx.task_id}


async def async_processor(**kwargs: Any) -> dict[str, Any]:
    await asyncio.sleep(0)
    return {"async": True, **kwargs}


def failing_processor(fail: str = "", **_: Any) -> str:
    if fail == "never":
        raise NonRetryable("refused for good")
    if fail:
        raise ValueError(fail)
    return "ok"


def watch_cancel(seconds: float = 20.0, ready: str = "") -> str:
    """Poll is_cancelled() until it is true; say so (or give up after ``seconds``).
    Touches the file ``ready`` (if named) once it watches: after its first is_cancelled(),
    which tells the worker so (a stop before that ends the task at once, unwarned)."""
    import pathlib
    import time

    from dagq.jobq import is_cancelled

    if is_cancelled():
        return "noticed"
    if ready:
        pathlib.Path(ready).touch()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if is_cancelled():
            return "noticed"
        time.sleep(0.02)
    return "never noticed"


def looks_cancelled() -> bool:
    """Whether the task must stop, asked once (which leaves a marker for the worker)."""
    from dagq.jobq import is_cancelled

    return is_cancelled()


def say(text: str, stderr: str = "", seconds: float = 0.0) -> str:
    """Print ``text`` (and ``stderr`` there), then sleep: for tests of captured output."""
    import sys
    import time

    print(text)
    if stderr:
        print(stderr, file=sys.stderr)
    time.sleep(seconds)
    return text


def hijack_stdout(text: str) -> None:
    """Replace sys.stdout (and leave it so): the next attempt must not suffer."""
    import io
    import sys

    print(text)
    sys.stdout = io.StringIO()


def log_at(level: str, text: str) -> dict[str, Any]:
    """Log ``text`` at ``level`` through the root logger; what the logger looked like."""
    import logging

    root = logging.getLogger()
    getattr(logging, level)(text)
    return {"level": root.level, "handlers": len(root.handlers)}
