"""Writing workflows in Python: a builder and decorators that produce the same definition
as a YAML file would.

    wf = Workflow("docs", params={"n": 3})
    extract = wf.shell("extract", "python extract.py {{ params.n }}")

    @wf.task(depends_on=[extract], num_retries=2)
    def classify(inputs):
        return {"kind": "invoice"}

``wf.to_definition()`` gives the validated :class:`~dagq.definition.WorkflowDef`.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from dagq.definition import (
    Defaults,
    Loop,
    RetryPolicy,
    ShellKwargs,
    TaskDef,
    WaitFor,
    WorkflowDef,
)
from dagq.errors import ValidationError
from dagq.loading import load_data
from dagq.pyyaml import yaml

F = TypeVar("F", bound=Callable[..., Any])
Dependency = str | Callable[..., Any]

_TASK_OPTIONS = frozenset(
    {
        "queue",
        "dep_policy",
        "timeout_s",
        "num_retries",
        "condition",
        "retry",
        "loop",
        "cancel_remaining",
        "task_deadline_s",
    }
)


class Workflow:
    """A workflow under construction."""

    def __init__(
        self,
        name: str,
        *,
        params: Mapping[str, Any] | None = None,
        default_queue: str = "default",
        default_task_timeout_s: float | None = None,
        max_parallelism: int | None = None,
        result_policy: str = "all_sinks_succeed",
        deadline_s: float | None = None,
        defaults: Defaults | Mapping[str, Any] | None = None,
        version: str | int | None = None,
    ) -> None:
        self.name = name
        self._settings: dict[str, Any] = {
            "params": dict(params or {}),
            "default_queue": default_queue,
            "default_task_timeout_s": default_task_timeout_s,
            "max_parallelism": max_parallelism,
            "result_policy": result_policy,
            "deadline_s": deadline_s,
            "defaults": _plain(defaults),
            "version": version,
        }
        self._tasks: list[dict[str, Any]] = []
        self._functions: dict[int, str] = {}

    def shell(
        self,
        name: str,
        cmd: str | list[str],
        *,
        depends_on: Iterable[Dependency] = (),
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        **options: Any,
    ) -> str:
        """Add a shell task; returns its name, to use in ``depends_on``."""
        task: dict[str, Any] = {"name": name, "cmd": cmd}
        if env or cwd:
            task = {
                "name": name,
                "kwargs": _plain(ShellKwargs(cmd=cmd, env=dict(env or {}), cwd=cwd)),
            }
        return self._add(task, depends_on, options)

    def call(
        self,
        name: str,
        function: str | Callable[..., Any],
        *,
        args: Any = None,
        depends_on: Iterable[Dependency] = (),
        **options: Any,
    ) -> str:
        """Add a Python task calling ``function`` (or ``'module:function'``)."""
        target = function if isinstance(function, str) else _import_name(function)
        task: dict[str, Any] = {"name": name, "call": target}
        if args is not None:
            task["args"] = args
        return self._add(task, depends_on, options)

    def sleep(
        self,
        name: str,
        seconds: float | str,
        *,
        depends_on: Iterable[Dependency] = (),
        **options: Any,
    ) -> str:
        """Add a durable timer: it completes ``seconds`` later (a number, or an expression
        over inputs and params), holding no worker, whatever restarts happen meanwhile."""
        return self._add({"name": name, "sleep_s": seconds}, depends_on, options)

    def wait_for(
        self,
        name: str,
        signal: str,
        *,
        timeout_s: float | None = None,
        on_timeout: str = "fail",
        depends_on: Iterable[Dependency] = (),
        **options: Any,
    ) -> str:
        """Add a wait for a signal (``dagq signal``): its data becomes the task's output."""
        wait: dict[str, Any] = {"signal": signal, "on_timeout": on_timeout}
        if timeout_s is not None:
            wait["timeout_s"] = timeout_s
        return self._add({"name": name, "wait_for": wait}, depends_on, options)

    def task(
        self,
        name: str | None = None,
        *,
        args: Any = None,
        depends_on: Iterable[Dependency] = (),
        **options: Any,
    ) -> Callable[[F], F]:
        """Decorator: the function becomes a Python task (named after it by default)."""

        def register(function: F) -> F:
            task_name = name or function.__name__
            self.call(task_name, function, args=args, depends_on=depends_on, **options)
            self._functions[id(function)] = task_name
            return function

        return register

    def to_definition(self) -> WorkflowDef:
        """The validated definition (raises ValidationError naming the problem)."""
        return load_data(self.to_dict(), source=f"workflow '{self.name}'")

    def to_dict(self) -> dict[str, Any]:
        """The definition as plain data, as it would be written in YAML."""
        data: dict[str, Any] = {"name": self.name}
        data.update({k: v for k, v in self._settings.items() if v not in (None, {})})
        if data.get("default_queue") == "default":
            del data["default_queue"]
        if data.get("result_policy") == "all_sinks_succeed":
            del data["result_policy"]
        data["tasks"] = [dict(t) for t in self._tasks]
        if data["tasks"] and all("kwargs" in t for t in data["tasks"]):
            # Only shell tasks with env or cwd look like an ai4s-jobq file; a workflow
            # built in Python keeps dagq's rules (docs/architecture.md §5).
            data["semantics"] = "dagq"
        return data

    def to_yaml(self) -> str:
        """The definition as YAML text."""
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def _add(
        self, task: dict[str, Any], depends_on: Iterable[Dependency], options: Mapping[str, Any]
    ) -> str:
        unknown = sorted(set(options) - _TASK_OPTIONS)
        if unknown:
            raise ValidationError(
                f"task '{task['name']}': unknown option(s) {', '.join(unknown)} "
                f"(known: {', '.join(sorted(_TASK_OPTIONS))}, depends_on, args, env, cwd)"
            )
        deps = [self._dependency(d) for d in depends_on]
        if deps:
            task["depends_on"] = deps
        task.update({k: _plain(v) for k, v in options.items() if v is not None})
        self._tasks.append(task)
        return str(task["name"])

    def _dependency(self, dep: Dependency) -> str:
        if isinstance(dep, str):
            return dep
        found = self._functions.get(id(dep))
        if found is None:
            raise ValidationError(f"{dep!r} is not a task of workflow '{self.name}'")
        return found


