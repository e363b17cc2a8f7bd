"""Typed params through the CLI: declared or inferred types, coercion of ``-p`` text,
choices and bounds, and one clear line (exit 2) for a value that does not fit."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.cli_harness import DagqCli
from tests.integration.test_run_bad_input import assert_one_clear_line

pytestmark = pytest.mark.timeout(90)

TYPED = """
name: typed
params:
  documents: 3                      # an int, from its default
  ratio: {type: float, min: 0, max: 1, default: 0.5}
  mode: {type: string, choices: [fast, full], default: fast}
  label: "x"
  dry: false
  tags: [a]
  extra: {type: object, default: {}}
tasks:
  - name: show
    call: typed_tasks:show
    args:
      documents: "{{ params.documents }}"
      ratio: "{{ params.ratio }}"
      mode: "{{ params.mode }}"
      label: "{{ params.label }}"
      dry: "{{ params.dry }}"
      tags: "{{ params.tags }}"
      extra: "{{ params.extra }}"
"""

TASKS = """
def show(**values):
    return {name: [type(v).__name__, v] for name, v in values.items()}
"""


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[DagqCli]:
    with DagqCli(tmp_path) as cli:
        cli.write("typed.yaml", TYPED)
        cli.write("typed_tasks.py", TASKS)
        yield cli


def test_cli_text_is_coerced_to_each_params_type(cli: DagqCli) -> None:
    result = cli.run(
        "run",
        "typed.yaml",
        "--id",
        "t",
        "--quiet",
        *("-p", "documents=5", "-p", "ratio=1", "-p", "mode=full", "-p", "label=42"),
        *("-p", "dry=yes", "-p", 'tags=["b", "c"]', "-p", 'extra={"k": 1}'),
    )
    assert result.code == 0, result.output

    shown = json.loads(cli.run("output", "t", "show").stdout)

    assert shown == {
        "documents": ["int", 5],
        "ratio": ["float", 1.0],
        "mode": ["str", "full"],
        "label": ["str", "42"],  # a string param keeps digits as text
        "dry": ["bool", True],
        "tags": ["list", ["b", "c"]],
        "extra": ["dict", {"k": 1}],
    }


@pytest.mark.parametrize(
    ("param", "mentions"),
    [
        ("documents=abc", ("param 'documents'", 'expected an int, got "abc"')),
        ("documents=2.5", ("param 'documents'", "expected an int")),
        ("ratio=2", ("param 'ratio'", "over the maximum 1")),
        ("ratio=-1", ("param 'ratio'", "under the minimum 0")),
        ("mode=slow", ("param 'mode'", '"slow" is not one of "fast", "full"')),
        ("dry=maybe", ("param 'dry'", "expected a bool")),
        ("tags=a,b", ("param 'tags'", "expected a list as JSON")),
        ("extra=[1]", ("param 'extra'", "expected an object")),
    ],
)
@pytest.mark.parametrize("command", ["run", "submit"])
def test_a_value_of_the_wrong_type_is_refused_in_one_line(
    cli: DagqCli, command: str, param: str, mentions: tuple[str, ...]
) -> None:
    result = cli.run(command, "typed.yaml", "-p", param)

    assert_one_clear_line(result, *mentions)
    assert result.stdout == ""


def test_a_required_param_must_be_given(cli: DagqCli) -> None:
    cli.write(
        "required.yaml",
        """
        name: required
        params:
          n: {type: int, min: 1, description: how many}
        tasks: [{name: a, cmd: "echo {{ params.n }}"}]
        """,
    )

    missing = cli.run("submit", "required.yaml")
    given = cli.run("submit", "required.yaml", "-p", "n=2", "--id", "r")

    assert_one_clear_line(missing, "param 'n' (int >= 1)", "has no default", "-p n=VALUE")
    assert given.code == 0, given.output
    assert given.stdout.strip() == "r"


@pytest.mark.parametrize(
    ("declaration", "mentions"),
    [
        ("{type: integer}", ("params.n.type", 'unknown type "integer"', "did you mean 'int'")),
        ("{type: int, default: x}", ("params.n.default", "expected an int")),
        ("{type: string, min: 1}", ("params.n.min", "int and float params only")),
        ("{type: int, min: 5, max: 1}", ("params.n", "min 5 is over max 1")),
        ("{type: int, choices: []}", ("params.n.choices", "non-empty list")),
        ("{type: int, choices: [1, 2], default: 3}", ("params.n.default", "not one of 1, 2")),
    ],
)
def test_validate_checks_param_declarations(
    cli: DagqCli, declaration: str, mentions: tuple[str, ...]
) -> None:
    cli.write("bad.yaml", f"name: bad\nparams:\n  n: {declaration}\ntasks: [{{name: a, cmd: x}}]\n")

    result = cli.run("validate", "bad.yaml")

    assert_one_clear_line(result, "bad.yaml", *mentions)


def test_validate_lists_each_param_with_its_type_and_default(cli: DagqCli) -> None:
    result = cli.run("validate", "typed.yaml")

    assert result.code == 0, result.output
    assert (
        '  params: documents: int = 3, ratio: float in [0, 1] = 0.5, mode: one of "fast", '
        '"full" = "fast", label: string = "x", dry: bool = false, tags: list = ["a"], '
        "extra: object = {}" in result.stdout
    )
