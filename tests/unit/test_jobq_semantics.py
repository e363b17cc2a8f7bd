"""ai4s-jobq semantics in the pure core, rule by rule, beside dagq's (docs/architecture.md §5).

A definition in ai4s-jobq's form (every task runs through ``kwargs``, no dagq-only
field) runs with ai4s-jobq's rules; ``semantics: jobq | dagq`` overrides the choice.
Each test drives the state machine by hand and asserts the task states and workflow
result ai4s-jobq's rules give (its state.py and condition.py, as the research notes
describe them), except where dagq deliberately does better (a chained condition across
a skipped task ends instead of hanging).
"""

from __future__ import annotations

from typing import Any

import pytest

from dagq.dispatching import task_message
from dagq.loading import load_data
from dagq.machine import Dispatch
from dagq.messages import decode_task
from dagq.plan import compile_plan, resolve_params
from tests.helpers import Sim

POLICIES: list[Any] = ["all", "any", "all_settled", 1]


def jobq(name: str, **fields: Any) -> dict[str, Any]:
    """A task in ai4s-jobq's form: a shell command in kwargs."""
    return {"name": name, "kwargs": {"cmd": "true"}, **fields}


def dagq(name: str, **fields: Any) -> dict[str, Any]:
    """The same task in dagq's own form (a top-level cmd)."""
    return {"name": name, "cmd": "true", **fields}


def history(sim: Sim, kind: str, task: str) -> list[str]:
    return [e.detail or "" for e in sim.history if e.kind == kind and e.task == task]


# --- which rule set applies -----------------------------------------------------------


def test_a_definition_in_jobq_form_runs_with_jobq_semantics() -> None:
    sim = Sim([jobq("a"), {"name": "b", "kwargs": {"url": "x"}, "depends_on": ["a"]}])
    assert sim.plan.jobq
    assert sim.plan.semantics == (
        "ai4s-jobq semantics: every task runs through kwargs and no dagq-only field is used"
    )
    assert all(t.spec.jobq for t in sim.plan.tasks)


def test_one_dagq_only_field_makes_it_dagq_and_says_which() -> None:
    sim = Sim([jobq("a"), dagq("b", depends_on=["a"])])
    assert not sim.plan.jobq
    assert sim.plan.semantics == "dagq semantics: task 'b' uses 'cmd' (a dagq-only field)"
    assert not any(t.spec.jobq for t in sim.plan.tasks)


def test_a_workflow_field_of_dagq_makes_it_dagq() -> None:
    sim = Sim([jobq("a")], deadline_s=60)
    assert sim.plan.semantics.startswith("dagq semantics: the workflow uses 'deadline_s'")


@pytest.mark.parametrize(("choice", "form"), [("jobq", dagq), ("dagq", jobq)])
def test_the_semantics_field_overrides_the_choice(choice: str, form: Any) -> None:
    sim = Sim([form("a")], semantics=choice)
    assert sim.plan.jobq == (choice == "jobq")
    assert sim.plan.semantics.endswith(f"the workflow sets 'semantics: {choice}'")


# --- rule 1: a skipped parent counts as done, for every dep_policy --------------------


@pytest.mark.parametrize("policy", POLICIES)
def test_jobq_children_of_a_skipped_task_run_under_every_policy(policy: Any) -> None:
    sim = Sim(
        [
            jobq("a"),
            jobq("b", depends_on=["a"], condition="inputs.a.go"),
            jobq("c", depends_on=["b"], dep_policy=policy),
            jobq("d", depends_on=["c"]),
        ]
    )
    sim.start()
    sim.finish("a", output={"go": False})
    assert sim.status("b") == "skipped"
    assert sim.status("c") == "ready"
    sim.finish("c")
    sim.finish("d")
    assert sim.statuses() == {"a": "completed", "b": "skipped", "c": "completed", "d": "completed"}
    assert sim.state.status == "completed"


@pytest.mark.parametrize("policy", POLICIES)
def test_dagq_children_of_only_skipped_parents_stay_skipped(policy: Any) -> None:
    sim = Sim(
        [
            dagq("a"),
            dagq("b", depends_on=["a"], condition="inputs.a.go"),
            dagq("c", depends_on=["b"], dep_policy=policy),
        ]
    )
    sim.start()
    sim.finish("a", output={"go": False})
    assert sim.statuses() == {"a": "completed", "b": "skipped", "c": "skipped"}


