"""Hostile and random input: the expression language refuses cleanly, never crashes or hangs.

Parsing either gives an Expr or raises ValidationError; evaluating either gives a value or
raises ExpressionError; nothing else, and always quickly.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dagq.errors import ValidationError
from dagq.expression import (
    MAX_DEPTH,
    Expr,
    ExpressionError,
    parse,
    render,
    template_expressions,
    truthy,
)

FUZZ = settings(
    max_examples=150,
    deadline=timedelta(milliseconds=500),
    suppress_health_check=[HealthCheck.too_slow],
)
ROOTS = frozenset({"inputs", "params"})


def parse_or_refuse(text: str) -> Expr | None:
    try:
        return parse(text)
    except ValidationError:
        return None


def evaluate_or_refuse(expr: Expr, env: dict[str, Any]) -> Any:
    try:
        return expr.evaluate(env)
    except ExpressionError:
        return None


# --- random text ------------------------------------------------------------------

VOCABULARY = [
    *"()[].,+-*/%<>=!'\"\\{}_*?",
    "==", "!=", "<=", ">=", "//", "**", "and", "or", "not", "in", "is", "true", "False",
    "null", "None", "inputs", "params", "all", "any", "count", "almost_all", "len", "min",
    "max", "abs", "__class__", "__import__", "0", "1", "-1", "2.5", "1e3", "9223372036854775808",
    '"*"', "'a-*'", '"x"', "'\\u00e9'", "inputs.*", 'inputs["*"]', "A", "train-1", " ", "\n",
]  # fmt: skip


@FUZZ
@given(st.text(max_size=300))
def test_random_text_parses_or_is_refused(text: str) -> None:
    parse_or_refuse(text)


@FUZZ
@given(st.lists(st.sampled_from(VOCABULARY), max_size=60), st.sampled_from(["", " "]))
def test_token_soup_parses_or_is_refused(tokens: list[str], separator: str) -> None:
    expr = parse_or_refuse(separator.join(tokens))
    if expr is not None:
        evaluate_or_refuse(expr, {"inputs": {"A": {"x": 1}}, "params": {}})


@FUZZ
@given(st.text(alphabet="{}'\" ab.+", max_size=80))
def test_random_templates_render_or_are_refused(text: str) -> None:
    env = {"params": {"a": 1}, "inputs": {}}
    try:
        template_expressions(text)
        render(text, env, roots=ROOTS)
    except (ValidationError, ExpressionError):
        pass


# --- random valid expressions over random data ---------------------------------------

NAMES = ["A", "B", "train-1", "train-2", "prep/x"]
KEYS = ["x", "y", "ok", "items"]

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(KEYS), inner),
    max_leaves=12,
)
environments = st.fixed_dictionaries(
    {
        "inputs": st.dictionaries(st.sampled_from(NAMES), json_values, max_size=5),
        "params": st.dictionaries(st.sampled_from(KEYS), json_values, max_size=4),
    }
)


def string_literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


leaves = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.text(max_size=6).map(string_literal),
    st.sampled_from(["true", "false", "null", "True", "None", "[]"]),
    st.tuples(st.sampled_from(NAMES), st.sampled_from(KEYS)).map(
        lambda p: f"inputs[{string_literal(p[0])}].{p[1]}"
    ),
    st.sampled_from(KEYS).map(lambda k: f"params.{k}"),
    st.sampled_from(["inputs.A", "inputs.B.items[0]", "inputs.A.x[-1]", "params"]),
)
BINARY = ["and", "or", "==", "!=", "<", "<=", ">", ">=", "in", "not in", "is", "+", "-", "*"]
BINARY += ["/", "//", "%"]
AGGREGATES = [
    "all(inputs.*.{k})",
    "any(inputs['train-*'].{k})",
    "count(inputs['*'].{k} == 1)",
    "almost_all(inputs.*.{k}, 1)",
    "max(inputs.*.{k})",
]


def composite(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.tuples(inner, st.sampled_from(BINARY), inner).map(
            lambda t: f"(({t[0]}) {t[1]} ({t[2]}))"
        ),
        st.tuples(inner, inner, inner).map(lambda t: f"(({t[0]}) < ({t[1]}) <= ({t[2]}))"),
        inner.map(lambda e: f"not ({e})"),
        inner.map(lambda e: f"-({e})"),
        st.lists(inner, max_size=3).map(lambda items: f"[{', '.join(items)}]"),
        st.tuples(st.sampled_from(["len", "abs", "all", "any", "count", "min", "max"]), inner).map(
            lambda t: f"{t[0]}({t[1]})"
        ),
        st.tuples(inner, inner).map(lambda t: f"max({t[0]}, {t[1]})"),
        st.tuples(inner, st.sampled_from(['"x"', "0", "-1", '"ok"'])).map(
            lambda t: f"({t[0]})[{t[1]}]"
        ),
        st.tuples(st.sampled_from(AGGREGATES), st.sampled_from(KEYS)).map(
            lambda t: t[0].format(k=t[1])
        ),
    )


expressions = st.recursive(leaves, composite, max_leaves=20)


@FUZZ
@given(expressions, environments)
def test_valid_expressions_evaluate_or_raise_expression_error(
    text: str, env: dict[str, Any]
) -> None:
    try:
        expr = parse(text)
    except ValidationError as exc:  # the one static type check: indexing a number literal
        assert "cannot read a key of" in str(exc)
        return
    value = evaluate_or_refuse(expr, env)
    truthy(value)


@FUZZ
@given(expressions)
def test_parse_is_deterministic(text: str) -> None:
    assert parse_or_refuse(text) == parse_or_refuse(text)


# --- hostile input ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "().__class__",
        "9**9**9",
        '__import__("os")',
        "__import__('os').system('true')",
        "inputs.__class__.__mro__[1].__subclasses__()",
        "getattr(inputs, '__class__')",
        "lambda: 1",
        "[x for x in inputs]",
        "(" * 10_000 + ")" * 10_000,
        "(" * 4000,
        "[" * 2000 + "]" * 2000,
        "not " * 1000 + "true",
        "-" * 4000 + "1",
        "x" * 1_000_000,
        '"' + "a" * 1_000_000 + '"',
        "inputs" + ".a" * 2000,
        "+".join(["1"] * 2000),
        "1" * 4000,
        "1e99999",
        "'\\x'",
        "'\\ud800'",
        "{{ 1 }}",
        "\x00",
    ],
)
def test_hostile_text_is_refused_cleanly(text: str) -> None:
    started = time.perf_counter()
    with pytest.raises(ValidationError):
        parse(text)
    assert time.perf_counter() - started < 1.0


@pytest.mark.parametrize(
    "text",
    [
        '"a" * 1000000000',
        "[0] * 1000000000",
        "'a' * 9223372036854775807 * 9223372036854775807",
        "9223372036854775807 * 9223372036854775807",
        "('a' * 999999) + ('a' * 999999)",
        "1e308 * 1e308",
        "10 / 0",
        "10 // 0.0",
        "10 % 0",
        "inputs.big * inputs.big",
        "inputs.big / 3",
        "-inputs.A.__class__",
    ],
)
def test_hostile_evaluation_is_refused_cleanly(text: str) -> None:
    env = {"inputs": {"big": 10**400, "A": {}}, "params": {}}
    started = time.perf_counter()
    with pytest.raises(ExpressionError):
        parse(text).evaluate(env)
    assert time.perf_counter() - started < 1.0


def test_dunder_access_never_reaches_python_objects() -> None:
    env: dict[str, Any] = {"inputs": {"A": {}}, "params": {}}
    for text in [
        "inputs.__class__",
        "inputs.A.__dict__",
        "params.__globals__",
        "inputs['__len__']",
    ]:
        assert parse(text).evaluate(env) is None


@contextmanager
def stack_budget(frames: int) -> Iterator[None]:
    """Allow only ``frames`` more Python frames than are in use now."""
    depth, frame = 0, sys._getframe()
    while frame is not None:
        depth, frame = depth + 1, frame.f_back  # type: ignore[assignment]
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(depth + frames)
    try:
        yield
    finally:
        sys.setrecursionlimit(limit)


@pytest.mark.parametrize(
    "text",
    [
        "(" * (MAX_DEPTH - 1) + "1" + ")" * (MAX_DEPTH - 1),
        "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1),
        "not " * (MAX_DEPTH - 2) + "true",
        "-(" * (MAX_DEPTH // 2 - 1) + "params.x" + ")" * (MAX_DEPTH // 2 - 1),
        "len(" * (MAX_DEPTH - 1) + "'a'" + ")" * (MAX_DEPTH - 1),
        "1 or (2 and (3 == (4 + (5 * (" * 10 + "6" + "))))) " * 10,
    ],
)
def test_deepest_accepted_expressions_use_a_bounded_stack(text: str) -> None:
    with stack_budget(500):
        expr = parse_or_refuse(text)
        if expr is not None:
            evaluate_or_refuse(expr, {"inputs": {}, "params": {"x": 2}})
