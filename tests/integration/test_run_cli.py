"""``dagq run`` end to end: the examples, retries, exit codes, finished ids, plain output.

Each test runs the installed ``dagq`` command in a scratch directory with its own
SQLite store, and checks what a user sees (exit code, summary) and what the store
holds.
"""

from __future__ import annotations

import ast
import contextlib
import os
import pty
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.cli_harness import EXAMPLES, DagqCli, Finished, lines

pytestmark = pytest.mark.timeout(60)

ANSI_ESCAPE = re.compile(r"\x1b\[")


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[DagqCli]:
    with DagqCli(tmp_path) as cli:
        yield cli


def _defines_workflow(path: Path) -> bool:
    """Does a Python example build a Workflow (rather than hold task functions)?"""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if name == "Workflow":
                return True
    return False


def _examples() -> list[Path]:
    files = sorted(EXAMPLES.glob("*.yaml")) + sorted(EXAMPLES.glob("*.yml"))
    files += sorted(EXAMPLES.glob("*.json"))
    files += [p for p in sorted(EXAMPLES.glob("*.py")) if _defines_workflow(p)]
    return files


#: Examples that fail on purpose: the task that fails and what its error must say.
FAILING_EXAMPLES = {"failing.yaml": ("flaky-upload", ["exit code 3", "upload refused by server"])}
#: Examples that wait for a person (a signal); tests/integration/test_examples_patterns.py
#: runs them and sends it.
WAITING_EXAMPLES = {"research_digest.yaml"}


# --- the examples -----------------------------------------------------------------


def test_there_are_examples_to_run() -> None:
    names = {p.name for p in _examples()}
    assert {"document_pipeline.yaml", "failing.yaml", "jobq_workflow.json"} <= names
    assert "docpipe.py" not in names  # task functions, no workflow


@pytest.mark.parametrize(
    "example",
    [p for p in _examples() if p.name not in set(FAILING_EXAMPLES) | WAITING_EXAMPLES],
    ids=lambda p: p.name,
)
def test_example_runs_to_completion(cli: DagqCli, example: Path) -> None:
    result = cli.run("run", example, "--id", "example")

    assert result.code == 0, result.output
    assert "Traceback" not in result.output
    assert "workflow completed" in result.verdict()
    assert cli.view("example").status == "completed"
    states = {row[0] for row in result.summary_rows().values()}
    assert states <= {"completed", "skipped"}


@pytest.mark.parametrize("name", sorted(FAILING_EXAMPLES))
def test_failing_example_exits_1_naming_the_failed_task_and_the_reason(
    cli: DagqCli, name: str
) -> None:
    task, reasons = FAILING_EXAMPLES[name]

    result = cli.run("run", EXAMPLES / name, "--id", "failing")

    assert result.code == 1, result.output
    assert "Traceback" not in result.output
    verdict = result.verdict()
    assert "workflow failed" in verdict
    assert f"'{task}'" in verdict
    for reason in reasons:
        assert reason in verdict
    row = result.summary_rows()[task]
    assert row[0] == "failed"
    assert reasons[0] in row[3]


def test_document_pipeline_skips_the_branch_whose_condition_is_false(cli: DagqCli) -> None:
    result = cli.run("run", EXAMPLES / "document_pipeline.yaml", "--id", "docs")

    assert result.code == 0, result.output
    statuses = cli.statuses("docs")
    assert statuses["contracts"] == "skipped"
    assert statuses["invoices"] == statuses["report"] == "completed"


def test_params_override_defaults_with_dash_p(cli: DagqCli) -> None:
    result = cli.run(
        "run", EXAMPLES / "document_pipeline.yaml", "-p", "contract_threshold=0", "--id", "docs"
    )

    assert result.code == 0, result.output
    assert cli.statuses("docs")["contracts"] == "completed"


# --- retries and failure cascades -------------------------------------------------


def always_failing(cli: DagqCli, *, num_retries: int = 2) -> Path:
    """prepare → upload (always exits 7) → publish → notify; prepare → archive."""
    return cli.workflow(
        "always_failing.yaml",
        {
            "name": "always-failing",
            "tasks": [
                {"name": "prepare", "cmd": "echo prepare >> runs.log"},
                {
                    "name": "upload",
                    "depends_on": ["prepare"],
                    "num_retries": num_retries,
                    "retry": {"backoff_s": 0.05, "jitter": 0},
                    "cmd": "echo upload >> runs.log; echo 'no route to host' >&2; exit 7",
                },
                {"name": "publish", "depends_on": ["upload"], "cmd": "echo publish >> runs.log"},
                {"name": "notify", "depends_on": ["publish"], "cmd": "echo notify >> runs.log"},
                {"name": "archive", "depends_on": ["prepare"], "cmd": "echo archive >> runs.log"},
            ],
        },
    )


@pytest.fixture(scope="module")
def failed_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DagqCli, Finished]]:
    """One run of the always-failing workflow (id 'wf'), shared by the tests that read it."""
    with DagqCli(tmp_path_factory.mktemp("failed-run")) as cli:
        yield cli, cli.run("run", always_failing(cli), "--id", "wf")


def test_always_failing_task_with_two_retries_runs_exactly_three_times(
    failed_run: tuple[DagqCli, Finished],
) -> None:
    cli, result = failed_run

    assert result.code == 1, result.output
    assert lines(cli.workdir / "runs.log").count("upload") == 3
    row = result.summary_rows()["upload"]
    assert row[0] == "failed"
    assert row[1] == "3"
    assert "exit code 7" in row[3]
    assert "no route to host" in row[3]


