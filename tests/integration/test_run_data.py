"""Data between tasks under ``dagq run``: upstream outputs, environment, params, big outputs.

Tasks record what they saw into files in the scratch directory; the tests compare
those files with what the definition promised.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from dagq.messages import OUTPUT_INLINE_LIMIT
from tests.integration.cli_harness import DagqCli

pytestmark = pytest.mark.timeout(60)

#: A Python task module, importable by the worker from the scratch directory.
TASKS_MODULE = """
import json
from pathlib import Path


def record(inputs, ctx, **args):
    seen = {
        "args": args,
        "inputs": inputs,
        "ctx": {"workflow_id": ctx.workflow_id, "task": ctx.task, "attempt": ctx.attempt},
    }
    Path(f"{ctx.task}.seen.json").write_text(json.dumps(seen))
    return {"seen": True}


def big(size, score):
    return {"blob": "x" * size, "score": score}


def measure(inputs):
    return {name: len(value["blob"]) for name, value in inputs.items()}


def keep(inputs, ctx):
    Path(f"{ctx.task}.seen.json").write_text(json.dumps(measure(inputs)))
    return None
"""

#: A shell command writing a big JSON output, ``{"blob": "y" * N, "score": S}``.
WRITE_BIG = (
    "python3 -c \"import json, os; json.dump({{'blob': 'y' * {size}, 'score': {score}}}, "
    "open(os.environ['DAGQ_OUTPUT'], 'w'))\""
)
#: A shell command recording the sizes of the blobs it received through $DAGQ_INPUTS.
MEASURE_INPUTS = (
    "python3 -c \"import json, os; d = json.load(open(os.environ['DAGQ_INPUTS'])); "
    "json.dump({k: len(v['blob']) for k, v in d.items()}, open('$DAGQ_TASK.seen.json', 'w'))\""
)


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[DagqCli]:
    with DagqCli(tmp_path) as cli:
        cli.write("tasks_mod.py", TASKS_MODULE)
        yield cli


def seen(cli: DagqCli, task: str) -> dict[str, object]:
    return json.loads((cli.workdir / f"{task}.seen.json").read_text())


# --- shell tasks --------------------------------------------------------------------


def producers(extra: list[dict[str, object]]) -> dict[str, object]:
    return {
        "name": "data",
        "params": {"name": "world"},
        "tasks": [
            {"name": "A", "cmd": """echo '{"field": 41, "words": ["a", "b"]}' > "$DAGQ_OUTPUT" """},
            {"name": "B", "kwargs": {"cmd": """echo '{"ok": true}' > "$JOBQ_OUTPUT_FILE" """}},
            *extra,
        ],
    }


def test_shell_task_reads_upstream_outputs_from_dagq_inputs_keyed_by_parent(cli: DagqCli) -> None:
    wf = cli.workflow(
        "wf.yaml",
        producers(
            [{"name": "C", "depends_on": ["A", "B"], "cmd": 'cp "$DAGQ_INPUTS" C.seen.json'}]
        ),
    )

    result = cli.run("run", wf, "--id", "data")

    assert result.code == 0, result.output
    assert seen(cli, "C") == {"A": {"field": 41, "words": ["a", "b"]}, "B": {"ok": True}}


def test_json_written_to_dagq_output_or_jobq_output_file_becomes_the_stored_output(
    cli: DagqCli,
) -> None:
    wf = cli.workflow("wf.yaml", producers([]))

    result = cli.run("run", wf, "--id", "data")

    assert result.code == 0, result.output
    _, plan, state = cli.run_state("data")
    assert state.outputs[plan.by_name["A"]] == {"field": 41, "words": ["a", "b"]}
    assert state.outputs[plan.by_name["B"]] == {"ok": True}


def test_shell_task_environment_names_workflow_task_and_attempt(cli: DagqCli) -> None:
    record_env = 'env | grep "^DAGQ_\\|^JOBQ_" | sort > "env.$DAGQ_ATTEMPT"'
    wf = cli.workflow(
        "wf.yaml",
        {
            "name": "env",
            "tasks": [
                {
                    "name": "who-am-i",
                    "num_retries": 1,
                    "retry": {"backoff_s": 0.05, "jitter": 0},
                    "cmd": f'{record_env}; test "$DAGQ_ATTEMPT" = 2',
                },
            ],
        },
    )

    result = cli.run("run", wf, "--id", "env-run")

    assert result.code == 0, result.output
    env = dict(line.split("=", 1) for line in (cli.workdir / "env.2").read_text().splitlines())
    assert env["DAGQ_WORKFLOW_ID"] == "env-run"
    assert env["DAGQ_TASK"] == "who-am-i"
    assert env["DAGQ_ATTEMPT"] == "2"
    assert env["DAGQ_OUTPUT"] == env["JOBQ_OUTPUT_FILE"]
    assert Path(env["DAGQ_INPUTS"]).name.endswith(".json")
    assert (cli.workdir / "env.1").exists()


def test_param_with_shell_metacharacters_is_quoted_and_cannot_inject(cli: DagqCli) -> None:
    wf = cli.workflow(
        "wf.yaml",
        {
            "name": "quoting",
            "params": {"name": "world"},
            "tasks": [{"name": "greet", "cmd": "printf '%s\\n' {{ params.name }} > greeting.txt"}],
        },
    )
    nasty = "x; touch pwned $(touch pwned2) `touch pwned3` && touch pwned4 | touch pwned5"

    result = cli.run("run", wf, "--id", "q", "-p", f"name={nasty}")

    assert result.code == 0, result.output
    assert (cli.workdir / "greeting.txt").read_text() == nasty + "\n"
    assert not list(cli.workdir.glob("pwned*"))


def test_param_default_is_pasted_quoted_into_the_command(cli: DagqCli) -> None:
    wf = cli.workflow(
        "wf.yaml",
        {
            "name": "quoting",
            "params": {"name": "it's; rm -rf nothing"},
            "tasks": [{"name": "greet", "cmd": "printf '%s' {{ params.name }} > greeting.txt"}],
        },
    )

    result = cli.run("run", wf, "--id", "q")

    assert result.code == 0, result.output
    assert (cli.workdir / "greeting.txt").read_text() == "it's; rm -rf nothing"


# --- Python tasks -------------------------------------------------------------------


def test_python_task_gets_rendered_args_inputs_and_ctx(cli: DagqCli) -> None:
    wf = cli.workflow(
        "wf.yaml",
        producers(
            [
                {
                    "name": "P",
                    "depends_on": ["A", "B"],
                    "call": "tasks_mod:record",
                    "args": {
                        "x": "{{ inputs.A.field }}",
                        "words": "{{ inputs.A.words }}",
                        "who": "{{ params.name }}",
                        "greeting": "hello {{ params.name }}",
                        "literal": 7,
                    },
                }
            ]
        ),
    )

    result = cli.run("run", wf, "--id", "py", "-p", "name=x; touch pwned")

    assert result.code == 0, result.output
    got = seen(cli, "P")
    assert got["args"] == {
        "x": 41,
        "words": ["a", "b"],
        "who": "x; touch pwned",
        "greeting": "hello x; touch pwned",
        "literal": 7,
    }
    assert got["inputs"] == {"A": {"field": 41, "words": ["a", "b"]}, "B": {"ok": True}}
    assert got["ctx"] == {"workflow_id": "py", "task": "P", "attempt": 1}
    assert not list(cli.workdir.glob("pwned*"))


# --- outputs too big for a message --------------------------------------------------

BIG = OUTPUT_INLINE_LIMIT + 8 * 1024


def test_big_python_output_is_stored_by_reference_and_reaches_downstream_and_condition(
    cli: DagqCli,
) -> None:
    wf = cli.workflow(
        "wf.yaml",
        {
            "name": "big",
            "tasks": [
                {"name": "big", "call": "tasks_mod:big", "args": {"size": BIG, "score": 0.9}},
                {
                    "name": "taken",
                    "depends_on": ["big"],
                    "condition": "inputs.big.score > 0.5",
                    "call": "tasks_mod:keep",
                },
                {
                    "name": "not-taken",
                    "depends_on": ["big"],
                    "condition": "inputs.big.score > 0.95",
                    "call": "tasks_mod:keep",
                },
            ],
        },
    )

    result = cli.run("run", wf, "--id", "big")

    assert result.code == 0, result.output
    _, plan, state = cli.run_state("big")
    assert plan.by_name["big"] in state.output_refs, "the output was stored inline"
    assert seen(cli, "taken") == {"big": BIG}
    assert cli.statuses("big") == {"big": "completed", "taken": "completed", "not-taken": "skipped"}


def test_big_shell_output_is_stored_by_reference_and_reaches_downstream_and_condition(
    cli: DagqCli,
) -> None:
    wf = cli.workflow(
        "wf.yaml",
        {
            "name": "big",
            "tasks": [
                {"name": "big", "cmd": WRITE_BIG.format(size=BIG, score=0.1)},
                {"name": "consume", "depends_on": ["big"], "cmd": MEASURE_INPUTS},
                {
                    "name": "not-taken",
                    "depends_on": ["big"],
                    "condition": "inputs.big.score > 0.5",
                    "cmd": "touch not-taken.ran",
                },
            ],
        },
    )

    result = cli.run("run", wf, "--id", "big")

    assert result.code == 0, result.output
    _, plan, state = cli.run_state("big")
    assert plan.by_name["big"] in state.output_refs, "the output was stored inline"
    assert seen(cli, "consume") == {"big": BIG}
    assert cli.statuses("big")["not-taken"] == "skipped"
    assert not (cli.workdir / "not-taken.ran").exists()


def test_a_task_named_like_a_compensation_gets_its_own_idempotency_key(cli: DagqCli) -> None:
    record = 'echo "$DAGQ_IDEMPOTENCY_KEY" >> keys.log'
    wf = cli.workflow(
        "keys.yaml",
        {
            "name": "keys",
            "tasks": [
                {"name": "charge", "cmd": "true", "compensate": {"cmd": record}},
                {"name": "charge/undo", "cmd": record, "depends_on": ["charge"]},
                {"name": "fail", "cmd": "exit 1", "depends_on": ["charge/undo"]},
            ],
        },
    )

    result = cli.run("run", wf, "--id", "keys")

    assert result.code == 1, result.output
    assert (cli.workdir / "keys.log").read_text().split() == [
        "keys/charge/undo",
        "keys/charge#undo",
    ]
    kinds = [e["kind"] for e in cli.json("events", "keys")]
    assert "compensated" in kinds