def test_jobq_any_runs_at_once_on_a_skipped_parent_while_another_still_runs() -> None:
    sim = Sim(
        [
            jobq("a"),
            jobq("slow"),
            jobq("b", depends_on=["a"], condition="inputs.a.go"),
            jobq("j", depends_on=["b", "slow"], dep_policy="any"),
        ]
    )
    sim.start()
    sim.finish("a", output={"go": False})
    assert (sim.status("b"), sim.status("slow"), sim.status("j")) == ("skipped", "ready", "ready")


def test_jobq_n_counts_skipped_parents_and_fails_upstream_only_when_n_is_out_of_reach() -> None:
    sim = Sim(
        [
            jobq("a"),
            jobq("b"),
            jobq("c"),
            jobq("s", depends_on=["a"], condition="inputs.a.go"),
            jobq("n", depends_on=["s", "b", "c"], dep_policy=2),
        ]
    )
    sim.start()
    sim.finish("a", output={"go": False})
    sim.finish("b", ok=False, error="boom")
    assert sim.status("n") == "pending"
    sim.finish("c", ok=False, error="boom")
    assert sim.status("n") == "upstream_failed"
    assert sim.state.status == "failed"


# --- rule 2: a condition that cannot be evaluated is false, and says why -------------


@pytest.mark.parametrize(
    ("condition", "output", "error"),
    [
        ("inputs.a.speed > 3", {"speed": "fast"}, "cannot compare string > int"),
        ("inputs.a.missing > 0", {"other": 1}, "cannot compare null > int"),
        ("inputs.a.x.y > 0", None, "cannot compare null > int"),
        ("all(inputs.a.flags)", {"flags": 3}, "all() needs a list"),
    ],
)
def test_jobq_condition_error_skips_the_task_and_records_the_reason(
    condition: str, output: Any, error: str
) -> None:
    sim = Sim(
        [jobq("a"), jobq("b", depends_on=["a"], condition=condition), jobq("c", depends_on=["b"])]
    )
    sim.start()
    sim.finish("a", output=output)
    assert sim.status("b") == "skipped"
    reason = sim.state.errors[sim.index("b")]
    assert reason.startswith("condition could not be evaluated (false under ai4s-jobq semantics)")
    assert error in reason
    (record,) = history(sim, "condition", "b")
    assert record.startswith(f"error: {error}")
    assert "it read inputs.a = " in record
    assert history(sim, "skipped", "b") == [reason]
    assert sim.status("c") == "ready"  # and the skip counts as done for the child
    sim.finish("c")
    assert sim.state.status == "completed"


def test_dagq_condition_error_fails_the_task_and_records_the_evaluation() -> None:
    sim = Sim([dagq("a"), dagq("b", depends_on=["a"], condition="inputs.a.speed > 3")])
    sim.start()
    sim.finish("a", output={"speed": "fast"})
    assert sim.status("b") == "failed"
    (record,) = history(sim, "condition", "b")
    assert record.startswith("error: cannot compare string > int")
    assert "it read inputs.a = {'speed': 'fast'}" in record
    assert sim.state.status == "failed"


@pytest.mark.parametrize("form", [jobq, dagq])
def test_every_condition_evaluation_records_expression_values_and_result(form: Any) -> None:
    sim = Sim(
        [
            form("a"),
            form("train model"),
            form(
                "yes",
                depends_on=["a", "train model"],
                condition='inputs["train model"].score > 0.5',
            ),
            form("no", depends_on=["a"], condition="inputs.a.ok == true"),
        ]
    )
    sim.start()
    sim.finish("a", output={"ok": None})
    sim.finish("train model", output={"score": 0.9})
    assert history(sim, "condition", "no") == [
        "'inputs.a.ok == true' is false; it read inputs.a = {'ok': null}"
    ]
    assert history(sim, "condition", "yes") == [
        """'inputs["train model"].score > 0.5' is true; it read """
        """inputs["train model"] = {'score': 0.9}"""
    ]
    assert (sim.status("yes"), sim.status("no")) == ("ready", "skipped")


