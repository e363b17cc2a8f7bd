"""What the operators do to values: reading keys, comparing, arithmetic within bounds."""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping
from typing import Any

from dagq.expression.failures import ExpressionError
from dagq.expression.limits import MAX_INT, MAX_SIZE
from dagq.expression.values import NUMBERS, SEQUENCES, kind_of, show


def read(container: Any, key: Any) -> Any:
    """``container[key]``, or None when the key is missing or the container is null."""
    if container.__class__ is dict and key.__class__ is str:
        return container.get(key)
    if container is None:
        return None
    if isinstance(key, bool) or not isinstance(key, (str, int)):
        raise ExpressionError(f"a key or index must be a string or an int, not {kind_of(key)}")
    if isinstance(container, Mapping):
        return container.get(key)
    if isinstance(container, (*SEQUENCES, str)):
        if isinstance(key, str):
            raise ExpressionError(f"cannot read {key!r} of a {kind_of(container)}")
        try:
            return container[key]
        except IndexError:
            return None
    raise ExpressionError(f"cannot read {show(key)} of {kind_of(container)} {show(container)}")


def _mismatch(symbol: str, a: Any, b: Any) -> ExpressionError:
    return ExpressionError(
        f"'{symbol}' does not work on {kind_of(a)} and {kind_of(b)}: {show(a)} {symbol} {show(b)}"
    )


def _order_kind(value: Any) -> str | None:
    if isinstance(value, NUMBERS):
        return "number"
    if isinstance(value, str):
        return "string"
    return "list" if isinstance(value, SEQUENCES) else None


def _ordering(symbol: str, compare: Callable[[Any, Any], bool]) -> Callable[[Any, Any], bool]:
    """An order comparison that refuses mixed types (null < 1) instead of guessing."""

    def check(a: Any, b: Any) -> bool:
        if a.__class__ in NUMBERS and b.__class__ in NUMBERS:
            return compare(a, b)
        kind = _order_kind(a)
        if kind is not None and kind == _order_kind(b):
            try:
                return compare(a, b)
            except TypeError:
                pass  # lists whose items cannot be ordered
        raise ExpressionError(
            f"cannot compare {kind_of(a)} {symbol} {kind_of(b)}: {show(a)} {symbol} {show(b)}"
        )

    return check


def _contains(a: Any, b: Any) -> bool:
    if isinstance(b, str):
        if isinstance(a, str):
            return a in b
    elif isinstance(b, (*SEQUENCES, Mapping)):
        try:
            return a in b
        except TypeError:
            pass  # an unhashable key tested against a mapping
    raise _mismatch("in", a, b)


def _same(a: Any, b: Any) -> bool:
    return a is b or (type(a) is type(b) and bool(a == b))


COMPARISONS: dict[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": _ordering("<", operator.lt),
    "<=": _ordering("<=", operator.le),
    ">": _ordering(">", operator.gt),
    ">=": _ordering(">=", operator.ge),
    "in": _contains,
    "not in": lambda a, b: not _contains(a, b),
    "is": _same,
    "is not": lambda a, b: not _same(a, b),
}


def _finite(value: Any) -> bool:
    return not isinstance(value, float) or math.isfinite(value)


def _bounded(symbol: str, result: Any, a: Any, b: Any) -> Any:
    if result.__class__ is int:
        if -MAX_INT <= result <= MAX_INT:
            return result
    elif math.isfinite(result) or not (_finite(a) and _finite(b)):
        return result
    raise _out_of_range(symbol, a, b)


def _out_of_range(symbol: str, a: Any, b: Any) -> ExpressionError:
    return ExpressionError(
        f"the result of {show(a)} {symbol} {show(b)} is out of range "
        "(numbers are limited to 2**63 in magnitude)"
    )


def _numeric(symbol: str, apply: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    def arith(a: Any, b: Any) -> Any:
        if not (isinstance(a, NUMBERS) and isinstance(b, NUMBERS)):
            raise _mismatch(symbol, a, b)
        try:
            result = apply(a, b)
        except ZeroDivisionError:
            raise ExpressionError(f"division by zero: {show(a)} {symbol} {show(b)}") from None
        except OverflowError:
            raise _out_of_range(symbol, a, b) from None
        return _bounded(symbol, result, a, b)

    return arith


def _check_size(symbol: str, size: int) -> None:
    if size > MAX_SIZE:
        raise ExpressionError(
            f"the result of '{symbol}' would hold {size} items; the limit is {MAX_SIZE}"
        )


_plus = _numeric("+", operator.add)
_times = _numeric("*", operator.mul)


def _add(a: Any, b: Any) -> Any:
    if isinstance(a, str) and isinstance(b, str):
        _check_size("+", len(a) + len(b))
        return a + b
    if isinstance(a, SEQUENCES) and isinstance(b, SEQUENCES):
        _check_size("+", len(a) + len(b))
        return [*a, *b]
    return _plus(a, b)


def _multiply(a: Any, b: Any) -> Any:
    if isinstance(a, (str, *SEQUENCES)) and isinstance(b, int):
        sequence, times = a, b
    elif isinstance(a, int) and isinstance(b, (str, *SEQUENCES)):
        sequence, times = b, a
    else:
        return _times(a, b)
    _check_size("*", len(sequence) * max(times, 0))
    return sequence * times if isinstance(sequence, str) else list(sequence) * times


ARITHMETIC: dict[str, Callable[[Any, Any], Any]] = {
    "+": _add,
    "-": _numeric("-", operator.sub),
    "*": _multiply,
    "/": _numeric("/", operator.truediv),
    "//": _numeric("//", operator.floordiv),
    "%": _numeric("%", operator.mod),
}


def negate(value: Any) -> Any:
    """``-value``, for numbers only."""
    if not isinstance(value, NUMBERS):
        raise ExpressionError(f"'-' does not work on {kind_of(value)} {show(value)}")
    return -value
