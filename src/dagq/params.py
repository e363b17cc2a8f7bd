"""Typed params: what a workflow declares it takes, and the values a run is given.

A param is declared in a definition's ``params`` mapping in one of two ways:

* by its default alone (``documents: 40``): its type is inferred from the default
  (``40`` is an int, ``"small"`` a string, ``[1, 2]`` a list; ``null`` means any type);
* by a declaration, a mapping with a ``type`` key and only the keys ``type``,
  ``default``, ``choices``, ``min``, ``max``, ``description``
  (``mode: {type: string, choices: [fast, full], default: fast}``). A declaration
  without ``default`` is a required param: a run must give it.

Values given on the command line (``-p n=5``) arrive as :class:`ParamText` and are
coerced to the declared type; values given from Python are checked as they are (an int
is accepted for a float). Either way a value of the wrong type, outside the choices or
the bounds, is refused in one line naming the param — before anything is stored.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any, Literal, cast, get_args

import msgspec

from dagq.errors import PayloadTooLarge, ValidationError
from dagq.payloads import MAX_DEPTH, check_depth, echo

ParamType = Literal["int", "float", "bool", "string", "list", "object"]
TYPES: tuple[ParamType, ...] = get_args(ParamType)
DECLARATION_KEYS = frozenset({"type", "default", "choices", "min", "max", "description"})
#: Names people reach for, mapped to the one dagq uses (for "did you mean").
_ALIASES = {
    "integer": "int",
    "str": "string",
    "text": "string",
    "number": "float",
    "double": "float",
    "boolean": "bool",
    "dict": "object",
    "mapping": "object",
    "map": "object",
    "array": "list",
}
_TRUE = frozenset({"true", "yes", "on", "1"})
_FALSE = frozenset({"false", "no", "off", "0"})


class ParamText(str):
    """A param value as typed on the command line, to be coerced to the param's type."""

    __slots__ = ()


class ParamSpec(msgspec.Struct, frozen=True):
    """One declared param: its type (None: any), default, choices and bounds."""

    name: str
    type: ParamType | None
    default: Any = None
    required: bool = False
    choices: tuple[Any, ...] | None = None
    minimum: float | None = None
    maximum: float | None = None
    description: str | None = None

    def describe(self) -> str:
        """The type as people read it: ``int``, ``int in [1, 100]``, ``one of a, b``."""
        if self.choices is not None:
            return "one of " + ", ".join(json.dumps(c) for c in self.choices)
        kind = self.type or "any"
        if self.minimum is not None and self.maximum is not None:
            return f"{kind} in [{_num(self.minimum)}, {_num(self.maximum)}]"
        if self.minimum is not None:
            return f"{kind} >= {_num(self.minimum)}"
        if self.maximum is not None:
            return f"{kind} <= {_num(self.maximum)}"
        return kind


def is_declaration(value: Any) -> bool:
    """Does a ``params`` entry declare the param (rather than give its default)?"""
    return isinstance(value, dict) and "type" in value and set(value) <= DECLARATION_KEYS


def param_specs(params: Mapping[str, Any]) -> dict[str, ParamSpec]:
    """The specs of a definition's ``params``; ValidationError naming the first bad one."""
    return {name: param_spec(name, value) for name, value in params.items()}


def param_spec(name: str, value: Any) -> ParamSpec:
    """The spec of one ``params`` entry, its declaration checked."""
    if not is_declaration(value):
        return ParamSpec(name=name, type=infer_type(value), default=value)
    where = f"params.{echo(name)}"
    kind = _declared_type(value["type"], where)
    choices = value.get("choices")
    if choices is not None:
        if not isinstance(choices, list) or not choices:
            raise ValidationError(f"{where}.choices: expected a non-empty list of values")
        choices = tuple(check_value(kind, c, f"{where}.choices") for c in choices)
    bounds = [_bound(value, key, kind, where) for key in ("min", "max")]
    if bounds[0] is not None and bounds[1] is not None and bounds[0] > bounds[1]:
        raise ValidationError(f"{where}: min {_num(bounds[0])} is over max {_num(bounds[1])}")
    description = value.get("description")
    if description is not None and not isinstance(description, str):
        raise ValidationError(f"{where}.description: expected text")
    spec = ParamSpec(
        name=name,
        type=kind,
        required="default" not in value,
        choices=choices,
        minimum=bounds[0],
        maximum=bounds[1],
        description=description,
    )
    if spec.required:
        return spec
    default = check(spec, value["default"], where=f"{where}.default")
    return msgspec.structs.replace(spec, default=default)


def describe_params(params: Mapping[str, Any]) -> str:
    """The params of a definition in one line: ``n: int = 3, mode: one of "a", "b"``."""
    parts = []
    for name, spec in param_specs(params).items():
        value = " (required)" if spec.required else f" = {_show(spec.default)}"
        parts.append(f"{name}: {spec.describe()}{value}")
    return ", ".join(parts)


