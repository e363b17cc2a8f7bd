"""A definition compiled for running: tasks by index, edges as tuples, settings resolved.

The plan is what the state machine walks. It is derived from the immutable definition
and the submitted params, so it is never stored, only rebuilt (and cached).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import msgspec

from dagq.definition import (
    Compensate,
    Loop,
    RetryPolicy,
    ShellKwargs,
    TaskDef,
    WaitFor,
    WorkflowDef,
    rule_set,
)
from dagq.errors import PayloadTooLarge, ValidationError
from dagq.messages import TaskSpec
from dagq.params import ParamText, param_specs
from dagq.params import check as check_param
from dagq.payloads import MAX_DEPTH, check_depth, echo

if TYPE_CHECKING:
    from dagq import expression

POLICY_ALL = -1
POLICY_ANY = -2
POLICY_ALL_SETTLED = -3
_POLICIES = {"all": POLICY_ALL, "any": POLICY_ANY, "all_settled": POLICY_ALL_SETTLED}
_PARAMS = frozenset({"params"})
_CONDITION_ROOTS = frozenset({"inputs", "params"})
DEFAULT_RETRY = RetryPolicy()
_Edge = tuple[int, ...]


class PlanTask(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One task, ready for the state machine.

    A plan has one per task, 100,000 in a large fan-out, and lives as long as its
    workflow: so neither it nor its spec is tracked by the garbage collector
    (``gc=False``; they never take part in a reference cycle), which then never
    walks them (a full collection over a large plan took 100-260 ms).
    """

    index: int
    name: str
    parents: tuple[int, ...]
    children: tuple[int, ...]
    policy: int
    condition: expression.Expr | None
    queue: str
    timeout_s: float | None
    max_attempts: int
    retry: RetryPolicy
    spec: TaskSpec
    #: "run" (a worker runs it), "sleep" (a durable timer) or "wait" (for a signal).
    kind: str = "run"
    sleep: float | expression.Expr | None = None
    wait: WaitFor | None = None
    loop: Loop | None = None
    until: expression.Expr | None = None
    cancel_remaining: bool = False
    task_deadline_s: float | None = None
    undo: Undo | None = None
    foreach: expression.Expr | None = None
    max_parallel: int | None = None
    allow_failures: float | None = None


