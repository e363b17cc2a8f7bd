"""An ``Expr``: text parsed, checked and compiled once, then evaluated as often as needed."""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import msgspec

from dagq.errors import ValidationError
from dagq.expression.evaluation import Compiler, Fn, Scope
from dagq.expression.failures import ExpressionError, ParseFailure
from dagq.expression.limits import MAX_LENGTH
from dagq.expression.nodes import DEFAULT_NAMES, Node, Refs, collect_refs
from dagq.expression.parser import Parser
from dagq.expression.values import kind_of, show


class Expr(msgspec.Struct, frozen=True):
    """A parsed, compiled expression. Immutable; evaluate it as often as needed.

    Its value is its text, tree and references: ``run``, their compiled form, is left
    out of its repr, equality and hash.
    """

    text: str
    node: Node
    refs: Refs
    run: Fn

    def __repr__(self) -> str:
        return f"Expr(text={self.text!r}, node={self.node!r}, refs={self.refs!r})"

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, Expr)
        return (self.text, self.node, self.refs) == (other.text, other.node, other.refs)

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __hash__(self) -> int:
        return hash((self.text, self.node, self.refs))

    def evaluate(self, env: Mapping[str, Any]) -> Any:
        """The value of the expression, its root names looked up in ``env``.

        Raises ExpressionError, naming the expression, when a value has the wrong type or
        a result would be too large.
        """
        try:
            return self.run(Scope(env))
        except ExpressionError as exc:
            raise ExpressionError(f"{exc}, in {self.text!r}") from None
        except RecursionError:
            raise ExpressionError(f"a value is nested too deeply, in {self.text!r}") from None


def references(expr: Expr) -> Refs:
    """The names, keys and globs an expression reads."""
    return expr.refs


def parse(text: str, *, where: str = "expression", names: frozenset[str] = DEFAULT_NAMES) -> Expr:
    """Parse and compile ``text``, whose root names must all be in ``names``.

    Raises ValidationError starting with ``where`` and giving the column at fault.
    """
    return parse_text(text, where, names)


@lru_cache(maxsize=2048)
def _build(text: str, names: frozenset[str] | None) -> Expr:
    """Parse and compile; cached, since definitions repeat the same expressions."""
    if len(text) > MAX_LENGTH:
        message = f"expression is too long ({len(text)} characters; the limit is {MAX_LENGTH})"
        raise ParseFailure(message, None)
    node = Parser(text, names).parse()
    return Expr(text, node, collect_refs(node), Compiler().compile(node))


def parse_text(text: str, where: str, names: frozenset[str] | None) -> Expr:
    """Like ``parse``, but ``names`` None allows any root name."""
    if not isinstance(text, str):
        raise ValidationError(f"{where}: must be a string, not {kind_of(text)} {show(text)}")
    try:
        return _build(text, names)
    except ParseFailure as failure:
        raise ValidationError(_describe(where, text, failure)) from None


def _describe(where: str, text: str, failure: ParseFailure) -> str:
    message = f"{where}: {failure.message}"
    if failure.pos is not None:
        line = text.count("\n", 0, failure.pos) + 1
        column = failure.pos - (text.rfind("\n", 0, failure.pos) + 1) + 1
        place = f"line {line}, column {column}" if "\n" in text else f"column {column}"
        message += f" at {place} of {_excerpt(text, failure.pos)!r}"
    return f"{message}; {failure.hint}" if failure.hint else message


def _excerpt(text: str, pos: int, width: int = 40) -> str:
    """The text, or for a long one the part around ``pos``."""
    if len(text) <= 2 * width:
        return text
    start, end = max(0, pos - width), pos + width
    return ("..." if start else "") + text[start:end] + ("..." if end < len(text) else "")