def infer_type(default: Any) -> ParamType | None:
    """The type a default implies (None: any type)."""
    if isinstance(default, bool):
        return "bool"
    if isinstance(default, int):
        return "int"
    if isinstance(default, float):
        return "float"
    if isinstance(default, str):
        return "string"
    if isinstance(default, list):
        return "list"
    if isinstance(default, dict):
        return "object"
    return None


def defaults(params: Mapping[str, Any]) -> dict[str, Any]:
    """The default value of every param that has one."""
    return {name: spec.default for name, spec in param_specs(params).items() if not spec.required}


def check(spec: ParamSpec, value: Any, *, where: str | None = None) -> Any:
    """``value`` for the param, coerced from command-line text if it is some, or
    ValidationError naming the param, what was given and what it takes."""
    where = where or f"param '{echo(spec.name)}'"
    if isinstance(value, ParamText):
        value = coerce_text(spec.type, str(value), where)
    elif spec.type is not None:
        value = check_value(spec.type, value, where)
    if spec.choices is not None and value not in spec.choices:
        shown = ", ".join(json.dumps(c) for c in spec.choices)
        raise ValidationError(f"{where}: {_show(value)} is not one of {shown}")
    if spec.minimum is not None and value < spec.minimum:
        raise ValidationError(f"{where}: {_show(value)} is under the minimum {_num(spec.minimum)}")
    if spec.maximum is not None and value > spec.maximum:
        raise ValidationError(f"{where}: {_show(value)} is over the maximum {_num(spec.maximum)}")
    return value


def check_value(kind: ParamType, value: Any, where: str) -> Any:
    """``value`` if it is of type ``kind`` (an int becomes a float for a float)."""
    if kind == "float" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not _is(kind, value):
        raise ValidationError(f"{where}: expected {_article(kind)}, got {_show(value)}")
    return value


def coerce_text(kind: ParamType | None, text: str, where: str) -> Any:
    """Command-line text as a value of type ``kind`` (any type: JSON if it parses)."""
    if kind == "string":
        return text
    if kind == "bool":
        lowered = text.strip().lower()
        if lowered in _TRUE or lowered in _FALSE:
            return lowered in _TRUE
        raise ValidationError(f"{where}: expected a bool (true or false), got {_show(text)}")
    if kind in ("int", "float"):
        return _number(kind, text, where)
    try:
        parsed = json.loads(text)
    except RecursionError:  # deeper than the parser's stack: far over the bound
        raise PayloadTooLarge(
            f"{where}: the value is nested more than {MAX_DEPTH} levels deep"
        ) from None
    except ValueError:
        if kind is None:
            return text
        raise ValidationError(
            f"{where}: expected {_article(kind)} as JSON, got {_show(text)}"
        ) from None
    check_depth(parsed, f"{where}: the value")
    return parsed if kind is None else check_value(kind, parsed, where)


#: How numbers are written on the command line: plain ASCII digits (Python's int() and
#: float() would also take ``1_0``, `` 5`` and other scripts' digits).
_NUMBER = {
    "int": re.compile(r"[+-]?[0-9]+"),
    "float": re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?"),
}


def _number(kind: Literal["int", "float"], text: str, where: str) -> int | float:
    try:
        if not _NUMBER[kind].fullmatch(text):
            raise ValueError(text)
        value: int | float = int(text) if kind == "int" else float(text)
    except ValueError:
        raise ValidationError(f"{where}: expected {_article(kind)}, got {_show(text)}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise ValidationError(f"{where}: expected a finite number, got {_show(text)}")
    return value


def _is(kind: ParamType, value: Any) -> bool:
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, float) and math.isfinite(value)
    expected = {"bool": bool, "string": str, "list": list, "object": dict}[kind]
    return isinstance(value, expected)


def _declared_type(kind: Any, where: str) -> ParamType:
    if kind in TYPES:
        return cast(ParamType, kind)
    known = ", ".join(TYPES)
    alias = _ALIASES.get(kind) if isinstance(kind, str) else None
    hint = f"did you mean '{alias}'? " if alias else ""
    raise ValidationError(f"{where}.type: unknown type {_show(kind)} ({hint}types: {known})")


def _bound(value: Mapping[str, Any], key: str, kind: ParamType, where: str) -> float | None:
    bound = value.get(key)
    if bound is None:
        return None
    if kind not in ("int", "float"):
        raise ValidationError(f"{where}.{key}: bounds apply to int and float params only")
    if isinstance(bound, bool) or not isinstance(bound, int | float) or not math.isfinite(bound):
        raise ValidationError(f"{where}.{key}: expected a number, got {_show(bound)}")
    return bound


def _article(kind: str) -> str:
    return f"an {kind}" if kind[0] in "aeiou" else f"a {kind}"


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _show(value: Any) -> str:
    """A value as an error message may repeat it: JSON, cut to one short line."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        text = f"a value of type {type(value).__name__}"
    return echo(text, 60)
