"""``{{ expr }}`` templates in strings: finding them, and filling them in."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import msgspec

from dagq.errors import ValidationError
from dagq.expression.expr import Expr, parse_text
from dagq.expression.failures import ExpressionError
from dagq.expression.nodes import DEFAULT_NAMES
from dagq.expression.values import SEQUENCES, kind_of, show


def render(
    value: Any,
    env: Mapping[str, Any],
    *,
    roots: frozenset[str],
    quote: Callable[[Any], str] | None = None,
) -> Any:
    """Fill the ``{{ expr }}`` templates in the strings of ``value`` (dicts and lists walked).

    A string that is one template becomes the expression's value itself; a template inside
    longer text is replaced by the value as text (strings as they are, other values as JSON,
    or whatever ``quote`` makes of the value). Templates naming a root outside ``roots`` are
    left as written, to be rendered at a later stage.
    """
    if isinstance(value, str):
        return _render_text(value, env, roots, quote) if "{{" in value else value
    if isinstance(value, Mapping):
        return {key: render(item, env, roots=roots, quote=quote) for key, item in value.items()}
    if isinstance(value, SEQUENCES):
        return [render(item, env, roots=roots, quote=quote) for item in value]
    return value


def template_expressions(
    value: Any, *, where: str = "template", names: frozenset[str] = DEFAULT_NAMES
) -> list[tuple[str, Expr]]:
    """Every ``{{ }}`` template in the strings of ``value``, as (expression text, Expr).

    Raises ValidationError for an unclosed ``{{`` or an expression that does not parse.
    """
    found: list[tuple[str, Expr]] = []
    for text in _strings(value):
        for start, end in _holes(text, where):
            inner = text[start + 2 : end - 2].strip()
            found.append((inner, parse_text(inner, f"{where}: {text[start:end]}", names)))
    return found


def _strings(value: Any) -> Iterator[str]:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, Mapping):
            stack.extend(reversed(list(item.values())))
        elif isinstance(item, SEQUENCES):
            stack.extend(reversed(item))


def _holes(text: str, where: str) -> list[tuple[int, int]]:
    """The (start, end) of each ``{{ ... }}``; a ``}}`` inside a quoted string does not close."""
    holes: list[tuple[int, int]] = []
    start = text.find("{{")
    while start >= 0:
        end = _closing(text, start + 2)
        if end < 0:
            shown = show(text[start:])
            raise ValidationError(f"{where}: '{{{{' is never closed by '}}}}' in {shown}")
        holes.append((start, end))
        start = text.find("{{", end)
    return holes


def _closing(text: str, pos: int) -> int:
    """The index just past the ``}}`` closing a template, or -1."""
    while pos < len(text) - 1:
        char = text[pos]
        if char in "'\"":
            pos += 1
            while pos < len(text) and text[pos] != char:
                pos += 2 if text[pos] == "\\" else 1
        elif char == "}" and text[pos + 1] == "}":
            return pos + 2
        pos += 1
    return -1


def _render_text(
    text: str, env: Mapping[str, Any], roots: frozenset[str], quote: Callable[[Any], str] | None
) -> Any:
    holes = _holes(text, "template")
    if holes == [(0, len(text))]:
        expr = parse_text(text[2:-2].strip(), f"template {text}", None)
        return expr.evaluate(env) if expr.refs.roots <= roots else text
    parts: list[str] = []
    last = 0
    for start, end in holes:
        parts.append(text[last:start])
        source = text[start:end]
        expr = parse_text(source[2:-2].strip(), f"template {source}", None)
        if expr.refs.roots <= roots:
            parts.append(_as_text(expr.evaluate(env), quote))
        else:
            parts.append(source)
        last = end
    parts.append(text[last:])
    return "".join(parts)


def _as_text(value: Any, quote: Callable[[Any], str] | None) -> str:
    if quote is not None:
        return quote(value)
    if isinstance(value, str):
        return value
    try:
        return msgspec.json.encode(value).decode()
    except (TypeError, OverflowError, msgspec.EncodeError) as exc:
        raise ExpressionError(f"cannot write {kind_of(value)} {show(value)} as text") from exc
