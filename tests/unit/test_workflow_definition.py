"""The Python round trip: a definition loaded and dumped loads again to the same one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from dagq import WorkflowDefinition
from dagq.errors import ValidationError

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
NAMES = st.text("abcdefghijklmnopqrstuvwxyz0123456789_-./", min_size=1, max_size=12).filter(
    lambda s: s[0].isalnum()
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**31), 2**31),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.text(max_size=10),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)


@st.composite
def tasks(draw: st.DrawFn) -> dict[str, Any]:
    """A definition in dagq's or ai4s-jobq's form; some the loader refuses (assumed away)."""
    names = draw(st.lists(NAMES, min_size=1, max_size=6, unique=True))
    out = []
    for k, name in enumerate(names):
        task: dict[str, Any] = {"name": name}
        parents = draw(st.lists(st.sampled_from(names[:k]), unique=True)) if k else []
        if parents:
            task["depends_on"] = parents
            task["dep_policy"] = draw(
                st.sampled_from(["all", "any", "all_settled", *range(1, len(parents) + 1)])
            )
            if draw(st.booleans()):
                task["condition"] = f'inputs["{parents[0]}"].ok == true'
        kind = draw(st.sampled_from(["cmd", "kwargs", "call", "sleep"]))
        if kind == "cmd":
            task["cmd"] = draw(
                st.one_of(
                    st.text(min_size=1, max_size=20),
                    st.lists(st.text(min_size=1, max_size=5), min_size=1, max_size=3),
                )
            )
        elif kind == "kwargs":
            task["kwargs"] = {
                "cmd": draw(st.text(min_size=1, max_size=20)),
                "env": draw(
                    st.dictionaries(
                        st.from_regex(r"[A-Z_]{1,5}", fullmatch=True),
                        st.text(max_size=5),
                        max_size=2,
                    )
                ),
            }
        elif kind == "call":
            task["call"] = "tests.sample_tasks:echo"
            task["args"] = draw(VALUES)
        else:
            task["sleep_s"] = draw(st.floats(0, 100, allow_nan=False))
        for field, strategy in (
            ("queue", st.sampled_from(["cpu", "gpu", "default"])),
            ("timeout_s", st.floats(0.5, 1e4)),
            ("num_retries", st.integers(0, 5)),
            ("retry", st.fixed_dictionaries({"backoff_s": st.floats(0, 10)})),
        ):
            if draw(st.booleans()):
                task[field] = draw(strategy)
        out.append(task)
    workflow: dict[str, Any] = {"name": draw(NAMES), "tasks": out}
    if draw(st.booleans()):
        workflow["params"] = draw(
            st.dictionaries(st.from_regex(r"[a-z]{1,5}", fullmatch=True), VALUES, max_size=3)
        )
    if draw(st.booleans()):
        workflow["max_parallelism"] = draw(st.integers(1, 10))
    if draw(st.booleans()):
        workflow["result_policy"] = draw(
            st.sampled_from(["all_sinks_succeed", "all_tasks_succeed"])
        )
    return workflow


def accepted(data: dict[str, Any]) -> WorkflowDefinition:
    try:
        return WorkflowDefinition.from_dict(data)
    except ValidationError:
        assume(False)
        raise


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tasks())
def test_a_definition_dumped_to_json_loads_again_to_the_same_definition(
    data: dict[str, Any],
) -> None:
    loaded = accepted(data)
    again = WorkflowDefinition.from_json(loaded.to_json())
    assert again == loaded
    assert again.to_json() == loaded.to_json()


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tasks())
def test_a_definition_dumped_to_yaml_loads_again_to_the_same_definition(
    data: dict[str, Any],
) -> None:
    loaded = accepted(data)
    assert WorkflowDefinition.from_yaml(loaded.to_yaml()) == loaded


@pytest.mark.parametrize(
    "path",
    [
        "examples/document_pipeline.yaml",
        "examples/document_pipeline.py",
        "examples/jobq_workflow.json",
        "examples/research_digest.yaml",
    ],
)
def test_files_of_the_repository_round_trip(path: str) -> None:
    loaded = WorkflowDefinition.from_file(ROOT / path)
    assert WorkflowDefinition.from_json(loaded.to_json(indent=2)) == loaded
    assert loaded.validate() is loaded


def test_validate_refuses_a_definition_built_by_hand_that_breaks_a_rule() -> None:
    loaded = WorkflowDefinition.from_dict({"name": "w", "tasks": [{"name": "a", "cmd": "true"}]})
    import msgspec

    broken_task = msgspec.structs.replace(loaded.tasks[0], depends_on=["nowhere"])
    broken = WorkflowDefinition(msgspec.structs.replace(loaded.definition, tasks=[broken_task]))
    with pytest.raises(ValidationError, match="nowhere"):
        broken.validate()


def test_invalid_json_is_refused_with_its_line() -> None:
    with pytest.raises(ValidationError, match=r"<json>: line 2, column 1: invalid JSON"):
        WorkflowDefinition.from_json('{"name": "w",\n}')


def test_to_dict_is_plain_data_json_can_encode() -> None:
    loaded = WorkflowDefinition.from_dict(
        {"name": "w", "tasks": [{"name": "a", "kwargs": {"cmd": "true", "env": {"A": "1"}}}]}
    )
    assert json.loads(json.dumps(loaded.to_dict())) == loaded.to_dict()
    assert loaded.name == "w" and [t.name for t in loaded.tasks] == ["a"]
