"""The two ways an expression fails: while parsing, and while evaluating."""

from __future__ import annotations

from dagq.errors import DagqError


class ExpressionError(DagqError):
    """An expression could not be evaluated: wrong types, division by zero, a result too big."""


class ParseFailure(Exception):
    """A parse error at a position; turned into a ValidationError by ``parse_text``."""

    def __init__(self, message: str, pos: int | None, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.pos = pos
        self.hint = hint