def test_a_condition_over_a_large_output_records_it_shortened() -> None:
    sim = Sim([jobq("a"), jobq("b", depends_on=["a"], condition="inputs.a.ok")])
    sim.start()
    sim.finish("a", output={"ok": True, "rows": list(range(100_000))})
    (record,) = history(sim, "condition", "b")
    assert len(record) < 300
    assert "..." in record


# --- rule 3: a condition sees every direct parent ------------------------------------


def test_jobq_condition_sees_the_output_a_failed_parent_left() -> None:
    sim = Sim(
        [
            jobq("a", num_retries=1),
            jobq("b"),
            jobq(
                "c",
                depends_on=["a", "b"],
                dep_policy="all_settled",
                condition="inputs.a.partial == 7 and inputs.b.ok",
            ),
        ]
    )
    sim.start()
    sim.finish("a", ok=False, error="boom", output={"partial": 1})
    sim.finish("a", ok=False, error="boom again", output={"partial": 7})
    sim.finish("b", output={"ok": True})
    assert sim.status("a") == "failed"
    assert sim.state.outputs[sim.index("a")] == {"partial": 7}
    assert sim.status("c") == "ready"
    sim.finish("c")
    assert sim.statuses() == {"a": "failed", "b": "completed", "c": "completed"}
    assert sim.state.status == "completed"  # the only sink completed


def test_dagq_condition_does_not_see_a_failed_parent_or_keep_its_output() -> None:
    sim = Sim(
        [
            dagq("a"),
            dagq("b"),
            dagq(
                "c", depends_on=["a", "b"], dep_policy="all_settled", condition="inputs.a == null"
            ),
        ]
    )
    sim.start()
    sim.finish("a", ok=False, error="boom", output={"partial": 7})
    sim.finish("b")
    assert sim.index("a") not in sim.state.outputs
    assert sim.status("c") == "ready"


def test_jobq_condition_reads_a_failed_parents_output_stored_by_reference() -> None:
    sim = Sim([jobq("a"), jobq("c", depends_on=["a"], dep_policy="any", condition="inputs.a.big")])
    sim.start()
    sim.state.resolved["outputs/a"] = {"big": True}
    sim.finish("a", ok=False, error="boom", output_ref="outputs/a")
    assert sim.state.output_refs[sim.index("a")] == "outputs/a"
    assert sim.status("c") == "upstream_failed"  # any: no parent completed


def test_jobq_glob_aggregate_over_a_failed_parent_uses_its_output() -> None:
    sim = Sim(
        [
            jobq("train-a"),
            jobq("train-b"),
            jobq("train-c"),
            jobq(
                "deploy",
                depends_on=["train-a", "train-b", "train-c"],
                dep_policy="all_settled",
                condition='count(inputs["train-*"].ok) >= 2 and any(inputs["train-*"].ok == false)',
            ),
        ]
    )
    sim.start()
    sim.finish("train-a", output={"ok": True})
    sim.finish("train-b", ok=False, error="diverged", output={"ok": False})
    sim.finish("train-c", output={"ok": True})
    assert sim.status("deploy") == "ready"
    (record,) = history(sim, "condition", "deploy")
    assert "inputs.train-b" not in record and "inputs[\"train-b\"] = {'ok': false}" in record


def test_jobq_glob_aggregate_sees_a_failed_parent_without_output_as_null() -> None:
    sim = Sim(
        [
            jobq("train-a"),
            jobq("train-b"),
            jobq(
                "deploy",
                depends_on=["train-a", "train-b"],
                dep_policy="all_settled",
                condition='all(inputs["train-*"].ok)',
            ),
        ]
    )
    sim.start()
    sim.finish("train-a", output={"ok": True})
    sim.finish("train-b", ok=False, error="boom")
    assert sim.status("deploy") == "skipped"
    assert sim.state.status == "completed"  # ai4s-jobq: a skipped sink is not a failure


