"""Read a workflow definition from YAML/JSON text or a file, with errors a person can act on.

Every error names the file, the line where it can be found, the task and the field,
and what would be accepted instead.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from dagq.definition import (
    RESERVED_TASK_FIELDS,
    Compensate,
    Defaults,
    Loop,
    RetryPolicy,
    TaskDef,
    WaitFor,
    WorkflowDef,
)
from dagq.errors import ValidationError
from dagq.payloads import MAX_DEFINITION_BYTES, MAX_DEPTH, echo
from dagq.pyyaml import yaml
from dagq.validation import validate

PathPart = str | int
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when available: ~10x faster

_FIELDS: dict[str, tuple[str, ...]] = {
    "workflow": WorkflowDef.__struct_encode_fields__,
    "task": TaskDef.__struct_fields__,
    "retry": RetryPolicy.__struct_fields__,
    "defaults": Defaults.__struct_fields__,
    "wait_for": WaitFor.__struct_fields__,
    "loop": Loop.__struct_fields__,
    "compensate": Compensate.__struct_fields__,
}


def load_file(path: str | Path) -> WorkflowDef:
    """Load and validate a workflow definition file (``.yaml``, ``.yml`` or ``.json``)."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValidationError(f"{file}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ValidationError(f"{file}: cannot be read: {exc}") from exc
    return load_text(text, source=str(file))


def load_text(text: str, *, source: str = "<definition>") -> WorkflowDef:
    """Parse and validate a definition given as YAML or JSON text."""
    raw = _parse(text, source)
    return load_data(raw, source=source, text=text)


def load_data(raw: Any, *, source: str = "<definition>", text: str | None = None) -> WorkflowDef:
    """Validate already-parsed data (a mapping) into a :class:`WorkflowDef`."""
    if not isinstance(raw, Mapping):
        raise ValidationError(
            f"{source}: a workflow definition must be a mapping with 'name' and 'tasks', "
            f"got {_kind(raw)}"
        )
    report = _Reporter(source, raw, _Locator(text))
    _check_fields(report)
    try:
        definition = msgspec.convert(raw, WorkflowDef, str_keys=True)
    except msgspec.ValidationError as exc:
        raise _convert_error(exc, report) from None
    except RecursionError:  # a value built in Python may even contain itself
        raise ValidationError(f"{source}: {_TOO_DEEP}") from None
    try:
        validate(definition)
    except ValidationError as exc:
        raise ValidationError(f"{source}: {exc}") from None
    return definition


# --- parsing ----------------------------------------------------------------


#: What a definition nested too deep to parse is told.
_TOO_DEEP = f"nested more than {MAX_DEPTH} levels deep"
#: The deepest a whole definition may nest: its own levels (tasks, a task, its
#: compensate block...) above the values inside it.
MAX_DEFINITION_DEPTH = MAX_DEPTH + 8


def _parse(text: str, source: str) -> Any:
    if len(text) > MAX_DEFINITION_BYTES:
        raise ValidationError(
            f"{source}: {len(text)} characters, over the limit of {MAX_DEFINITION_BYTES} bytes"
        )
    try:
        return _parse_text(text, source)
    except RecursionError:  # deeper than the parser's stack: far over the bound
        raise ValidationError(f"{source}: {_TOO_DEEP}") from None


def _parse_text(text: str, source: str) -> Any:
    if source.endswith(".json"):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValidationError(
                f"{source}: line {exc.lineno}, column {exc.colno}: invalid JSON: {exc.msg}"
            ) from None
    try:
        return _load_yaml(text, source)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = exc.problem or exc.context or "malformed YAML"
        raise ValidationError(f"{source}: {where}invalid YAML: {problem}") from None
    except yaml.YAMLError as exc:
        raise ValidationError(f"{source}: invalid YAML: {exc}") from None