def test_dependants_of_a_failed_task_end_upstream_failed_and_never_run(
    failed_run: tuple[DagqCli, Finished],
) -> None:
    cli, result = failed_run

    statuses = cli.statuses("wf")
    assert statuses["publish"] == statuses["notify"] == "upstream_failed"
    assert statuses["archive"] == statuses["prepare"] == "completed"
    ran = lines(cli.workdir / "runs.log")
    assert "publish" not in ran
    assert "notify" not in ran
    rows = result.summary_rows()
    assert rows["publish"][0] == rows["notify"][0] == "upstream_failed"


def test_workflow_with_a_failed_sink_ends_failed(failed_run: tuple[DagqCli, Finished]) -> None:
    cli, result = failed_run

    view = cli.view("wf")
    assert view.status == "failed"
    assert view.error is not None
    assert "upload" in view.error
    assert "workflow failed" in result.verdict()
    assert "'upload'" in result.verdict()


# --- a workflow id that exists already ----------------------------------------------


def test_rerunning_a_completed_workflow_id_reports_its_result_and_runs_nothing(
    cli: DagqCli,
) -> None:
    wf = cli.workflow(
        "once.yaml", {"name": "once", "tasks": [{"name": "a", "cmd": "echo a >> runs.log"}]}
    )
    assert cli.run("run", wf, "--id", "once").code == 0

    again = cli.run("run", wf, "--id", "once")

    assert again.code == 0, again.output
    assert "already finished" in again.stdout
    assert "workflow completed" in again.verdict()
    assert lines(cli.workdir / "runs.log") == ["a"]


def test_rerunning_a_failed_workflow_id_exits_1_again_and_runs_nothing(cli: DagqCli) -> None:
    wf = always_failing(cli, num_retries=0)
    assert cli.run("run", wf, "--id", "wf").code == 1
    before = lines(cli.workdir / "runs.log")

    again = cli.run("run", wf, "--id", "wf")

    assert again.code == 1, again.output
    assert "already finished" in again.stdout
    assert "workflow failed" in again.verdict()
    assert again.summary_rows()["upload"][0] == "failed"
    assert lines(cli.workdir / "runs.log") == before


def test_same_id_with_a_different_definition_is_refused_with_exit_2(cli: DagqCli) -> None:
    wf = cli.workflow("v1.yaml", {"name": "v", "tasks": [{"name": "a", "cmd": "true"}]})
    assert cli.run("run", wf, "--id", "same").code == 0
    changed = cli.workflow("v2.yaml", {"name": "v", "tasks": [{"name": "a", "cmd": "false"}]})

    result = cli.run("run", changed, "--id", "same")

    assert result.code == 2
    assert "Traceback" not in result.output
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert "'same'" in result.stderr
    assert "different definition" in result.stderr


def test_same_id_with_different_params_is_refused_with_exit_2(cli: DagqCli) -> None:
    wf = cli.workflow(
        "p.yaml",
        {"name": "p", "params": {"n": 1}, "tasks": [{"name": "a", "cmd": "echo {{ params.n }}"}]},
    )
    assert cli.run("run", wf, "--id", "same").code == 0

    result = cli.run("run", wf, "--id", "same", "-p", "n=2")

    assert result.code == 2
    assert "Traceback" not in result.output
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert "params" in result.stderr


# --- where the store is -------------------------------------------------------------


def test_default_store_is_a_sqlite_file_under_dot_dagq_in_the_current_directory(
    cli: DagqCli,
) -> None:
    wf = cli.workflow("a.yaml", {"name": "a", "tasks": [{"name": "a", "cmd": "true"}]})

    result = cli.run("run", wf, store=False)

    assert result.code == 0, result.output
    assert (cli.workdir / ".dagq" / "dagq.db").is_file()
    assert not (cli.workdir / "dagq.db").exists()


def test_dagq_store_environment_variable_names_the_store(cli: DagqCli) -> None:
    wf = cli.workflow("a.yaml", {"name": "a", "tasks": [{"name": "a", "cmd": "true"}]})

    result = cli.run("run", wf, "--id", "env", store=False, env={"DAGQ_STORE": cli.store_url})

    assert result.code == 0, result.output
    assert not (cli.workdir / ".dagq").exists()
    assert cli.view("env").status == "completed"


# --- output for logs and pipes ------------------------------------------------------


def test_piped_output_has_no_ansi_escapes_and_ends_with_the_summary_table(cli: DagqCli) -> None:
    del cli.env["COLUMNS"]  # whatever width a pipe gets by default

    result = cli.run("run", always_failing(cli, num_retries=0), "--id", "plain")

    assert not ANSI_ESCAPE.search(result.output), result.output
    assert "running always-failing as plain" in result.stdout
    header = next(line for line in result.stdout.splitlines() if "attempts" in line)
    for column in ("task", "state", "attempts", "duration", "error"):
        assert column in header
    assert set(result.summary_rows()) == {"prepare", "upload", "publish", "notify", "archive"}
    assert "workflow failed" in result.verdict()


def test_terminal_output_is_coloured_and_ends_with_the_summary(cli: DagqCli) -> None:
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        cli.command("run", EXAMPLES / "jobq_workflow.json", "--id", "tty"),
        cwd=cli.workdir,
        env={**cli.env, "TERM": "xterm-256color"},
        stdin=subprocess.DEVNULL,
        stdout=terminal,
        stderr=terminal,
    )
    os.close(terminal)
    chunks = []
    with contextlib.suppress(OSError):  # EIO once the command has closed the terminal
        while chunk := os.read(controller, 65536):
            chunks.append(chunk)
    os.close(controller)
    code = process.wait(timeout=30)
    shown = b"".join(chunks).decode("utf-8", "replace")

    assert code == 0, shown
    assert ANSI_ESCAPE.search(shown)
    assert "Traceback" not in shown
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", shown)
    assert "workflow completed" in plain
    assert "pick-best" in plain