def test_jobq_n_policy_condition_sees_unfinished_parents_as_null() -> None:
    sim = Sim(
        [
            jobq("a"),
            jobq("b"),
            jobq("c"),
            jobq(
                "best",
                depends_on=["a", "b", "c"],
                dep_policy=2,
                condition="inputs.c == null and inputs.a.ok and inputs.b.ok",
            ),
        ]
    )
    sim.start()
    sim.finish("a", output={"ok": True})
    sim.finish("b", output={"ok": True})
    assert sim.status("best") == "ready"
    (record,) = history(sim, "condition", "best")
    assert "inputs.c = null" in record


def test_jobq_n_policy_comparison_on_an_unfinished_parent_is_false() -> None:
    """ai4s-jobq's own behaviour: ``None < 0.01`` raises, so the condition is false."""
    sim = Sim(
        [
            jobq("a"),
            jobq("b"),
            jobq("c"),
            jobq(
                "best",
                depends_on=["a", "b", "c"],
                dep_policy=2,
                condition="almost_all(inputs.*.loss < 0.01, 1)",
            ),
        ]
    )
    sim.start()
    sim.finish("a", output={"loss": 0.001})
    sim.finish("b", output={"loss": 0.002})
    assert sim.status("best") == "skipped"
    assert "cannot compare null < float" in sim.state.errors[sim.index("best")]


def test_chained_conditions_across_a_skipped_task_settle_instead_of_hanging() -> None:
    sim = Sim(
        [
            jobq("a"),
            jobq("b", depends_on=["a"], condition="inputs.a.go"),
            jobq("c", depends_on=["b"], condition="inputs.b.score > 1"),
            jobq("d", depends_on=["b"], condition="inputs.b == null"),
            jobq("e", depends_on=["c", "d"]),
        ]
    )
    sim.start()
    sim.finish("a", output={"go": False})
    assert sim.statuses() == {
        "a": "completed",
        "b": "skipped",
        "c": "skipped",  # None > 1 cannot be evaluated: false
        "d": "ready",
        "e": "pending",
    }
    sim.finish("d")
    sim.finish("e")
    assert sim.status("e") == "completed"
    assert sim.state.status == "completed"


def test_jobq_task_message_inputs_name_every_direct_parent() -> None:
    sim = Sim(
        [
            jobq("done"),
            jobq("broke"),
            jobq("quiet"),
            jobq("later"),
            jobq("s", depends_on=["done"], condition="inputs.done.go"),
            jobq("j", depends_on=["done", "broke", "quiet", "later", "s"], dep_policy=2),
        ]
    )
    sim.start()
    sim.finish("broke", ok=False, error="x", output={"partial": 1})
    sim.finish("quiet", ok=False, error="x")
    sim.finish("done", output={"go": False})
    assert (sim.status("s"), sim.status("j")) == ("skipped", "ready")
    message = task_message(sim.plan, sim.state, Dispatch(sim.index("j"), 1))
    inputs = decode_task(bytes(message.message.body)).inputs
    assert inputs == {
        "done": {"go": False},
        "broke": {"partial": 1},
        "quiet": None,
        "later": None,
        "s": None,
    }


def test_dagq_task_message_inputs_hold_only_completed_parents() -> None:
    sim = Sim(
        [
            dagq("done"),
            dagq("broke"),
            dagq("j", depends_on=["done", "broke"], dep_policy="all_settled"),
        ]
    )
    sim.start()
    sim.finish("done", output={"x": 1})
    sim.finish("broke", ok=False, error="x", output={"partial": 1})
    message = task_message(sim.plan, sim.state, Dispatch(sim.index("j"), 1))
    assert decode_task(bytes(message.message.body)).inputs == {"done": {"x": 1}}


# --- rule 4: invalid output JSON completes the task, with a warning ------------------


def test_a_finished_attempt_with_a_warning_completes_and_records_it() -> None:
    sim = Sim([jobq("a"), jobq("b", depends_on=["a"])])
    sim.start()
    warning = "the output file $JOBQ_OUTPUT_FILE is not JSON: Expecting value; no output kept"
    sim.finish("a", warning=warning)
    assert sim.status("a") == "completed"
    assert sim.index("a") not in sim.state.outputs
    assert [(e.kind, e.attempt, e.detail) for e in sim.history if e.task == "a"][-2:] == [
        ("warning", 1, warning),
        ("completed", 1, None),
    ]
    assert sim.status("b") == "ready"