def _plain(value: Any) -> Any:
    if isinstance(value, RetryPolicy | Defaults | ShellKwargs | TaskDef | Loop | WaitFor):
        return msgspec.to_builtins(value)
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _import_name(function: Callable[..., Any]) -> str:
    module = getattr(function, "__module__", None)
    qualname = getattr(function, "__qualname__", "")
    if not module or module == "__main__" or "<locals>" in qualname:
        raise ValidationError(
            f"{function!r} cannot be imported by a worker: define it at the top level of a "
            "module (not in __main__ or inside a function), or pass 'module:function'"
        )
    return f"{module}:{qualname}"


def load_python_file(path: str | Path) -> WorkflowDef:
    """Import a Python file and return the definition of the Workflow it builds."""
    file = Path(path).resolve()
    if not file.exists():
        raise ValidationError(f"{path}: no such file")
    module_name = file.stem
    if str(file.parent) not in sys.path:
        sys.path.insert(0, str(file.parent))
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise ValidationError(f"{path}: cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise ValidationError(f"{path}: importing it failed: {type(exc).__name__}: {exc}") from exc
    found = [v for v in vars(module).values() if isinstance(v, Workflow)]
    chosen = getattr(module, "workflow", None)
    if not isinstance(chosen, Workflow):
        if len(found) != 1:
            raise ValidationError(
                f"{path}: expected one Workflow object (or one named 'workflow'), "
                f"found {len(found)}"
            )
        chosen = found[0]
    return chosen.to_definition()
