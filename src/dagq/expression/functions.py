"""The built-in functions: the aggregates over lists or globs, ``len`` and ``abs``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from dagq.expression.failures import ExpressionError
from dagq.expression.limits import MAX_NODES
from dagq.expression.values import NUMBERS, SEQUENCES, kind_of, show, truthy


class Function(msgspec.Struct, frozen=True):
    """A built-in: how many arguments it takes, whether they may use a glob, and its code."""

    min_args: int
    max_args: int
    glob: bool
    impl: Callable[..., Any]


def _as_list(func: str, value: Any) -> list[Any] | tuple[Any, ...]:
    if isinstance(value, SEQUENCES):
        return value
    raise ExpressionError(
        f'{func}() needs a list, or a glob over inputs like inputs["*"].ok; got {kind_of(value)}'
    )


def _all(values: Any) -> bool:
    return all(truthy(v) for v in _as_list("all", values))


def _any(values: Any) -> bool:
    return any(truthy(v) for v in _as_list("any", values))


def _count(values: Any) -> int:
    return sum(1 for v in _as_list("count", values) if truthy(v))


def _almost_all(values: Any, allowed: Any) -> bool:
    if isinstance(allowed, bool) or not isinstance(allowed, int) or allowed < 0:
        raise ExpressionError(
            f"almost_all() needs a whole number >= 0 of allowed failures, not {show(allowed)}"
        )
    return sum(1 for v in _as_list("almost_all", values) if not truthy(v)) <= allowed


def _len(value: Any) -> int:
    if isinstance(value, (str, *SEQUENCES, Mapping)):
        return len(value)
    raise ExpressionError(f"len() needs a string, list or mapping, not {kind_of(value)}")


def _abs(value: Any) -> Any:
    if not isinstance(value, NUMBERS):
        raise ExpressionError(f"abs() needs a number, not {kind_of(value)} {show(value)}")
    return abs(value)


def _extreme(func: str, pick: Callable[[Any], Any]) -> Callable[..., Any]:
    def impl(*args: Any) -> Any:
        items = _as_list(func, args[0]) if len(args) == 1 else args
        if not items:
            raise ExpressionError(f"{func}() of an empty list")
        for item in items:
            if not isinstance(item, NUMBERS):
                raise ExpressionError(f"{func}() needs numbers, not {kind_of(item)} {show(item)}")
        return pick(items)

    return impl


FUNCTIONS: dict[str, Function] = {
    "all": Function(1, 1, True, _all),
    "any": Function(1, 1, True, _any),
    "count": Function(1, 1, True, _count),
    "almost_all": Function(2, 2, True, _almost_all),
    "min": Function(1, MAX_NODES, True, _extreme("min", min)),
    "max": Function(1, MAX_NODES, True, _extreme("max", max)),
    "len": Function(1, 1, False, _len),
    "abs": Function(1, 1, False, _abs),
}
