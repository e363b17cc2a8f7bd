"""What an evaluation read, in words: the record a condition leaves in the history."""

from __future__ import annotations

import fnmatch
import re
import reprlib
from collections.abc import Mapping
from typing import Any

from dagq.expression.expr import Expr

#: How many values one description lists before it says how many more there were.
MAX_READS = 10
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")


class _Brief(reprlib.Repr):
    """A bounded repr in JSON's words (null, true, false), however large the value."""

    def __init__(self) -> None:
        super().__init__()
        self.maxstring = self.maxother = 60
        self.maxlist = self.maxtuple = self.maxdict = 6
        self.maxlevel = 3

    def repr1(self, x: Any, level: int) -> str:
        if x is None:
            return "null"
        if x is True:
            return "true"
        if x is False:
            return "false"
        return super().repr1(x, level)


_brief = _Brief()


def brief(value: Any) -> str:
    """A value as a history entry may show it: short, whatever its size."""
    return _brief.repr(value)


def describe_reads(expr: Expr, env: Mapping[str, Any]) -> str:
    """``inputs.a = {'x': 1}, inputs["b c"] = null, params.n = 3``: each input and param
    the expression reads (by name, through a glob, or all of them), with its value."""
    parts: list[str] = []
    refs = expr.refs
    for root, explicit in (("inputs", refs.inputs), ("params", refs.params)):
        values = env.get(root)
        if not isinstance(values, Mapping):
            continue
        names = set(explicit)
        if root in refs.dynamic:
            names.update(k for k in values if isinstance(k, str))
        elif root == "inputs" and refs.globs:
            for pattern in refs.globs:
                match = re.compile(fnmatch.translate(pattern)).match
                names.update(k for k in values if isinstance(k, str) and match(k))
        for name in sorted(names):
            shown = brief(values[name]) if name in values else "(absent)"
            parts.append(f"{_path(root, name)} = {shown}")
    if not parts:
        return "it read nothing"
    more = len(parts) - MAX_READS
    listed = ", ".join(parts[:MAX_READS]) + (f" and {more} more" if more > 0 else "")
    return f"it read {listed}"


def _path(root: str, name: str) -> str:
    if _IDENTIFIER.match(name):
        return f"{root}.{name}"
    escaped = name.replace("\\", "\\\\").replace('"', '\\"')
    return f'{root}["{escaped}"]'
