"""Typed params: inference from defaults, declarations, coercion and checks."""

from __future__ import annotations

from typing import Any

import pytest

from dagq.client import Client
from dagq.errors import ValidationError
from dagq.loading import load_text
from dagq.params import ParamText, param_specs
from dagq.plan import resolve_params
from dagq.stores import open_store

DEFINITION = """
name: typed
params:
  n: 3
  ratio: {type: float, default: 0.5, max: 1}
  name: x
  anything: null
tasks: [{name: a, cmd: "echo {{ params.n }}"}]
"""


def test_types_are_inferred_from_defaults() -> None:
    specs = param_specs({"a": 1, "b": 1.5, "c": True, "d": "x", "e": [], "f": {}, "g": None})

    assert {name: spec.type for name, spec in specs.items()} == {
        "a": "int",
        "b": "float",
        "c": "bool",
        "d": "string",
        "e": "list",
        "f": "object",
        "g": None,
    }


def test_a_mapping_that_is_not_a_declaration_is_an_object_default() -> None:
    spec = param_specs({"p": {"type": "int", "unit": "s"}})["p"]

    assert (spec.type, spec.default) == ("object", {"type": "int", "unit": "s"})


def test_python_values_are_checked_not_coerced() -> None:
    d = load_text(DEFINITION)

    assert resolve_params(d, {"ratio": 1})["ratio"] == 1.0  # an int is a float
    with pytest.raises(ValidationError, match="param 'n': expected an int, got \"5\""):
        resolve_params(d, {"n": "5"})
    with pytest.raises(ValidationError, match="param 'n': expected an int, got true"):
        resolve_params(d, {"n": True})


@pytest.mark.parametrize(
    ("given", "expected"),
    [("5", 5), ("x y", "x y"), ("[1, 2]", [1, 2]), ('"5"', "5")],
)
def test_untyped_params_take_json_when_it_parses(given: str, expected: Any) -> None:
    d = load_text(DEFINITION)

    assert resolve_params(d, {"anything": ParamText(given)})["anything"] == expected


async def test_the_client_refuses_a_param_of_the_wrong_type_before_storing() -> None:
    store = open_store("memory://")
    try:
        with pytest.raises(ValidationError, match="param 'n': expected an int"):
            await Client(store).submit(load_text(DEFINITION), params={"n": "abc"})
        assert await store.documents.list("definitions/") == []
    finally:
        await store.close()


@pytest.mark.parametrize("text", ["1_0", " 5", "5 ", "\u0663", "0x10", "1e3"])
def test_an_int_from_the_command_line_is_plain_ascii_digits(text: str) -> None:
    from dagq.params import coerce_text

    with pytest.raises(ValidationError, match="expected an int"):
        coerce_text("int", text, "param 'n'")


@pytest.mark.parametrize(
    ("kind", "text", "expected"),
    [
        ("int", "-12", -12),
        ("int", "+7", 7),
        ("float", "2.5", 2.5),
        ("float", "1e-3", 0.001),
        ("float", ".5", 0.5),
        ("float", "3", 3.0),
    ],
)
def test_numbers_written_plainly_are_taken(kind: Any, text: str, expected: float) -> None:
    from dagq.params import coerce_text

    assert coerce_text(kind, text, "param 'n'") == expected


@pytest.mark.parametrize("text", ["1_000.5", "nan", "inf", "\u0663.5", " 1.5"])
def test_a_float_from_the_command_line_is_plainly_written_and_finite(text: str) -> None:
    from dagq.params import coerce_text

    with pytest.raises(ValidationError, match="expected a"):
        coerce_text("float", text, "param 'r'")