def _load_yaml(text: str, source: str) -> Any:
    """YAML to data, refusing a document whose aliases would expand it beyond the
    bounds (a "billion laughs"): the node graph is measured before it is built."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if "&" in text:  # no anchor, no alias: nothing can expand
            _check_expansion(node, source)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _check_expansion(root: yaml.Node, source: str) -> None:
    """Refuse a document that, its aliases expanded, would weigh more than
    MAX_DEFINITION_BYTES, nest deeper than MAX_DEFINITION_DEPTH, or contain itself.

    Each collection is measured once (a shared one is looked up), without recursion,
    so the measure costs as little as the text is long, however much it expands to.
    """
    measured: dict[int, tuple[int, int]] = {}  # id -> (bytes, depth), aliases expanded
    path: set[int] = set()  # collections whose children are being measured
    stack = [root]
    while stack:
        node = stack[-1]
        key = id(node)
        if key in measured:
            stack.pop()
        elif key in path:  # every child is measured now
            stack.pop()
            path.discard(key)
            measured[key] = _measure(node, measured, source)
        else:
            path.add(key)
            for child in _children(node):
                if child.__class__ is yaml.ScalarNode or id(child) in measured:
                    continue
                if id(child) in path:
                    raise ValidationError(
                        f"{source}: a YAML alias refers to a node that contains it"
                    )
                stack.append(child)


def _measure(node: yaml.Node, measured: dict[int, tuple[int, int]], source: str) -> tuple[int, int]:
    size, depth = 2, 0
    for child in _children(node):
        if child.__class__ is yaml.ScalarNode:
            size += len(child.value) + 3
        else:
            child_size, child_depth = measured[id(child)]
            size += child_size + 1
            depth = max(depth, child_depth)
    if size > MAX_DEFINITION_BYTES:
        raise ValidationError(
            f"{source}: its YAML aliases expand it beyond the limit of {MAX_DEFINITION_BYTES} bytes"
        )
    if depth + 1 > MAX_DEFINITION_DEPTH:
        raise ValidationError(f"{source}: {_TOO_DEEP} once its YAML aliases are expanded")
    return size, depth + 1


def _children(node: yaml.Node) -> Iterator[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            yield key
            yield value
    elif isinstance(node, yaml.SequenceNode):
        yield from node.value


class _Locator:
    """Finds the line of a path in the source text, composing the YAML only when asked."""

    def __init__(self, text: str | None) -> None:
        self._text = text
        self._root: yaml.Node | None = None

    def line(self, path: Sequence[PathPart]) -> int | None:
        if self._text is None:
            return None
        if self._root is None:
            try:
                self._root = yaml.compose(self._text, Loader=_Loader)
            except (yaml.YAMLError, RecursionError):
                return None
        node = self._root
        line = None
        for part in path:
            found = _child(node, part)
            if found is None:
                break
            key_node, node = found
            line = (key_node or node).start_mark.line + 1
        return line


def _child(node: yaml.Node | None, part: PathPart) -> tuple[yaml.Node | None, yaml.Node] | None:
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.value == part:
                return key, value
    if isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
        return None, node.value[part]
    return None


# --- friendly errors --------------------------------------------------------


class _Reporter:
    """Builds error messages that point at a place in the source."""

    def __init__(self, source: str, raw: Mapping[str, Any], locate: _Locator) -> None:
        self.source = source
        self.raw = raw
        self.locate = locate

    def where(self, path: Sequence[PathPart]) -> str:
        """``file: line N: tasks[3] 'name'.field`` — every clue we have to the place."""
        parts: list[str] = []
        line = self.locate.line(path)
        if line is not None:
            parts.append(f"line {line}")
        text = ""
        for i, part in enumerate(path):
            if isinstance(part, int):
                text += f"[{part}]"
                if path[:i] == ["tasks"]:
                    text += _task_label(self.raw, part)
            else:
                text += f".{part}" if text else part
        if text:
            parts.append(text)
        return ": ".join([self.source, *parts])

    def unknown(self, block: Mapping[str, Any], kind: str, path: list[PathPart]) -> None:
        """Refuse a field the format does not have, suggesting the nearest one."""
        allowed = _FIELDS[kind]
        for key in block:
            if key in allowed:
                continue
            import difflib  # only for a file in error

            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"did you mean '{close[0]}'?" if close else f"known fields: {', '.join(allowed)}"
            raise ValidationError(
                f"{self.where([*path, echo(str(key))])}: unknown {kind} field "
                f"'{echo(str(key))}' ({hint})"
            )


def _check_fields(report: _Reporter) -> None:
    """Refuse unknown and reserved fields with the place and a suggestion."""
    raw = report.raw
    report.unknown(raw, "workflow", [])
    defaults = raw.get("defaults")
    if isinstance(defaults, Mapping):
        report.unknown(defaults, "defaults", ["defaults"])
        if isinstance(defaults.get("retry"), Mapping):
            report.unknown(defaults["retry"], "retry", ["defaults", "retry"])
    tasks = raw.get("tasks")
    if not isinstance(tasks, list):
        return
    for i, task in enumerate(tasks):
        if not isinstance(task, Mapping):
            continue
        for reserved in RESERVED_TASK_FIELDS:
            if reserved in task:
                raise ValidationError(
                    f"{report.where(['tasks', i, reserved])}: '{reserved}' is not supported "
                    "by this version of dagq yet"
                )
        report.unknown(task, "task", ["tasks", i])
        # kwargs is ai4s-jobq's free mapping: what a shell task ignores is a warning
        for sub in ("retry", "wait_for", "loop", "compensate"):
            if isinstance(task.get(sub), Mapping):
                report.unknown(task[sub], sub, ["tasks", i, sub])


_PATH_PART = re.compile(r"\.([A-Za-z_][\w]*)|\[(\d+)\]|\[\"?([^\]\"]*)\"?\]")


def _convert_error(exc: msgspec.ValidationError, report: _Reporter) -> ValidationError:
    message, _, at = str(exc).partition(" - at `$")
    path: list[PathPart] = []
    for name, index, key in _PATH_PART.findall(at.rstrip("`")):
        path.append(int(index) if index else (name or key))
    detail = _friendly(message.replace("`", "'"))
    if detail.startswith("Invalid enum value") and path and path[-1] in _CHOICES:
        detail += f" (use {_CHOICES[str(path[-1])]})"
    if "matching regex" in detail and path and path[-1] in _PATTERNS:
        detail = _PATTERNS[str(path[-1])]
    if not path:
        return ValidationError(f"{report.source}: {detail}")
    return ValidationError(f"{report.where(path)}: {detail}")


#: What a field with a fixed set of values accepts, for "Invalid enum value" errors.
_CHOICES = {
    "dep_policy": "one of all, any, all_settled, or how many parents must complete",
    "result_policy": "one of all_sinks_succeed, all_tasks_succeed",
    "semantics": "jobq (for ai4s-jobq's rules) or dagq",
}

#: What a field with a pattern accepts, for "Expected 'str' matching regex" errors.
_PATTERNS = {
    "call": "expected MODULE:FUNCTION, a Python function as 'package.module:function' "
    "(e.g. 'mypkg.tasks:train')",
    "signal": "expected a signal name: 1-100 letters, digits, '_', '.', ':' or '-', "
    "starting with a letter, digit or '_'",
}

_TYPE_WORDS = {
    "int": "an integer",
    "float": "a number",
    "str": "a string",
    "bool": "true or false",
    "array": "a list",
    "object": "a mapping",
    "null": "null",
}
_EXPECTED = re.compile(r"^Expected '([^']+)', got '([^']+)'$")


def _friendly(detail: str) -> str:
    """``Expected 'int | null', got 'str'`` → ``expected an integer or null, got a string``."""
    match = _EXPECTED.match(detail)
    if match is None:
        return detail
    wanted = " or ".join(_TYPE_WORDS.get(t.strip(), t.strip()) for t in match.group(1).split("|"))
    got = _TYPE_WORDS.get(match.group(2), match.group(2))
    return f"expected {wanted}, got {got}"


def _task_label(raw: Mapping[str, Any], index: int) -> str:
    tasks = raw.get("tasks")
    if isinstance(tasks, list) and index < len(tasks) and isinstance(tasks[index], Mapping):
        name = tasks[index].get("name")
        if isinstance(name, str):
            return f" '{echo(name)}'"
    return ""


def _kind(value: Any) -> str:
    return "nothing (the file is empty)" if value is None else type(value).__name__
