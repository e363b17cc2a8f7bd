"""ai4s-jobq's own workflow files load unchanged, and run under ai4s-jobq semantics.

The files are in tests/fixtures/jobq/ (its README says where each came from). The
definition format accepts what ai4s-jobq's tooling writes: a free ``kwargs`` mapping,
explicit nulls, ``$schema``, names with spaces, a parent listed twice, ``timeout_s: 0``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dagq import keys
from dagq.definition import json_schema, rule_set
from dagq.dispatching import task_message
from dagq.errors import ValidationError
from dagq.expression import parse
from dagq.loading import load_data, load_file, load_text
from dagq.machine import Dispatch
from dagq.messages import decode_task
from dagq.plan import compile_plan
from dagq.validation import NAME_PATTERN, warnings
from tests.helpers import Sim

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "jobq"
FILES = sorted(
    p for p in FIXTURES.rglob("*") if p.suffix in (".json", ".yaml") and ".REFUSED." not in p.name
)
REFUSED = sorted(FIXTURES.rglob("*.REFUSED.*"))


def test_the_fixtures_are_there() -> None:
    assert len(FILES) >= 40 and len(REFUSED) == 2


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_every_ai4s_jobq_file_loads_and_runs_with_jobq_semantics(path: Path) -> None:
    definition = load_file(path)
    plan = compile_plan(definition, {})
    assert rule_set(definition).jobq
    assert plan.jobq and all(t.spec.jobq for t in plan.tasks)


@pytest.mark.parametrize(
    ("name", "complaint"),
    [
        ("cli_invalid_duplicate.REFUSED.yaml", "duplicate task name 'dup'"),
        ("entities_max_parallelism_zero.REFUSED.json", "max_parallelism"),
    ],
)
def test_the_files_ai4s_jobq_refuses_are_refused(name: str, complaint: str) -> None:
    with pytest.raises(ValidationError, match=complaint):
        load_file(FIXTURES / "tests-derived" / name)


def test_the_tutorials_retry_pipeline_compiles_to_processor_tasks() -> None:
    plan = compile_plan(load_file(FIXTURES / "docs" / "tutorial-resilient-pipeline.yaml"), {})
    download, train = plan.tasks
    assert (download.spec.kind, download.spec.args) == (
        "processor",
        {"url": "https://example.com/data.tar.gz"},
    )
    assert download.max_attempts == 4  # num_retries: 3 is 3 retries after the first
    assert (train.spec.kind, train.spec.args, train.parents) == ("processor", {}, (0,))


def test_the_round_trip_form_with_explicit_nulls_compiles_like_the_short_form() -> None:
    plan = compile_plan(load_file(FIXTURES / "tests-derived" / "entities_roundtrip.json"), {})
    a, b = plan.tasks
    assert (a.queue, a.timeout_s, a.max_attempts, a.spec.args) == ("cpu", 600, 4, {"x": 1})
    assert (b.queue, b.timeout_s, b.max_attempts, b.spec.args) == ("gpu", 7200, 1, {})


def test_the_stress_generators_fail_probability_is_passed_to_the_processor() -> None:
    plan = compile_plan(load_file(FIXTURES / "stress" / "wf-00004.json"), {})
    flaky = [t.spec.args for t in plan.tasks if "fail_probability" in (t.spec.args or {})]
    assert flaky and all(set(args) == {"sleep_s", "fail_probability"} for args in flaky)


# --- the format -----------------------------------------------------------------------

SCHEMA_URL = "https://raw.githubusercontent.com/microsoft/ai4s-jobq/main/x.schema.json"


def test_schema_line_is_accepted_in_json_and_yaml_and_in_dagqs_own_schema() -> None:
    text = json.dumps({"$schema": SCHEMA_URL, "name": "w", "tasks": [{"name": "a"}]})
    assert load_text(text, source="w.json").schema_url == SCHEMA_URL
    assert load_text(f"$schema: {SCHEMA_URL}\nname: w\ntasks: [{{name: a}}]\n").name == "w"
    assert "$schema" in json_schema()["$defs"]["WorkflowDef"]["properties"]


def test_semantics_accepts_only_jobq_or_dagq() -> None:
    with pytest.raises(
        ValidationError, match=r"semantics: Invalid enum value 'airflow' \(use jobq"
    ):
        load_text("name: w\nsemantics: airflow\ntasks: [{name: a}]\n")


@pytest.mark.parametrize(
    "name",
    ["train model", "prep/featurize", "étape 1", 'say "hi"', "x.y:z@w+v=u", "_1 (retry)"],
)
def test_task_names_may_be_as_free_as_in_ai4s_jobq(name: str) -> None:
    sim = Sim(
        [
            {"name": name, "kwargs": {"cmd": "true"}},
            {
                "name": "next",
                "kwargs": {"cmd": "true"},
                "depends_on": [name],
                "condition": f"inputs[{json.dumps(name)}].ok",
            },
        ]
    )
    sim.start()
    message = task_message(sim.plan, sim.state, Dispatch(0, 1))
    assert message.message.id == f"wf-1/{name}/1"
    assert decode_task(bytes(message.message.body)).idempotency_key == f"wf-1/{name}"
    sim.finish(name, output={"ok": True})
    assert sim.status("next") == "ready"


@pytest.mark.parametrize(
    "name",
    ["x[0]", "charge#undo", "a]", "tab\there", "new\nline", "nul\x00", " lead", "trail ", "-x"],
)
def test_names_that_would_be_unsafe_are_refused(name: str) -> None:
    assert not NAME_PATTERN.match(name) or not name.isprintable()
    with pytest.raises(ValidationError, match="is not a valid task name"):
        load_data({"name": "w", "tasks": [{"name": name}]})


def test_a_condition_may_name_a_parent_with_spaces_by_subscript() -> None:
    expr = parse('inputs["train model"].score > 0.5', names=frozenset({"inputs"}))
    assert expr.evaluate({"inputs": {"train model": {"score": 0.9}}}) is True


def test_a_parent_listed_twice_is_a_warning_not_an_error() -> None:
    definition = load_data(
        {"name": "w", "tasks": [{"name": "a"}, {"name": "b", "depends_on": ["a", "a"]}]}
    )
    assert warnings(definition) == ["task 'b': depends_on: 'a' is listed twice; it counts once"]
    assert compile_plan(definition, {}).tasks[1].parents == (0,)


def test_extra_kwargs_of_a_shell_task_and_null_env_values_are_warnings() -> None:
    definition = load_data(
        {
            "name": "w",
            "tasks": [
                {"name": "a", "kwargs": {"cmd": "x", "epochs": 5, "lr": 0.1, "env": {"Z": None}}},
                {"name": "p", "kwargs": {"epochs": 5}},  # a processor task takes any kwargs
            ],
        }
    )
    assert warnings(definition) == [
        "task 'a': kwargs.epochs, kwargs.lr are ignored: a shell task uses only cmd, env, cwd "
        "and bg_dirsync_to (a task whose kwargs have no 'cmd' runs on a processor)",
        "task 'a': kwargs.env.Z is null: it is set to the text 'None', as ai4s-jobq does",
    ]


@pytest.mark.parametrize(
    ("kwargs", "complaint"),
    [
        ({"cmd": 5}, "kwargs.cmd: expected a command (a string, or a list of strings), got int"),
        ({"cmd": ""}, "kwargs.cmd: the command is empty"),
        ({"cmd": []}, "kwargs.cmd: an empty argument list runs nothing"),
        ({"cmd": "x", "env": ["A=1"]}, "kwargs.env: expected a mapping"),
        ({"cmd": "x", "env": {"A=B": "1"}}, "'A=B' is not an environment variable name"),
        ({"cmd": "x", "env": {1: "1"}}, "'1' is not an environment variable name"),
        ({"cmd": "x", "cwd": 3}, "kwargs.cwd: expected a path"),
        ({"cmd": "x", "bg_dirsync_to": ""}, "kwargs.bg_dirsync_to: expected a path"),
    ],
)
def test_shell_kwargs_of_the_wrong_type_are_refused_naming_the_field(
    kwargs: dict[str, Any], complaint: str
) -> None:
    with pytest.raises(ValidationError, match=r"task 'a': ") as raised:
        load_data({"name": "w", "tasks": [{"name": "a", "kwargs": kwargs}]})
    assert complaint in str(raised.value)


def test_a_name_with_glob_characters_is_accepted_but_read_only_through_a_glob() -> None:
    tasks: list[dict[str, Any]] = [{"name": "a*b?"}, {"name": "c", "depends_on": ["a*b?"]}]
    load_data({"name": "w", "tasks": [*tasks[:1], {**tasks[1], "condition": 'all(inputs["a*"])'}]})
    with pytest.raises(ValidationError, match="a glob over inputs is only allowed inside"):
        load_data({"name": "w", "tasks": [*tasks[:1], {**tasks[1], "condition": 'inputs["a*b?"]'}]})


def test_kwargs_null_is_no_kwargs() -> None:
    plan = compile_plan(load_data({"name": "w", "tasks": [{"name": "a", "kwargs": None}]}), {})
    assert (plan.tasks[0].spec.kind, plan.tasks[0].spec.args) == ("processor", {})


def test_kwargs_must_be_a_mapping_and_not_beside_another_way_to_run() -> None:
    with pytest.raises(ValidationError, match="kwargs"):
        load_data({"name": "w", "tasks": [{"name": "a", "kwargs": ["x"]}]})
    with pytest.raises(ValidationError, match="give only one of kwargs / call"):
        load_data({"name": "w", "tasks": [{"name": "a", "kwargs": {}, "call": "m:f"}]})


def test_a_negative_timeout_is_refused() -> None:
    with pytest.raises(ValidationError, match="timeout_s"):
        load_data({"name": "w", "tasks": [{"name": "a", "timeout_s": -1}]})


def test_jobq_kwargs_are_not_templates_so_braces_in_a_command_are_kept() -> None:
    definition = load_data(
        {"name": "w", "tasks": [{"name": "a", "kwargs": {"cmd": "echo {{ x }} ${HOME}"}}]}
    )
    assert compile_plan(definition, {}).tasks[0].spec.cmd == "echo {{ x }} ${HOME}"


def test_message_ids_of_spaced_names_stay_unambiguous() -> None:
    assert keys.message_id("wf", keys.attempt_name("train model", item=2), 3) == (
        "wf/train model[2]/3"
    )


def test_a_workflow_built_in_python_keeps_dagqs_rules_even_in_jobqs_form() -> None:
    from dagq.builder import Workflow

    flow = Workflow("py")
    first = flow.shell("a", "true", env={"X": "1"})
    flow.shell("b", "true", cwd="/tmp", depends_on=[first])
    assert rule_set(flow.to_definition()).describe() == (
        "dagq semantics: the workflow sets 'semantics: dagq'"
    )
