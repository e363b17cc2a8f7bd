"""Semantic checks of a definition: names, dependencies, cycles, policies, expressions.

Structural checks (types, unknown fields) happen when the data is converted into the
typed structs; this module checks what types cannot express. Messages name the task
and field at fault.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import msgspec

from dagq import expression
from dagq.definition import TaskDef, WorkflowDef, rule_set
from dagq.errors import PayloadTooLarge, ValidationError
from dagq.expression.values import kind_of
from dagq.keys import WORKFLOW_ID_PATTERN, check_workflow_id
from dagq.params import param_specs
from dagq.payloads import MAX_PARAMS_BYTES, check_depth, echo, encode_json

#: Workflow ids are checked where storage keys are made (dagq.keys), still taken from here.
__all__ = ["WORKFLOW_ID_PATTERN", "check_workflow_id"]

#: A task name: as free as ai4s-jobq's (spaces, '/', punctuation, any letters), but
#: starting with a letter, digit or '_', not ending in a space, and without '#', '[' or
#: ']' (keys.attempt_name marks instances and undos with them) or control characters.
NAME_PATTERN = re.compile(r"^\w[^#\[\]\x00-\x1f\x7f-\x9f\u00a0\u2028\u2029\ufeff]*(?<!\s)\Z")
#: The kwargs a shell task (one whose kwargs have 'cmd') uses, as ai4s-jobq's shell
#: worker does; other keys are ignored, with a warning.
SHELL_KWARGS = ("cmd", "env", "cwd", "bg_dirsync_to")
QUEUE_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}\Z")
PARAM_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,99}\Z")
MAX_TASKS = 1_000_000
#: A task's own spec travels in every task message; it must leave room under the
#: queue message limit for inputs and framing.
MAX_TASK_SPEC_BYTES = 16 * 1024

_CONDITION_ROOTS = frozenset({"inputs", "params"})
#: A loop's ``until`` also sees the latest ``output`` and the ``iteration`` number.
LOOP_ROOTS = frozenset({"inputs", "params", "output", "iteration"})
_PARAM_ROOTS = frozenset({"params"})


def validate(definition: WorkflowDef) -> None:
    """Raise :class:`ValidationError` for the first problem found in ``definition``."""
    if not definition.tasks:
        raise ValidationError("'tasks' is empty: a workflow needs at least one task")
    if len(definition.tasks) > MAX_TASKS:
        raise ValidationError(f"{len(definition.tasks)} tasks is over the limit of {MAX_TASKS}")
    for name in definition.params:
        if not PARAM_PATTERN.match(name):
            raise ValidationError(
                f"params: '{echo(name)}' is not a valid param name "
                "(letters, digits and '_', not starting with a digit)"
            )
    param_specs(definition.params)
    _check_queue("default_queue", definition.default_queue)
    if definition.defaults and definition.defaults.queue:
        _check_queue("defaults.queue", definition.defaults.queue)
    names = _check_names(definition)
    check_values(definition)
    verbatim = rule_set(definition).jobq
    for task in definition.tasks:
        _check_task(task, names, definition.params, verbatim=verbatim)
    _check_acyclic(definition)


def warnings(definition: WorkflowDef) -> list[str]:
    """What a valid definition says that has no effect, one line each, naming the task
    and field: a parent listed twice (it counts once), kwargs a shell task ignores, a
    null environment value (passed as the text 'None', as ai4s-jobq does)."""
    found: list[str] = []
    for task in definition.tasks:
        where = f"task '{echo(task.name)}'"
        seen: set[str] = set()
        for dep in task.depends_on:
            if dep in seen:
                found.append(f"{where}: depends_on: '{echo(dep)}' is listed twice; it counts once")
            seen.add(dep)
        kwargs = task.kwargs
        if not kwargs or "cmd" not in kwargs:
            continue
        ignored = [key for key in kwargs if key not in SHELL_KWARGS]
        if ignored:
            shown = ", ".join(f"kwargs.{echo(k)}" for k in ignored[:10])
            verb = "is" if len(ignored) == 1 else "are"
            found.append(
                f"{where}: {shown} {verb} ignored: a shell task uses only cmd, env, cwd and "
                "bg_dirsync_to (a task whose kwargs have no 'cmd' runs on a processor)"
            )
        env = kwargs.get("env")
        if isinstance(env, Mapping):
            for key, value in env.items():
                if value is None:
                    found.append(
                        f"{where}: kwargs.env.{echo(str(key))} is null: it is set to the "
                        "text 'None', as ai4s-jobq does"
                    )
    return found


def check_values(definition: WorkflowDef) -> None:
    """Refuse free-form values (param defaults, args) over their bounds
    (:mod:`dagq.payloads`): nested deeper than MAX_DEPTH (they travel in messages and
    must never exhaust a parser's stack), or param defaults over MAX_PARAMS_BYTES."""
    total = 0
    for name, value in definition.params.items():
        total += len(encode_json(value, f"params.{echo(name)}"))
    if total > MAX_PARAMS_BYTES:
        raise PayloadTooLarge(
            f"params: the defaults total {total} bytes as JSON, over the limit of "
            f"{MAX_PARAMS_BYTES} bytes; pass large data in a file instead"
        )
    for task in definition.tasks:
        where = f"task '{echo(task.name)}'"
        check_depth(task.args, f"{where}: args")
        check_depth(task.kwargs, f"{where}: kwargs")
        if task.compensate is not None:
            check_depth(task.compensate.args, f"{where}: compensate.args")


def check_queue_name(queue: str, where: str = "queue") -> str:
    """Refuse queue names no backend can hold."""
    _check_queue(where, queue)
    return queue


def _check_queue(where: str, queue: str) -> None:
    if not QUEUE_PATTERN.match(queue):
        raise ValidationError(
            f"{where}: '{echo(queue)}' is not a valid queue name "
            "(1-63 letters, digits, '-', '_' or '.', starting with a letter or digit)"
        )


def _check_names(definition: WorkflowDef) -> dict[str, TaskDef]:
    names: dict[str, TaskDef] = {}
    for i, task in enumerate(definition.tasks):
        if not NAME_PATTERN.match(task.name) or not task.name.isprintable():
            raise ValidationError(
                f"tasks[{i}]: '{echo(task.name)}' is not a valid task name (start with a "
                "letter, digit or '_', do not end with a space, and use no '#', '[', ']' "
                "or control characters)"
            )
        if task.name in names:
            raise ValidationError(f"tasks[{i}]: duplicate task name '{echo(task.name)}'")
        names[task.name] = task
    return names


def _check_task(
    task: TaskDef, names: Mapping[str, TaskDef], params: Mapping[str, Any], *, verbatim: bool
) -> None:
    """``verbatim``: kwargs are passed as written (ai4s-jobq semantics), not templates."""
    where = f"task '{echo(task.name)}'"
    _check_dependencies(task, names, where)
    _check_kind(task, where)
    if task.queue is not None:
        _check_queue(f"{where}: queue", task.queue)
    parents = frozenset(task.depends_on)
    if task.condition is not None:
        expr = expression.parse(task.condition, where=f"{where}: condition", names=_CONDITION_ROOTS)
        _check_refs(expr, parents, params, f"{where}: condition")
    if task.compensate is not None:
        _check_compensation(task, params, where)
    if task.foreach is not None:
        expr = expression.parse(task.foreach, where=f"{where}: foreach", names=_CONDITION_ROOTS)
        _check_refs(expr, parents, params, f"{where}: foreach")
    if isinstance(task.sleep_s, str):
        expr = expression.parse(task.sleep_s, where=f"{where}: sleep_s", names=_CONDITION_ROOTS)
        _check_refs(expr, parents, params, f"{where}: sleep_s")
    if task.loop is not None:
        expr = expression.parse(task.loop.until, where=f"{where}: loop.until", names=LOOP_ROOTS)
        _check_refs(expr, parents, params, f"{where}: loop.until")
    _check_templates(task.cmd, frozenset(), params, f"{where}: cmd", _PARAM_ROOTS)
    if task.kwargs is not None and "cmd" in task.kwargs and not verbatim:
        for field in ("cmd", "env"):
            _check_templates(
                task.kwargs.get(field),
                frozenset(),
                params,
                f"{where}: kwargs.{field}",
                _PARAM_ROOTS,
            )
    _check_templates(task.args, parents, params, f"{where}: args", _CONDITION_ROOTS)
    size = len(msgspec.json.encode([task.cmd, task.kwargs, task.call, task.args]))
    if size > MAX_TASK_SPEC_BYTES:
        raise ValidationError(
            f"{where}: the task's definition is {size} bytes, over the limit of "
            f"{MAX_TASK_SPEC_BYTES}; pass large data through a file or an upstream output"
        )


def _check_dependencies(task: TaskDef, names: Mapping[str, TaskDef], where: str) -> None:
    for dep in task.depends_on:
        if dep == task.name:
            raise ValidationError(f"{where}: depends_on: a task cannot depend on itself")
        if dep not in names:
            raise ValidationError(f"{where}: depends_on: no task is named '{echo(dep)}'")
    policy = task.dep_policy
    n_parents = len(set(task.depends_on))  # a parent listed twice counts once (a warning)
    if isinstance(policy, int) and policy > n_parents:
        raise ValidationError(
            f"{where}: dep_policy: {policy} parents must complete, but the task has only "
            f"{n_parents} in depends_on"
        )


def _check_kind(task: TaskDef, where: str) -> None:
    """One way to run, at most: none (or kwargs without 'cmd') is a processor task."""
    kinds = [
        k
        for k, v in (
            ("cmd", task.cmd),
            ("kwargs", task.kwargs is not None),
            ("call", task.call),
            ("sleep_s", task.sleep_s is not None),
            ("wait_for", task.wait_for),
        )
        if v
    ]
    if len(kinds) > 1:
        raise ValidationError(f"{where}: give only one of {' / '.join(kinds)}")
    if task.kwargs is not None and "cmd" in task.kwargs:
        _check_shell_kwargs(task.kwargs, where)
    if kinds and kinds[0] in ("sleep_s", "wait_for"):
        _check_engine_task(task, kinds[0], where)
    _check_fan_out(task, where)
    if task.cancel_remaining and task.dep_policy in ("all", "all_settled"):
        raise ValidationError(
            f"{where}: cancel_remaining: a race needs dep_policy 'any' (or a number of "
            f"parents), not '{task.dep_policy}'"
        )
    if task.args is not None and task.call is None:
        raise ValidationError(
            f"{where}: args: only Python tasks ('call') take args; a shell task reads its "
            "upstream outputs from the JSON file named by $DAGQ_INPUTS"
        )
    _check_command(task.cmd, f"{where}: cmd")


def _check_command(command: Any, where: str) -> None:
    if isinstance(command, list) and not command:
        raise ValidationError(f"{where}: an empty argument list runs nothing")
    if isinstance(command, str) and not command.strip():
        raise ValidationError(f"{where}: the command is empty")


def _check_shell_kwargs(kwargs: Mapping[str, Any], where: str) -> None:
    """The kwargs ai4s-jobq's shell worker reads must have the types it needs."""
    command = kwargs["cmd"]
    if not isinstance(command, str) and not (
        isinstance(command, list) and all(isinstance(part, str) for part in command)
    ):
        raise ValidationError(
            f"{where}: kwargs.cmd: expected a command (a string, or a list of strings), "
            f"got {kind_of(command)}"
        )
    _check_command(command, f"{where}: kwargs.cmd")
    env = kwargs.get("env")
    if env is not None:
        if not isinstance(env, Mapping):
            raise ValidationError(
                f"{where}: kwargs.env: expected a mapping of variable names to values, "
                f"got {kind_of(env)}"
            )
        for key in env:
            if not isinstance(key, str) or not key or "=" in key or "\x00" in key:
                raise ValidationError(
                    f"{where}: kwargs.env: '{echo(str(key))}' is not an environment variable name"
                )
    for field in ("cwd", "bg_dirsync_to"):
        value = kwargs.get(field)
        if value is not None and not (isinstance(value, str) and value):
            raise ValidationError(
                f"{where}: kwargs.{field}: expected a path (a non-empty string), "
                f"got {kind_of(value)}"
            )


def _check_engine_task(task: TaskDef, kind: str, where: str) -> None:
    """A timer or a wait runs on no worker and changes nothing outside."""
    if task.compensate is not None:
        raise ValidationError(
            f"{where}: compensate: a {kind} task has no side effects to undo; put "
            "the compensation on the task that changes something"
        )
    if task.foreach is not None:
        raise ValidationError(f"{where}: foreach: only a task that runs something fans out")
    for name, value in (("queue", task.queue), ("loop", task.loop)):
        if value is not None:
            raise ValidationError(
                f"{where}: {name}: a {kind} task runs on no worker, so it takes no {name}"
            )


def _check_fan_out(task: TaskDef, where: str) -> None:
    if task.foreach is None:
        limits: tuple[tuple[str, object], ...] = (
            ("max_parallel", task.max_parallel),
            ("allow_failures", task.allow_failures),
        )
        for name, value in limits:
            if value is not None:
                raise ValidationError(f"{where}: {name} only applies to a foreach task")
        return
    allow = task.allow_failures
    if allow is not None and allow >= 1 and not float(allow).is_integer():
        raise ValidationError(
            f"{where}: allow_failures: {allow:g} is neither a count of items (a whole "
            "number, 1 or more) nor a fraction of them (below 1)"
        )
    others: tuple[tuple[str, object], ...] = (
        ("loop", task.loop),
        ("compensate", task.compensate),
        ("cancel_remaining", task.cancel_remaining or None),
    )
    for name, value in others:
        if value is not None:
            raise ValidationError(f"{where}: {name}: a foreach task cannot also have {name}")


def _check_compensation(task: TaskDef, params: Mapping[str, Any], where: str) -> None:
    undo = task.compensate
    assert undo is not None
    where = f"{where}: compensate"
    kinds = [k for k, v in (("cmd", undo.cmd), ("kwargs", undo.kwargs), ("call", undo.call)) if v]
    if len(kinds) != 1:
        raise ValidationError(
            f"{where}: give exactly one of cmd, kwargs or call (the undo to run), not "
            f"{' / '.join(kinds) or 'none'}"
        )
    if undo.args is not None and undo.call is None:
        raise ValidationError(f"{where}: args: only a Python undo ('call') takes args")
    if undo.queue is not None:
        _check_queue(f"{where}: queue", undo.queue)
    command = undo.cmd if undo.cmd is not None else (undo.kwargs.cmd if undo.kwargs else None)
    _check_templates(command, frozenset(), params, f"{where}: cmd", _PARAM_ROOTS)
    # The undo sees the task's own output (under its name) beside its parents'.
    sees = frozenset([*task.depends_on, task.name])
    _check_templates(undo.args, sees, params, f"{where}: args", _CONDITION_ROOTS)


def _check_refs(
    expr: expression.Expr, parents: frozenset[str], params: Mapping[str, Any], where: str
) -> None:
    refs = expression.references(expr)
    for name in sorted(refs.inputs - parents):
        hint = (
            f"its parents are: {', '.join(sorted(parents))}"
            if parents
            else "the task has no parents (depends_on is empty)"
        )
        raise ValidationError(
            f"{where}: refers to inputs of '{name}', which is not a parent; {hint}"
        )
    if refs.globs and not parents:
        raise ValidationError(f"{where}: a glob over inputs needs parents, and there are none")
    for name in sorted(refs.params - set(params)):
        known = ", ".join(sorted(params)) or "none are declared"
        raise ValidationError(f"{where}: refers to params.{name}, which is not declared ({known})")


def _check_templates(
    value: Any,
    parents: frozenset[str],
    params: Mapping[str, Any],
    where: str,
    roots: frozenset[str],
) -> None:
    for text, expr in expression.template_expressions(value, where=where):
        refs = expression.references(expr)
        if (refs.inputs and "inputs" not in roots) or (refs.globs and "inputs" not in roots):
            raise ValidationError(
                f"{where}: '{{{{ {text} }}}}' pastes an upstream output into a command; "
                "read upstream outputs from the JSON file named by $DAGQ_INPUTS instead"
            )
        _check_refs(expr, parents, params, where)


def _check_acyclic(definition: WorkflowDef) -> None:
    """Kahn's algorithm; on failure, walk the leftovers to name one cycle exactly."""
    parents = {t.name: t.depends_on for t in definition.tasks}
    children: dict[str, list[str]] = {name: [] for name in parents}
    remaining = {name: len(deps) for name, deps in parents.items()}
    for name, deps in parents.items():
        for dep in deps:
            children[dep].append(name)
    ready = [name for name, n in remaining.items() if n == 0]
    while ready:
        name = ready.pop()
        del remaining[name]
        for child in children[name]:
            remaining[child] -= 1
            if remaining[child] == 0:
                ready.append(child)
    if not remaining:
        return
    # Every leftover task has a leftover parent, so following parents must loop.
    start = next(iter(remaining))
    path: list[str] = []
    position: dict[str, int] = {}
    node = start
    while node not in position:
        position[node] = len(path)
        path.append(node)
        node = next(dep for dep in parents[node] if dep in remaining)
    cycle = [*path[position[node] :], node]
    cycle.reverse()
    raise ValidationError(f"dependency cycle: {' -> '.join(cycle)}")
