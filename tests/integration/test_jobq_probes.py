"""ai4s-jobq files end to end, with both sides of dagq (coordinator and worker): a
failed parent's output seen by a condition, invalid output JSON, env values that are not
text, and a stress-generator file run by a custom processor.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.cli_harness import DagqCli

pytestmark = pytest.mark.timeout(240)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "jobq"


#: A processor for ai4s-jobq's stress-test files: it sleeps a hundredth of ``sleep_s``
#: and fails the tasks marked with ``fail_probability`` >= 0.5 (deterministically).
STRESS_PROCESSOR = """
import time

def run(sleep_s, fail_probability=0.0, ctx=None):
    time.sleep(sleep_s / 100)
    if fail_probability >= 0.5:
        raise RuntimeError(f"{ctx.task} failed on purpose")
    return {"task": ctx.task, "ok": True}
"""


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[DagqCli]:
    with DagqCli(tmp_path) as cli:
        yield cli


def test_a_failed_parent_keeps_its_output_and_a_condition_sees_it(cli: DagqCli) -> None:
    wf = cli.workflow(
        "failed-output.yaml",
        {
            "name": "failed-output",
            "tasks": [
                {
                    "name": "train",
                    "kwargs": {"cmd": "echo '{\"loss\": 9.5}' > $JOBQ_OUTPUT_FILE; exit 4"},
                },
                {
                    "name": "diagnose",
                    "kwargs": {"cmd": "true"},
                    "depends_on": ["train"],
                    "dep_policy": "all_settled",
                    "condition": "inputs.train.loss > 5",
                },
                {"name": "fine", "kwargs": {"cmd": "true"}},
            ],
        },
    )
    done = cli.run("run", wf, "--id", "fo", "--quiet", timeout_s=120)
    # all_settled needs at least one completed parent: the only parent failed, so the
    # condition is never reached and the sink is upstream_failed, as in ai4s-jobq.
    assert done.code == 1, done.output
    assert cli.statuses("fo")["train"] == "failed"
    # ...but the failed task's output is kept, as ai4s-jobq keeps it.
    tasks = {t["name"]: t for t in cli.json("tasks", "fo")}
    assert tasks["train"]["status"] == "failed"

    wf2 = cli.workflow(
        "failed-output-any.yaml",
        {
            "name": "failed-output-any",
            "tasks": [
                {
                    "name": "train",
                    "kwargs": {"cmd": "echo '{\"loss\": 9.5}' > $JOBQ_OUTPUT_FILE; exit 4"},
                },
                {"name": "probe", "kwargs": {"cmd": "true"}},
                {
                    "name": "diagnose",
                    "kwargs": {"cmd": "true"},
                    "depends_on": ["train", "probe"],
                    "dep_policy": "all_settled",
                    "condition": "inputs.train.loss > 5 and inputs.probe == null",
                },
            ],
        },
    )
    done = cli.run("run", wf2, "--id", "foa", "--quiet", timeout_s=120)
    assert done.code == 0, done.output
    assert cli.statuses("foa") == {"train": "failed", "probe": "completed", "diagnose": "completed"}


def test_invalid_output_json_completes_with_a_warning_under_jobq_and_fails_under_dagq(
    cli: DagqCli,
) -> None:
    bad = "echo '{not json' > $JOBQ_OUTPUT_FILE"
    jobq = cli.workflow(
        "bad-jobq.yaml", {"name": "bad-jobq", "tasks": [{"name": "a", "kwargs": {"cmd": bad}}]}
    )
    dagq = cli.workflow("bad-dagq.yaml", {"name": "bad-dagq", "tasks": [{"name": "a", "cmd": bad}]})
    done = cli.run("run", jobq, "--id", "bj", "--quiet", timeout_s=120)
    assert done.code == 0, done.output
    assert cli.statuses("bj") == {"a": "completed"}
    warnings = [e for e in cli.json("events", "bj") if e["kind"] == "warning"]
    assert len(warnings) == 1 and "JSON" in warnings[0]["detail"]
    assert cli.run("output", "bj", "a").stdout.strip() == "null"

    done = cli.run("run", dagq, "--id", "bd", "--quiet", timeout_s=120)
    assert done.code == 1
    assert cli.statuses("bd") == {"a": "failed"}


def test_env_values_that_are_not_text_become_text(cli: DagqCli) -> None:
    wf = cli.workflow(
        "env.yaml",
        {
            "name": "env",
            "tasks": [
                {
                    "name": "show",
                    "kwargs": {
                        "cmd": 'printf \'{"n": "%s", "flag": "%s", "x": "%s"}\' '
                        '"$N" "$FLAG" "$X" > $JOBQ_OUTPUT_FILE',
                        "env": {"N": 5, "FLAG": True, "X": 0.5},
                    },
                }
            ],
        },
    )
    done = cli.run("run", wf, "--id", "env", "--quiet", timeout_s=120)
    assert done.code == 0, done.output
    output = json.loads(cli.run("output", "env", "show").stdout)
    assert output == {"n": "5", "flag": "True", "x": "0.5"}


def test_a_stress_generator_file_runs_with_a_custom_processor(cli: DagqCli) -> None:
    # A resilient diamond: two branches fail on purpose, the all_settled merge runs.
    wf = cli.workdir / "wf-00004.json"
    shutil.copy(FIXTURES / "stress" / "wf-00004.json", wf)
    cli.write("stress_procs.py", STRESS_PROCESSOR)
    done = cli.run(
        "run",
        wf,
        "--id",
        "stress",
        "--quiet",
        "--processor",
        "stress_procs:run",
        timeout_s=180,
    )
    assert done.code == 0, done.output
    states = cli.statuses("stress")
    assert states["branch-6"] == states["branch-9"] == "failed"
    assert states["merge"] == "completed"
    assert sum(s == "completed" for s in states.values()) == len(states) - 2


def test_a_stress_generator_file_without_a_processor_fails_fast_saying_why(
    cli: DagqCli,
) -> None:
    wf = cli.workdir / "wf-00000.json"
    shutil.copy(FIXTURES / "stress" / "wf-00000.json", wf)
    done = cli.run("run", wf, "--id", "noproc", "--quiet", timeout_s=120)
    assert done.code == 1
    assert "--processor" in done.output
