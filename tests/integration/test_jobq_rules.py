"""ai4s-jobq's rules, end to end: probe workflows in ai4s-jobq's form run with ``dagq run``
(shell tasks that write their output to ``$JOBQ_OUTPUT_FILE``), each asserting the task
states and the workflow result ai4s-jobq's rules give; one in dagq's form beside them
shows dagq's rules still hold for dagq-native files.

The probes run side by side (one ``dagq run`` process each) once for the module.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.cli_harness import DagqCli, Finished, wait_for_file

POLICIES: list[Any] = ["all", "any", "all_settled", 1]


def writes(output: Any) -> str:
    """A shell command that leaves ``output`` as the task's output, ai4s-jobq's way."""
    return f"echo '{json.dumps(output)}' > \"$JOBQ_OUTPUT_FILE\""


def task(name: str, cmd: str = "true", **fields: Any) -> dict[str, Any]:
    return {"name": name, "kwargs": {"cmd": cmd}, **fields}


def skip_cascade(policy: Any) -> dict[str, Any]:
    return {
        "name": f"skip-cascade-{policy}",
        "tasks": [
            task("a", writes({"go": False})),
            task("b", depends_on=["a"], condition="inputs.a.go"),
            task("c", depends_on=["b"], dep_policy=policy),
            task("d", depends_on=["c"]),
        ],
    }


PROBES: dict[str, dict[str, Any]] = {
    **{f"skip-{policy}": skip_cascade(policy) for policy in POLICIES},
    "dagq-skip": {
        "name": "dagq-skip-cascade",
        "tasks": [
            {"name": "a", "cmd": writes({"go": False})},
            {"name": "b", "cmd": "true", "depends_on": ["a"], "condition": "inputs.a.go"},
            {"name": "c", "cmd": "true", "depends_on": ["b"]},
        ],
    },
    "errors": {
        "name": "condition-errors",
        "tasks": [
            task("a", writes({"speed": "fast", "n": None})),
            task("mismatch", depends_on=["a"], condition="inputs.a.speed > 3"),
            task("missing", depends_on=["a"], condition="inputs.a.nope.deeper > 0"),
            task("none", depends_on=["a"], condition="inputs.a.n < 1"),
            task("no glob", depends_on=["a"], condition="all(inputs.a.speed)"),
            task("after", depends_on=["mismatch", "missing", "none", "no glob"]),
        ],
    },
    "glob": {
        "name": "glob-over-a-failed-parent",
        "tasks": [
            task("train-a", writes({"ok": True})),
            task("train-b", "exit 3"),
            task(
                "deploy",
                depends_on=["train-a", "train-b"],
                dep_policy="all_settled",
                condition='all(inputs["train-*"].ok)',
            ),
            task(
                "report",
                depends_on=["train-a", "train-b"],
                dep_policy="all_settled",
                condition='count(inputs["train-*"].ok) == 1 and inputs["train-b"] == null',
            ),
        ],
    },
    "chain": {
        "name": "chained-conditions",
        "tasks": [
            task("a", writes({"go": False})),
            task("b", depends_on=["a"], condition="inputs.a.go"),
            task("c", depends_on=["b"], condition="inputs.b.score > 1"),
            task("d", depends_on=["b"], condition="inputs.b == null"),
            task("e", depends_on=["c", "d"]),
        ],
    },
    "n-of": {
        "name": "n-of-with-one-unfinished",
        "tasks": [
            task("a", writes({"loss": 0.001})),
            task("b", writes({"loss": 0.002})),
            task("c", f"{wait_for_file('release')}; " + writes({"loss": 0.003})),
            task(
                "best",
                "touch release",
                depends_on=["a", "b", "c"],
                dep_policy=2,
                condition="inputs.c == null and inputs.a.loss < 0.01 and inputs.b.loss < 0.01",
            ),
            task(
                "strict",
                depends_on=["a", "b", "c"],
                dep_policy=2,
                condition="almost_all(inputs.*.loss < 0.01, 1)",
            ),
        ],
    },
}


@pytest.fixture(scope="module")
def probes(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[DagqCli, dict[str, Finished]]]:
    with DagqCli(tmp_path_factory.mktemp("jobq-rules")) as cli:
        commands = {
            key: ["run", str(cli.workflow(f"{key}.yaml", data)), "--id", key, "--quiet"]
            for key, data in PROBES.items()
        }
        yield cli, cli.run_many(commands, timeout_s=120)


def result(probes: tuple[DagqCli, dict[str, Finished]], key: str) -> tuple[DagqCli, Finished]:
    cli, results = probes
    return cli, results[key]


@pytest.mark.parametrize("policy", POLICIES)
def test_children_of_a_skipped_task_run_under_every_dep_policy(
    probes: tuple[DagqCli, dict[str, Finished]], policy: Any
) -> None:
    cli, run = result(probes, f"skip-{policy}")
    assert run.code == 0, run.output
    assert cli.statuses(f"skip-{policy}") == {
        "a": "completed",
        "b": "skipped",
        "c": "completed",
        "d": "completed",
    }


def test_a_dagq_native_file_keeps_dagqs_skip_rule(
    probes: tuple[DagqCli, dict[str, Finished]],
) -> None:
    cli, run = result(probes, "dagq-skip")
    assert run.code == 0, run.output
    assert cli.statuses("dagq-skip") == {"a": "completed", "b": "skipped", "c": "skipped"}


def test_conditions_that_cannot_be_evaluated_skip_their_task_and_say_why(
    probes: tuple[DagqCli, dict[str, Finished]],
) -> None:
    cli, run = result(probes, "errors")
    assert run.code == 0, run.output
    assert cli.statuses("errors") == {
        "a": "completed",
        "mismatch": "skipped",
        "missing": "skipped",
        "none": "skipped",
        "no glob": "skipped",
        "after": "completed",
    }
    reasons = {row.name: row.error for row in cli.view("errors").tasks}
    assert "cannot compare string > int: 'fast' > 3" in str(reasons["mismatch"])
    assert "cannot compare null > int" in str(reasons["missing"])
    assert "cannot compare null < int" in str(reasons["none"])
    assert "all() needs a list" in str(reasons["no glob"])
    tasks = cli.run("tasks", "errors")
    assert tasks.code == 0 and "could not be evaluated" in tasks.stdout
    events = cli.json("events", "errors")
    recorded = [e for e in events if e["kind"] == "condition" and e["task"] == "mismatch"]
    assert len(recorded) == 1
    assert "it read inputs.a = {'n': null, 'speed': 'fast'}" in recorded[0]["detail"]


def test_a_glob_aggregate_sees_a_failed_parent_without_output_as_null(
    probes: tuple[DagqCli, dict[str, Finished]],
) -> None:
    cli, run = result(probes, "glob")
    assert cli.statuses("glob") == {
        "train-a": "completed",
        "train-b": "failed",
        "deploy": "skipped",
        "report": "completed",
    }
    assert run.code == 0, run.output  # every sink completed or was skipped


def test_chained_conditions_across_a_skipped_task_finish(
    probes: tuple[DagqCli, dict[str, Finished]],
) -> None:
    cli, run = result(probes, "chain")
    assert run.code == 0, run.output
    assert cli.statuses("chain") == {
        "a": "completed",
        "b": "skipped",
        "c": "skipped",
        "d": "completed",
        "e": "completed",
    }


def test_a_dep_policy_n_condition_sees_the_unfinished_parent_as_null(
    probes: tuple[DagqCli, dict[str, Finished]],
) -> None:
    cli, run = result(probes, "n-of")
    assert run.code == 0, run.output
    assert cli.statuses("n-of") == {
        "a": "completed",
        "b": "completed",
        "c": "completed",
        "best": "completed",
        "strict": "skipped",  # null < 0.01 cannot be evaluated: false, as in ai4s-jobq
    }


# --- validate and graph say which rule set applies --------------------------------------


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[DagqCli]:
    with DagqCli(tmp_path) as cli:
        yield cli


def test_validate_names_the_rule_set_and_prints_warnings_with_exit_0(cli: DagqCli) -> None:
    wf = cli.workflow(
        "wf.yaml",
        {
            "name": "w",
            "tasks": [
                {"name": "prep data", "kwargs": {"cmd": "true", "epochs": 3}},
                {"name": "train", "kwargs": {"model": "schnet"}, "depends_on": ["prep data"] * 2},
            ],
        },
    )

    result = cli.run("validate", wf)

    assert result.code == 0, result.output
    assert result.stdout.splitlines() == [
        f"{wf}: ok — workflow 'w', 2 tasks",
        "  ai4s-jobq semantics: every task runs through kwargs and no dagq-only field is used",
    ]
    assert result.stderr.splitlines() == [
        f"warning: {wf}: task 'prep data': kwargs.epochs is ignored: a shell task uses only "
        "cmd, env, cwd and bg_dirsync_to (a task whose kwargs have no 'cmd' runs on a processor)",
        f"warning: {wf}: task 'train': depends_on: 'prep data' is listed twice; it counts once",
    ]


def test_validate_and_graph_say_why_a_file_is_dagq_native(cli: DagqCli) -> None:
    wf = cli.workflow(
        "wf.yaml",
        {
            "name": "w",
            "tasks": [{"name": "a", "kwargs": {"cmd": "x"}}, {"name": "b", "call": "m:f"}],
        },
    )
    reason = "dagq semantics: task 'b' uses 'call' (a dagq-only field)"

    assert reason in cli.run("validate", wf).stdout
    assert cli.run("graph", wf).stdout.splitlines()[0] == reason
    assert f"  %% {reason}" in cli.run("graph", wf, "--format", "mermaid").stdout
    assert cli.run("graph", wf, "--format", "dot").stdout.startswith(f"// {reason}\n")


def test_graph_of_a_submitted_workflow_names_its_rule_set(
    probes: tuple[DagqCli, dict[str, Finished]],
) -> None:
    cli, _ = probes
    shown = cli.run("graph", "chain")
    assert shown.code == 0, shown.output
    assert shown.stdout.startswith("ai4s-jobq semantics: every task runs through kwargs")
