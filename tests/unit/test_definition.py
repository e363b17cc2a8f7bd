"""Loading and validating definitions: the format, and errors that say what to fix."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import msgspec
import pytest

from dagq.builder import Workflow, load_python_file
from dagq.definition import json_schema
from dagq.errors import ValidationError
from dagq.loading import load_data, load_file, load_text
from dagq.plan import compile_plan, parse_param, resolve_params
from dagq.submitted import Submitted, decode_submitted

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def error(text: str) -> str:
    with pytest.raises(ValidationError) as caught:
        load_text(text, source="wf.yaml")
    return str(caught.value)


def test_malformed_yaml_names_the_line() -> None:
    assert error("name: x\ntasks:\n  - name: a\n   cmd: [oops\n").startswith("wf.yaml: line ")


def test_unknown_field_names_task_line_and_suggestion() -> None:
    message = error("name: x\ntasks:\n  - name: a\n    cmd: 'true'\n    dep_polcy: any\n")
    assert message == (
        "wf.yaml: line 5: tasks[0] 'a'.dep_polcy: unknown task field 'dep_polcy' "
        "(did you mean 'dep_policy'?)"
    )


def test_reserved_fields_say_they_come_later() -> None:
    assert "'priority' is not supported by this version" in error(
        "name: x\ntasks:\n  - {name: a, cmd: 'true', priority: 5}\n"
    )


def test_wrong_type_names_the_field() -> None:
    message = error("name: x\ntasks:\n  - {name: a, cmd: 'true', num_retries: lots}\n")
    assert (
        message
        == "wf.yaml: line 3: tasks[0] 'a'.num_retries: expected an integer or null, got a string"
    )


@pytest.mark.parametrize(
    ("tasks", "expected"),
    [
        ("[{name: a, cmd: x}, {name: a, cmd: y}]", "duplicate task name 'a'"),
        ("[{name: a, cmd: x, depends_on: [b]}]", "task 'a': depends_on: no task is named 'b'"),
        ("[{name: a, cmd: x, depends_on: [a]}]", "cannot depend on itself"),
        (
            "[{name: a, cmd: x, depends_on: [c]}, {name: b, cmd: x, depends_on: [a]},"
            " {name: c, cmd: x, depends_on: [b]}]",
            "dependency cycle: ",
        ),
        ("[{name: a, cmd: x, dep_policy: some}]", "dep_policy"),
        (
            "[{name: a, cmd: x}, {name: b, cmd: x, depends_on: [a], dep_policy: 2}]",
            "only 1 in depends_on",
        ),
        (
            "[{name: a, cmd: x}, {name: b, cmd: x, depends_on: [a], condition: 'inputs.a.x >'}]",
            "condition",
        ),
        (
            "[{name: a, cmd: x}, {name: b, cmd: x},"
            " {name: c, cmd: x, depends_on: [a], condition: inputs.b.ok}]",
            "refers to inputs of 'b', which is not a parent",
        ),
        ("[{name: a, kwargs: {cmd: ' '}}]", "kwargs.cmd: the command is empty"),
        ("[{name: a, cmd: x, call: 'm:f'}]", "give only one of cmd / call"),
        ("[{name: a, cmd: 'echo {{ inputs.b.x }}'}]", "pastes an upstream output into a command"),
        ("[{name: a, cmd: 'echo {{ params.nope }}'}]", "params.nope, which is not declared"),
        ("[{name: '../etc', cmd: x}]", "not a valid task name"),
        ("[{name: a, cmd: x, queue: 'no spaces'}]", "not a valid queue name"),
        ("[]", "needs at least one task"),
    ],
)
def test_semantic_errors_name_the_task_and_field(tasks: str, expected: str) -> None:
    assert expected in error(f"name: x\ntasks: {tasks}\n")


def test_cycle_error_names_the_cycle_in_order() -> None:
    message = error(
        "name: x\ntasks:\n  - {name: a, cmd: x, depends_on: [c]}\n"
        "  - {name: b, cmd: x, depends_on: [a]}\n  - {name: c, cmd: x, depends_on: [b]}\n"
    )
    assert message.endswith("dependency cycle: a -> b -> c -> a")


def test_params_are_resolved_with_overrides_and_unknown_ones_refused() -> None:
    d = load_text(
        "name: x\nparams: {n: 1, m: two}\ntasks: [{name: a, cmd: 'echo {{ params.n }}'}]\n"
    )
    assert resolve_params(d, {"n": 5}) == {"n": 5, "m": "two"}
    with pytest.raises(ValidationError, match="unknown param 'z'"):
        resolve_params(d, {"z": 1})


def test_cli_params_of_untyped_params_parse_as_json_when_they_can() -> None:
    d = load_text("name: x\nparams: {n: null, name: null, flags: null}\ntasks: [{name: a}]\n")
    given = dict(parse_param(p) for p in ("n=5", "name=x y", "flags=[1,2]"))
    assert resolve_params(d, given) == {"n": 5, "name": "x y", "flags": [1, 2]}
    with pytest.raises(ValidationError, match="expected key=value"):
        parse_param("n")


def test_params_are_shell_quoted_in_commands() -> None:
    d = load_text("name: x\nparams: {f: a}\ntasks: [{name: a, cmd: 'cat {{ params.f }}'}]\n")
    plan = compile_plan(d, resolve_params(d, {"f": "x; rm -rf /"}))
    assert plan.tasks[0].spec.cmd == "cat 'x; rm -rf /'"


def test_settings_fall_back_from_task_to_defaults_to_workflow() -> None:
    d = load_text(
        "name: x\ndefault_queue: cpu\ndefault_task_timeout_s: 9\n"
        "defaults: {num_retries: 3, queue: gpu}\n"
        "tasks: [{name: a, cmd: x}, {name: b, cmd: x, queue: io, num_retries: 0, timeout_s: 1}]\n"
    )
    a, b = compile_plan(d, {}).tasks
    assert (a.queue, a.max_attempts, a.timeout_s) == ("gpu", 4, 9)
    assert (b.queue, b.max_attempts, b.timeout_s) == ("io", 1, 1)


def test_every_example_file_loads() -> None:
    for path in EXAMPLES.glob("*.y*ml"):
        load_file(path)
    load_file(EXAMPLES / "jobq_workflow.json")


def test_python_builder_builds_the_same_definition_as_the_yaml() -> None:
    built = load_python_file(EXAMPLES / "document_pipeline.py")
    assert built == load_file(EXAMPLES / "document_pipeline.yaml")


def second() -> int:
    return 1


def test_builder_decorator_registers_an_importable_call() -> None:
    wf = Workflow("w")
    first = wf.shell("first", "echo hi")
    wf.task(depends_on=[first], num_retries=1)(second)
    wf.call("third", "pkg.mod:fn", depends_on=[second], args={"x": 1})
    d = wf.to_definition()
    assert d.tasks[1].call == f"{__name__}:second"
    assert [t.depends_on for t in d.tasks] == [(), ("first",), ("second",)]


def test_builder_refuses_functions_a_worker_cannot_import() -> None:
    wf = Workflow("w")

    def local() -> None:
        return None

    with pytest.raises(ValidationError, match="cannot be imported by a worker"):
        wf.call("x", local)


def test_builder_rejects_unknown_options() -> None:
    with pytest.raises(ValidationError, match="unknown option"):
        Workflow("w").shell("a", "true", retries=3)


def test_json_schema_describes_the_format() -> None:
    schema = json_schema()
    task = schema["$defs"]["TaskDef"]
    assert task["additionalProperties"] is False
    assert {"name", "depends_on", "dep_policy", "condition", "kwargs", "call"} <= set(
        task["properties"]
    )


def _document(workflow: Any, /, **fields: Any) -> bytes:
    submitted = Submitted(
        workflow_id="w",
        definition=workflow,
        params={"n": 1},
        created_at=1.0,
        fingerprint="f",
        tenant="t",
    )
    data = msgspec.to_builtins(submitted)
    data.update(fields)
    return msgspec.json.encode(data)


def test_a_definition_decoded_task_by_task_equals_one_decoded_whole() -> None:
    for example in sorted(EXAMPLES.glob("*.yaml")):
        data = _document(load_file(example))
        assert decode_submitted(data) == msgspec.json.decode(data, type=Submitted), example


@pytest.mark.parametrize(
    "damage",
    [
        {"fingerprint": None},
        {"created_at": "yesterday"},
        {"definition": {"name": "x", "tasks": [{"name": "a", "cmd": "true", "oops": 1}]}},
        {"definition": {"name": "x", "tasks": [{"name": 7, "cmd": "true"}]}},
        {"definition": {"name": "", "tasks": []}},
        {"definition": {"name": "x", "tasks": "none"}},
    ],
)
def test_a_definition_decoded_task_by_task_refuses_what_one_decoded_whole_does(
    damage: dict[str, Any],
) -> None:
    data = _document(load_text("name: x\ntasks:\n  - name: a\n    cmd: 'true'\n"), **damage)
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(data, type=Submitted)
    with pytest.raises(msgspec.ValidationError):
        decode_submitted(data)
    with pytest.raises(msgspec.DecodeError):
        decode_submitted(data[:-1])


def test_a_definition_and_its_plan_are_out_of_the_garbage_collectors_sight() -> None:
    tasks = [{"name": f"t{i}", "call": "m:f", "depends_on": ["t0"] if i else []} for i in range(50)]
    definition = load_data({"name": "x", "tasks": tasks}, source="x")
    plan = compile_plan(definition, {})
    assert not any(gc.is_tracked(t) for t in definition.tasks)
    assert not any(gc.is_tracked(t) or gc.is_tracked(t.spec) for t in plan.tasks)


def test_tasks_with_the_same_parents_share_one_tuple_of_them() -> None:
    tasks = [{"name": "root", "cmd": "true"}]
    tasks += [{"name": f"t{i}", "cmd": "true", "depends_on": ["root"]} for i in range(5)]
    plan = compile_plan(load_data({"name": "x", "tasks": tasks}, source="x"), {})
    assert len({id(t.parents) for t in plan.tasks[1:]}) == 1
    assert plan.tasks[1].parents == (0,) and plan.tasks[0].children == (1, 2, 3, 4, 5)
