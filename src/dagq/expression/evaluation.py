"""A tree to nested closures, compiled once, so that evaluation costs a few calls."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Mapping
from typing import Any, TypeAlias, assert_never

from dagq.expression.failures import ExpressionError
from dagq.expression.functions import FUNCTIONS
from dagq.expression.nodes import (
    GLOB_ROOT,
    Arith,
    Attr,
    BoolOp,
    Call,
    Compare,
    Glob,
    ListOf,
    Literal,
    Name,
    Node,
    Path,
    Unary,
)
from dagq.expression.operators import ARITHMETIC, COMPARISONS, negate, read
from dagq.expression.values import kind_of


class Scope:
    """One evaluation: the environment, and the input each active glob stands for."""

    __slots__ = ("bound", "env")

    def __init__(self, env: Mapping[str, Any]) -> None:
        self.env = env
        self.bound: dict[int, Any] = {}


Fn: TypeAlias = Callable[[Scope], Any]


def _root(scope: Scope, name: str) -> Any:
    try:
        return scope.env[name]
    except KeyError:
        raise ExpressionError(f"{name!r} is not available here") from None


class Compiler:
    """Compiles one tree; each aggregate over a glob gets a slot for the input it stands for."""

    def __init__(self) -> None:
        self.slots = 0
        self.slot: int | None = None  # the glob slot of the aggregate being compiled

    def compile(self, node: Node) -> Fn:
        """The closure that computes ``node`` in a Scope."""
        match node:
            case Literal(value=value):
                return lambda s: value
            case ListOf(items=items):
                fns = tuple(self.compile(item) for item in items)
                return lambda s: [f(s) for f in fns]
            case Name(name=name):
                return lambda s: _root(s, name)
            case Glob():
                slot = self.slot
                assert slot is not None, "the parser puts globs inside aggregates only"
                return lambda s: s.bound[slot]
            case Path():
                return self._path(node)
            case Unary(op=op, operand=operand):
                inner = self.compile(operand)
                if op == "not":
                    return lambda s: not inner(s)
                return lambda s: negate(inner(s))
            case BoolOp():
                return self._bool(node)
            case Compare():
                return self._compare(node)
            case Arith():
                return self._arith(node)
            case Call():
                return self._call(node)
            case _:
                assert_never(node)

    def _path(self, node: Path) -> Fn:
        base = self.compile(node.base)
        if all(isinstance(step, Attr) for step in node.steps):
            keys = tuple(step.name for step in node.steps if isinstance(step, Attr))

            def attrs(s: Scope) -> Any:
                value = base(s)
                for key in keys:
                    value = read(value, key)
                return value

            return attrs
        steps = tuple(
            _constant(step.name) if isinstance(step, Attr) else self.compile(step.key)
            for step in node.steps
        )

        def path(s: Scope) -> Any:
            value = base(s)
            for step in steps:
                value = read(value, step(s))
            return value

        return path

    def _bool(self, node: BoolOp) -> Fn:
        fns = tuple(self.compile(operand) for operand in node.operands)
        # plain loops rather than all()/any() over a generator: this is the hot path
        if node.op == "and":

            def both(s: Scope) -> bool:
                for f in fns:  # noqa: SIM110
                    if not f(s):
                        return False
                return True

            return both

        def either(s: Scope) -> bool:
            for f in fns:  # noqa: SIM110
                if f(s):
                    return True
            return False

        return either

    def _compare(self, node: Compare) -> Fn:
        first = self.compile(node.first)
        ops = tuple(COMPARISONS[op] for op in node.ops)
        rest = tuple(self.compile(operand) for operand in node.operands)
        if len(ops) == 1:
            op, right = ops[0], rest[0]
            return lambda s: op(first(s), right(s))
        pairs = tuple(zip(ops, rest, strict=True))

        def chain(s: Scope) -> bool:
            left = first(s)
            for compare, fn in pairs:
                right = fn(s)
                if not compare(left, right):
                    return False
                left = right
            return True

        return chain

    def _arith(self, node: Arith) -> Fn:
        first = self.compile(node.first)
        ops = tuple(ARITHMETIC[op] for op in node.ops)
        rest = tuple(self.compile(operand) for operand in node.operands)
        if len(ops) == 1:
            op, right = ops[0], rest[0]
            return lambda s: op(first(s), right(s))
        pairs = tuple(zip(ops, rest, strict=True))

        def chain(s: Scope) -> Any:
            value = first(s)
            for apply, fn in pairs:
                value = apply(value, fn(s))
            return value

        return chain

    def _call(self, node: Call) -> Fn:
        impl = FUNCTIONS[node.func].impl
        fns = [self.compile(arg) for arg in node.args[1:]]
        if node.glob is None:
            fns.insert(0, self.compile(node.args[0]))
        else:
            outer, self.slot = self.slot, self.slots
            self.slots += 1
            fns.insert(0, _expand(node.glob, self.slot, self.compile(node.args[0])))
            self.slot = outer
        if len(fns) == 1:
            only = fns[0]
            return lambda s: impl(only(s))
        return lambda s: impl(*[f(s) for f in fns])


def _constant(value: Any) -> Fn:
    return lambda s: value


def _expand(pattern: str, slot: int, fn: Fn) -> Fn:
    """The values of ``fn`` with the glob standing for each matching input in turn."""
    match = re.compile(fnmatch.translate(pattern)).match

    def expand(s: Scope) -> list[Any]:
        inputs = _root(s, GLOB_ROOT)
        if not isinstance(inputs, Mapping):
            raise ExpressionError(f"{GLOB_ROOT!r} is a {kind_of(inputs)}, not a mapping")
        values = []
        for name in sorted(k for k in inputs if isinstance(k, str) and match(k)):
            s.bound[slot] = inputs[name]
            try:
                values.append(fn(s))
            except ExpressionError as exc:
                raise ExpressionError(f"{exc} (for input {name!r})") from None
        return values

    return expand