class Undo(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A task's compensation, compiled: what to run, where, and how often to try."""

    spec: TaskSpec
    queue: str
    max_attempts: int
    retry: RetryPolicy


class Plan(msgspec.Struct, frozen=True):
    """A compiled workflow."""

    name: str
    tasks: tuple[PlanTask, ...]
    by_name: Mapping[str, int]
    roots: tuple[int, ...]
    is_sink: tuple[bool, ...]
    max_parallelism: int | None
    all_tasks_must_succeed: bool
    deadline_s: float | None
    params: Mapping[str, Any]
    queues: frozenset[str]
    #: The run follows ai4s-jobq's rules (docs/architecture.md §5): a skipped parent
    #: counts as done, a condition that cannot be evaluated is false, conditions and
    #: task inputs see every direct parent (a failed one's output too).
    jobq: bool = False
    #: Why that rule set applies, for ``validate``, ``graph`` and ``explain``.
    semantics: str = ""
    #: The indices of the foreach tasks (a step asks of them often: never scan them all).
    foreach: tuple[int, ...] = ()


def resolve_params(definition: WorkflowDef, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The declared params with their defaults, overridden by ``overrides`` — each
    checked against its declared (or inferred) type, choices and bounds, and coerced
    if it came from the command line (:class:`dagq.params.ParamText`)."""
    specs = param_specs(definition.params)
    unknown = sorted(set(overrides) - set(specs))
    if unknown:
        known = ", ".join(sorted(specs)) or "none are declared"
        raise ValidationError(
            f"unknown param {', '.join(repr(echo(u)) for u in unknown[:10])} for workflow "
            f"'{definition.name}' (known params: {known})"
        )
    resolved: dict[str, Any] = {}
    for name, spec in specs.items():
        if name in overrides:
            resolved[name] = check_param(spec, overrides[name])
        elif spec.required:
            raise ValidationError(
                f"param '{name}' ({spec.describe()}) of workflow '{definition.name}' has no "
                f"default: give it (-p {name}=VALUE)"
            )
        else:
            resolved[name] = spec.default
    return resolved


def runs_python(plan: Plan) -> bool:
    """Whether some task of ``plan`` (or its undo) is not a shell command: Python, or
    kwargs for a processor, which run in a worker's pool processes."""
    return any(
        task.spec.kind != "shell" or (task.undo is not None and task.undo.spec.kind != "shell")
        for task in plan.tasks
    )


def parse_param(text: str) -> tuple[str, ParamText]:
    """Split ``key=value`` from the command line; the value is coerced to the param's
    type when the params are resolved (JSON for list, object and untyped params)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValidationError(f"-p {echo(text)!r}: expected key=value")
    if value[:1] in ("[", "{"):
        try:  # refuse a hostile depth here, before any definition is read
            check_depth(json.loads(value), f"-p {echo(key)}: the value")
        except RecursionError:  # deeper than the parser's stack: far over the bound
            raise PayloadTooLarge(
                f"-p {echo(key)}: the value is nested more than {MAX_DEPTH} levels deep"
            ) from None
        except ValueError:
            pass
    return key, ParamText(value)


def compile_plan(definition: WorkflowDef, params: Mapping[str, Any]) -> Plan:
    """Build the plan of a validated definition for the given (resolved) params."""
    by_name = {task.name: i for i, task in enumerate(definition.tasks)}
    children: list[list[int]] = [[] for _ in definition.tasks]
    for i, task in enumerate(definition.tasks):
        for dep in _parents(task):
            children[by_name[dep]].append(i)
    env = {"params": dict(params)}
    rules = rule_set(definition)
    # Equal edge tuples are shared: in a fan-out 100,000 tasks have the same parents and
    # the same children, and each distinct tuple is an object for the garbage collector
    # to walk once (the first collection after a large plan is built).
    edges: dict[_Edge, _Edge] = {}
    # Equal specs are shared too: a fan-out's 100,000 tasks run the same call with the
    # same args, and a spec (with its dicts) weighs more than the task around it.
    specs: dict[bytes, TaskSpec] = {}
    tasks = tuple(
        _compile_task(
            definition,
            task,
            index=i,
            parents=_shared(edges, tuple(map(by_name.__getitem__, _parents(task)))),
            children=_shared(edges, tuple(children[i])),
            env=env,
            jobq=rules.jobq,
            specs=specs,
        )
        for i, task in enumerate(definition.tasks)
    )
    return Plan(
        name=definition.name,
        tasks=tasks,
        by_name=by_name,
        roots=tuple(t.index for t in tasks if not t.parents),
        is_sink=tuple(not t.children for t in tasks),
        max_parallelism=definition.max_parallelism,
        all_tasks_must_succeed=definition.result_policy == "all_tasks_succeed",
        deadline_s=definition.deadline_s,
        params=env["params"],
        queues=frozenset(t.queue for t in tasks),
        jobq=rules.jobq,
        semantics=rules.describe(),
        foreach=tuple(t.index for t in tasks if t.foreach is not None),
    )


def _parents(task: TaskDef) -> tuple[str, ...]:
    """A task's parents, each once (ai4s-jobq files may list one twice)."""
    deps = tuple(task.depends_on)
    return deps if len(set(deps)) == len(deps) else tuple(dict.fromkeys(deps))


def _shared(
    edges: dict[tuple[int, ...], tuple[int, ...]], edge: tuple[int, ...]
) -> tuple[int, ...]:
    return edges.setdefault(edge, edge)


def _shared_spec(specs: dict[bytes, TaskSpec], spec: TaskSpec) -> TaskSpec:
    """One spec object for every task whose spec is equal to ``spec``: equal as
    encoded (as it travels in a task message), with the types of its values beside
    (so ``1`` and ``1.0``, a list and a tuple, are never taken for each other)."""
    try:
        key = _spec_encoder.encode((spec, _types([spec.args, spec.params, spec.cmd])))
    except (TypeError, ValueError):  # a value msgpack cannot hold: kept apart
        return spec
    return specs.setdefault(key, spec)


def _types(value: Any) -> Any:
    """The types in a value, as far as an encoding would blur them (for a key)."""
    if isinstance(value, bool | int | float | str) or value is None:
        return type(value).__name__
    if isinstance(value, dict):
        return [type(value).__name__, [[_types(k), _types(v)] for k, v in value.items()]]
    if isinstance(value, list | tuple):
        return [type(value).__name__, [_types(v) for v in value]]
    return type(value).__qualname__


_spec_encoder = msgspec.msgpack.Encoder()


def _compile_task(
    definition: WorkflowDef,
    task: TaskDef,
    *,
    index: int,
    parents: tuple[int, ...],
    children: tuple[int, ...],
    env: Mapping[str, Any],
    jobq: bool,
    specs: dict[bytes, TaskSpec] | None = None,
) -> PlanTask:
    defaults = definition.defaults
    queue = task.queue or (defaults.queue if defaults else None) or definition.default_queue
    timeout = _timeout(
        task.timeout_s,
        defaults.timeout_s if defaults else None,
        definition.default_task_timeout_s,
    )
    retries = task.num_retries
    if retries is None:
        retries = (defaults.num_retries if defaults else None) or 0
    retry = task.retry or (defaults.retry if defaults else None) or DEFAULT_RETRY
    condition = None
    if task.condition is not None:
        condition = _parse(
            task.condition, where=f"task '{task.name}': condition", names=_CONDITION_ROOTS
        )
    spec = _spec(task, env, timeout, retry, jobq=jobq)
    if specs is not None:
        spec = _shared_spec(specs, spec)
    sleep: float | expression.Expr | None = None
    if isinstance(task.sleep_s, str):
        sleep = _parse(task.sleep_s, where=f"task '{task.name}': sleep_s", names=_CONDITION_ROOTS)
    elif task.sleep_s is not None:
        sleep = float(task.sleep_s)
    until = None
    if task.loop is not None:
        from dagq.validation import LOOP_ROOTS

        until = _parse(task.loop.until, where=f"task '{task.name}': loop.until", names=LOOP_ROOTS)
    kind = "sleep" if task.sleep_s is not None else "wait" if task.wait_for else "run"
    return PlanTask(
        index=index,
        name=task.name,
        parents=parents,
        children=children,
        policy=task.dep_policy if isinstance(task.dep_policy, int) else _POLICIES[task.dep_policy],
        condition=condition,
        queue=queue,
        timeout_s=timeout,
        max_attempts=retries + 1,
        retry=retry,
        spec=spec,
        kind=kind,
        sleep=sleep,
        wait=task.wait_for,
        loop=task.loop,
        until=until,
        cancel_remaining=task.cancel_remaining,
        task_deadline_s=task.task_deadline_s,
        undo=_undo(task, env, queue),
        foreach=(
            None
            if task.foreach is None
            else _parse(task.foreach, where=f"task '{task.name}': foreach", names=_CONDITION_ROOTS)
        ),
        max_parallel=task.max_parallel,
        allow_failures=task.allow_failures,
    )


def _timeout(*choices: float | None) -> float | None:
    """The first timeout given (task, defaults, workflow default); 0 means none."""
    for choice in choices:
        if choice is not None:
            return choice or None
    return None


def _spec(
    task: TaskDef | Compensate,
    env: Mapping[str, Any],
    timeout: float | None,
    retry: RetryPolicy,
    *,
    jobq: bool = False,
) -> TaskSpec:
    codes = tuple(retry.non_retryable_exit_codes)
    if task.call is not None:
        spec = _python_spec(task, env, timeout, codes)
        return msgspec.structs.replace(spec, jobq=True) if jobq else spec
    if isinstance(task, TaskDef) and task.cmd is None:
        if task.kwargs is None or "cmd" not in task.kwargs:
            # ai4s-jobq's form of a custom task: the worker's processor runs its kwargs
            return TaskSpec(kind="processor", args=task.kwargs or {}, timeout_s=timeout, jobq=jobq)
        return _jobq_shell_spec(task.kwargs, env, timeout, codes, jobq=jobq)
    kwargs = task.kwargs
    command: Any
    if isinstance(kwargs, ShellKwargs):
        command, variables, cwd = kwargs.cmd, dict(kwargs.env), kwargs.cwd
    else:
        command, variables, cwd = task.cmd, {}, None
    return TaskSpec(
        kind="shell",
        cmd=_command(command, env),
        env={key: _text(_render(v, env)) for key, v in variables.items()},
        cwd=cwd,
        timeout_s=timeout,
        non_retryable_exit_codes=codes,
        jobq=jobq,
    )


def _jobq_shell_spec(
    kwargs: Mapping[str, Any],
    env: Mapping[str, Any],
    timeout: float | None,
    codes: tuple[int, ...],
    *,
    jobq: bool,
) -> TaskSpec:
    """A shell task in ai4s-jobq's form: ``kwargs`` with cmd, env, cwd, bg_dirsync_to.

    Environment values become text as ai4s-jobq makes them (``str(v)``: 5 is "5", true
    is "True", null is "None"); lists and mappings become JSON. Under ai4s-jobq
    semantics the command and values are used as written; under dagq's they are
    templates, like every command.
    """
    variables = {key: _env_text(value) for key, value in (kwargs.get("env") or {}).items()}
    command = kwargs["cmd"]
    if not jobq:
        command = _command(command, env)
        variables = {key: _text(_render(value, env)) for key, value in variables.items()}
    return TaskSpec(
        kind="shell",
        cmd=command,
        env=variables,
        cwd=kwargs.get("cwd"),
        timeout_s=timeout,
        non_retryable_exit_codes=codes,
        jobq=jobq,
        dirsync_to=kwargs.get("bg_dirsync_to"),
    )


def _command(command: Any, env: Mapping[str, Any]) -> str | list[str]:
    """A command with its params rendered in (quoted, in shell text)."""
    if isinstance(command, str):
        return _text(_render(command, env, quote=_shell_quote))
    return [_text(_render(part, env)) for part in command]


def _parse(text: str, *, where: str, names: frozenset[str]) -> expression.Expr:
    from dagq import expression

    return expression.parse(text, where=where, names=names)


def _render(value: Any, env: Mapping[str, Any], quote: Callable[[Any], str] | None = None) -> Any:
    """``value`` with the params rendered into its ``{{ }}`` templates: text without
    one is itself, and needs no expression language (a plain command, a status read)."""
    if isinstance(value, str) and "{{" not in value:
        return value
    from dagq import expression

    return expression.render(value, env, roots=_PARAMS, quote=quote)


def _env_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list | dict):
        return json.dumps(value, separators=(",", ":"))
    return str(value)  # ai4s-jobq's coercion: True, 5, 0.5, None


def _undo(task: TaskDef, env: Mapping[str, Any], queue: str) -> Undo | None:
    undo = task.compensate
    if undo is None:
        return None
    retry = undo.retry or DEFAULT_RETRY
    return Undo(
        spec=_spec(undo, env, undo.timeout_s, retry),
        queue=undo.queue or queue,
        max_attempts=undo.num_retries + 1,
        retry=retry,
    )


def _python_spec(
    task: TaskDef | Compensate,
    env: Mapping[str, Any],
    timeout: float | None,
    codes: tuple[int, ...],
) -> TaskSpec:
    """Args that read upstream outputs are rendered by the worker, all at once."""
    from dagq import expression

    refs = [expr.refs for _, expr in expression.template_expressions(task.args)]
    if any(r.inputs or r.globs or "inputs" in r.roots for r in refs):
        names = {name for r in refs for name in r.params}
        if any("params" in r.dynamic for r in refs):
            names = set(env["params"])
        return TaskSpec(
            kind="python",
            call=task.call,
            args=task.args,
            render_args=True,
            params={name: env["params"][name] for name in names if name in env["params"]},
            timeout_s=timeout,
            non_retryable_exit_codes=codes,
        )
    args = expression.render(task.args, env, roots=_PARAMS)
    return TaskSpec(
        kind="python", call=task.call, args=args, timeout_s=timeout, non_retryable_exit_codes=codes
    )


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _shell_quote(value: Any) -> str:
    """Params pasted into shell text are quoted, so a value can never inject a command."""
    return shlex.quote(_text(value))
