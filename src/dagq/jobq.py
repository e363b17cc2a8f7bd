"""ai4s-jobq's script helpers, for tasks that dagq runs.

    from dagq.jobq import get_upstream_output, get_upstream_outputs, set_output, is_cancelled

The same names and behaviour as ai4s-jobq's (``ai4s.jobq.workflow``), so a script
written for ai4s-jobq changes one import line at most:

* ``get_upstream_output(name)``: the output of the direct parent ``name`` (None when it
  has none: skipped, unfinished, failed without output); ``KeyError`` when ``name`` is
  not a direct parent;
* ``get_upstream_outputs()``: ``{name: output}`` for the parents that have an output;
* ``set_output(data)``: ``data`` becomes the task's output (the last call wins);
* ``is_cancelled()``: whether the task is being stopped (its workflow was cancelled).

In a shell task they read the environment every shell task gets (ai4s-jobq's
contract): ``JOBQ_WORKFLOW_UPSTREAM_REFS`` (a JSON file mapping each parent to its
output's JSON text, or null), ``JOBQ_OUTPUT_FILE`` and ``DAGQ_CANCEL_FILE``; so they
need no store, and ai4s-jobq's own ``set_output`` works there too. In a Python task
(``call:`` or a processor) they read the running task's context instead: the
parents are the task's ``inputs``, and a value given to ``set_output`` is the output
when the function returns None (a value it returns wins).

A task that has called ``is_cancelled()`` is given ``dagq.worker.CANCEL_NOTICE_S``
seconds to end on its own once its workflow is cancelled, before it is stopped.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

import msgspec

from dagq.runners import TaskContext

__all__ = ["get_upstream_output", "get_upstream_outputs", "is_cancelled", "set_output"]

#: Beside the cancel file: created by :func:`is_cancelled`, so the worker knows the
#: task looks, and gives it time to end on its own.
WATCHED_SUFFIX = ".watched"


class TaskScope(msgspec.Struct, eq=False):
    """The running Python task, as the helpers see it."""

    task: str
    inputs: dict[str, Any]
    cancel_file: str
    output: Any = None
    has_output: bool = False
    #: Decodes the inputs when a helper first asks for them (a pool process leaves
    #: them encoded for a function that names neither ``inputs`` nor ``ctx``).
    load: Callable[[], dict[str, Any]] | None = None

    def upstream(self) -> dict[str, Any]:
        """The task's inputs, decoded at the first call if they were left encoded."""
        if self.load is not None:
            self.inputs, self.load = self.load(), None
        return self.inputs


_current: ContextVar[TaskScope | None] = ContextVar("dagq_jobq_task", default=None)
#: A shell task's refs file, decoded (it does not change while the task runs).
_refs_cache: dict[str, dict[str, Any]] = {}


@contextlib.contextmanager
def task_scope(
    ctx: TaskContext, load: Callable[[], dict[str, Any]] | None = None
) -> Iterator[TaskScope]:
    """Make ``ctx`` the task the helpers serve while a Python task's function runs
    (the runners do this; ``load``: decodes its inputs, left encoded in ``ctx``)."""
    scope = TaskScope(ctx.task, ctx.inputs, ctx.cancel_file, load=load)
    token = _current.set(scope)
    try:
        yield scope
    finally:
        _current.reset(token)


def get_upstream_output(task_name: str) -> Any:
    """The output of the direct parent ``task_name``, or None if it has none."""
    scope = _current.get()
    if scope is not None:
        inputs = scope.upstream()
        if task_name not in inputs:
            raise KeyError(f"'{task_name}' is not a direct upstream of '{scope.task}'")
        return inputs[task_name]
    refs = _refs("get_upstream_output")
    if task_name not in refs:
        task = os.environ.get("JOBQ_WORKFLOW_TASK", "")
        raise KeyError(f"'{task_name}' is not a direct upstream of '{task}'")
    return _value(refs[task_name])


def get_upstream_outputs() -> dict[str, Any]:
    """``{parent: output}`` for every direct parent that has an output."""
    scope = _current.get()
    if scope is not None:
        return {name: value for name, value in scope.upstream().items() if value is not None}
    refs = _refs("get_upstream_outputs")
    return {name: _value(ref) for name, ref in refs.items() if ref is not None}


def set_output(data: Any) -> None:
    """Make ``data`` (JSON-serialisable) the task's output; the last call wins."""
    scope = _current.get()
    if scope is not None:
        scope.output, scope.has_output = data, True
        return
    path = os.environ.get("JOBQ_OUTPUT_FILE") or os.environ.get("DAGQ_OUTPUT")
    if not path:
        raise RuntimeError(
            "set_output: not running inside a dagq task (JOBQ_OUTPUT_FILE is not set)"
        )
    import json  # (here: a pool process, whose tasks never come this way, starts without)

    text = json.dumps(data)  # before opening: a value that is not JSON leaves the file as it was
    with open(path, "w", encoding="utf-8") as file:
        file.write(text)


def is_cancelled() -> bool:
    """Whether the task is being stopped (its workflow was cancelled, or it lost a race)."""
    scope = _current.get()
    if scope is not None:
        path = scope.cancel_file
    else:
        path = os.environ.get("DAGQ_CANCEL_FILE", "")
        if "DAGQ_CANCEL_FILE" not in os.environ:
            raise RuntimeError("is_cancelled: not running inside a dagq task")
    if not path:
        return False  # run outside a worker: nothing can stop it
    with contextlib.suppress(OSError):  # tell the worker this task looks (once is enough)
        if not os.path.exists(path + WATCHED_SUFFIX):
            open(path + WATCHED_SUFFIX, "a").close()
    return os.path.exists(path)


def _refs(helper: str) -> dict[str, Any]:
    path = os.environ.get("JOBQ_WORKFLOW_UPSTREAM_REFS")
    if not path:
        raise ValueError(
            f"{helper}: not running inside a dagq task (JOBQ_WORKFLOW_UPSTREAM_REFS is not set)"
        )
    refs = _refs_cache.get(path)
    if refs is None:
        import json

        with open(path, encoding="utf-8") as file:
            loaded = json.load(file)
        refs = loaded if isinstance(loaded, dict) else {}
        _refs_cache[path] = refs
    return refs


def _value(ref: Any) -> Any:
    """A parent's output from its reference: the output's JSON text, or null."""
    if not isinstance(ref, str) or not ref:
        return None
    import json

    try:
        return json.loads(ref)
    except ValueError:  # not JSON: the text itself, as ai4s-jobq reads it
        return ref