# --- retries stay N + 1 attempts ------------------------------------------------------


def test_jobq_num_retries_n_allows_n_plus_one_attempts() -> None:
    sim = Sim([jobq("a", num_retries=2)])
    assert sim.plan.tasks[0].max_attempts == 3
    sim.start()
    for _ in range(3):
        sim.finish("a", ok=False, error="boom")
    assert [d for d in sim.dispatched if d[0] == "a"] == [
        ("a", 1, 0.0),
        ("a", 2, pytest.approx(1.0, rel=0.2)),
        ("a", 3, pytest.approx(2.0, rel=0.2)),
    ]
    assert sim.status("a") == "failed"


# --- the plan: what workers are told ---------------------------------------------------


def plan_of(tasks: list[dict[str, Any]], **workflow: Any) -> Any:
    definition = load_data({"name": "w", "tasks": tasks, **workflow}, source="test")
    return compile_plan(definition, resolve_params(definition, {}))


def test_kwargs_without_cmd_compile_to_a_processor_task() -> None:
    plan = plan_of([{"name": "a", "kwargs": {"url": "https://x", "n": 2}}, {"name": "b"}])
    a, b = (t.spec for t in plan.tasks)
    assert (a.kind, a.args, a.jobq) == ("processor", {"url": "https://x", "n": 2}, True)
    assert (b.kind, b.args) == ("processor", {})


def test_shell_kwargs_compile_as_ai4s_jobq_reads_them() -> None:
    plan = plan_of(
        [
            {
                "name": "a",
                "kwargs": {
                    "cmd": "echo {{ not a template }} $N",
                    "env": {"N": 5, "F": True, "X": 0.5, "Z": None, "S": "s", "L": [1, "a"]},
                    "cwd": "work",
                    "bg_dirsync_to": "/mnt/out",
                    "extra": 1,
                },
                "timeout_s": 0,
            }
        ],
        default_task_timeout_s=30,
    )
    spec = plan.tasks[0].spec
    assert spec.kind == "shell"
    assert spec.cmd == "echo {{ not a template }} $N"  # verbatim under ai4s-jobq semantics
    assert spec.env == {"N": "5", "F": "True", "X": "0.5", "Z": "None", "S": "s", "L": '[1,"a"]'}
    assert (spec.cwd, spec.dirsync_to, spec.timeout_s) == ("work", "/mnt/out", None)
    assert plan.tasks[0].timeout_s is None


def test_shell_kwargs_under_dagq_semantics_are_templates() -> None:
    plan = plan_of(
        [{"name": "a", "kwargs": {"cmd": "echo {{ params.n }}", "env": {"N": "{{ params.n }}"}}}],
        params={"n": 3},
    )
    spec = plan.tasks[0].spec
    assert (plan.jobq, spec.cmd, spec.env, spec.jobq) == (False, "echo 3", {"N": "3"}, False)


@pytest.mark.parametrize(
    ("timeouts", "expected"),
    [
        ({"timeout_s": 0}, None),
        ({"timeout_s": 0, "default_task_timeout_s": 9}, None),
        ({"default_task_timeout_s": 0}, None),
        ({"default_task_timeout_s": 9}, 9),
        ({"timeout_s": None, "default_task_timeout_s": 9}, 9),
    ],
)
def test_timeout_zero_means_no_timeout(timeouts: dict[str, Any], expected: Any) -> None:
    task = {"name": "a", "kwargs": {"cmd": "x"}}
    if "timeout_s" in timeouts:
        task["timeout_s"] = timeouts.pop("timeout_s")
    plan = plan_of([task], **timeouts)
    assert (plan.tasks[0].timeout_s, plan.tasks[0].spec.timeout_s) == (expected, expected)


def test_a_parent_listed_twice_counts_once() -> None:
    sim = Sim([jobq("a"), jobq("b"), jobq("c", depends_on=["a", "a", "b"], dep_policy=2)])
    assert sim.plan.tasks[2].parents == (0, 1)
    assert sim.plan.tasks[0].children == (2,)
    sim.start()
    sim.finish("a")
    assert sim.status("c") == "pending"
    sim.finish("b")
    assert sim.status("c") == "ready"
