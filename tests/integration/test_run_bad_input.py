"""Bad input to ``dagq run`` / ``dagq validate``: one clear line on stderr, exit code 2.

Never a traceback, never a half-started run: each message names the file, the task
and the field at fault (and the line when there is one).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration.cli_harness import EXAMPLES, DagqCli, Finished

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[DagqCli]:
    with DagqCli(tmp_path) as cli:
        yield cli


@dataclass(frozen=True)
class Case:
    """A bad workflow file, and what its one-line error must mention."""

    text: str
    mentions: tuple[str, ...]
    file: str = "wf.yaml"


CASES = {
    "malformed-yaml": Case(
        "name: x\ntasks:\n  - name: a\n    cmd: [unclosed\n  - name: b\n",
        ("wf.yaml", "line 5", "invalid YAML"),
    ),
    "malformed-json": Case(
        '{"name": "x",\n "tasks": [\n  {"name": "a" "cmd": "true"}\n ]}\n',
        ("wf.json", "line 3", "invalid JSON"),
        file="wf.json",
    ),
    "empty-file": Case("", ("wf.yaml", "empty")),
    "unknown-task-field": Case(
        "name: x\ntasks:\n  - name: a\n    cmd: 'true'\n    depends: []\n",
        ("wf.yaml", "line 5", "'a'", "unknown task field 'depends'", "did you mean 'depends_on'"),
    ),
    "unknown-workflow-field": Case(
        "name: x\nmax_paralelism: 3\ntasks:\n  - {name: a, cmd: 'true'}\n",
        ("wf.yaml", "line 2", "'max_paralelism'", "did you mean 'max_parallelism'"),
    ),
    "duplicate-task": Case(
        "name: x\ntasks:\n  - {name: a, cmd: 'true'}\n  - {name: a, cmd: 'true'}\n",
        ("wf.yaml", "duplicate task name 'a'"),
    ),
    "missing-dependency": Case(
        "name: x\ntasks:\n  - {name: a, cmd: 'true', depends_on: [ghost]}\n",
        ("wf.yaml", "task 'a'", "depends_on", "'ghost'"),
    ),
    "self-dependency": Case(
        "name: x\ntasks:\n  - {name: a, cmd: 'true', depends_on: [a]}\n",
        ("wf.yaml", "task 'a'", "depends_on", "itself"),
    ),
    "cycle": Case(
        "name: x\ntasks:\n"
        "  - {name: a, cmd: 'true', depends_on: [b]}\n"
        "  - {name: b, cmd: 'true', depends_on: [a]}\n"
        "  - {name: c, cmd: 'true'}\n",
        ("wf.yaml", "cycle", "a -> b -> a"),
    ),
    "bad-dep-policy": Case(
        "name: x\ntasks:\n  - {name: a, cmd: 'true'}\n"
        "  - {name: b, cmd: 'true', depends_on: [a], dep_policy: most}\n",
        ("wf.yaml", "line 4", "'b'", "dep_policy", "'most'", "all_settled"),
    ),
    "bad-result-policy": Case(
        "name: x\nresult_policy: every\ntasks:\n  - {name: a, cmd: 'true'}\n",
        ("wf.yaml", "line 2", "result_policy", "'every'", "all_tasks_succeed"),
    ),
    "dep-policy-over-parent-count": Case(
        "name: x\ntasks:\n  - {name: a, cmd: 'true'}\n"
        "  - {name: b, cmd: 'true', depends_on: [a], dep_policy: 2}\n",
        ("wf.yaml", "task 'b'", "dep_policy"),
    ),
    "condition-does-not-parse": Case(
        "name: x\ntasks:\n  - {name: a, cmd: 'true'}\n"
        "  - {name: b, cmd: 'true', depends_on: [a], condition: 'inputs.a.score >'}\n",
        ("wf.yaml", "task 'b'", "condition"),
    ),
    "condition-names-a-non-parent": Case(
        "name: x\ntasks:\n  - {name: a, cmd: 'true'}\n  - {name: c, cmd: 'true'}\n"
        "  - {name: b, cmd: 'true', depends_on: [a], condition: 'inputs.c.score > 1'}\n",
        ("wf.yaml", "task 'b'", "condition", "'c'", "not a parent"),
    ),
    "wrong-field-type": Case(
        "name: x\ntasks:\n  - {name: a, cmd: 'true', num_retries: many}\n",
        ("wf.yaml", "line 3", "'a'", "num_retries"),
    ),
    "command-not-text": Case(
        "name: x\ntasks:\n  - {name: a, kwargs: {cmd: 5}}\n",
        ("wf.yaml", "task 'a'", "kwargs.cmd"),
    ),
    "undeclared-param-in-cmd": Case(
        "name: x\ntasks:\n  - {name: a, cmd: 'echo {{ params.nope }}'}\n",
        ("wf.yaml", "task 'a'", "params.nope"),
    ),
}


def assert_one_clear_line(result: Finished, *mentions: str) -> None:
    assert result.code == 2, result.output
    assert "Traceback" not in result.output
    message = result.stderr.strip()
    assert message.count("\n") == 0, f"more than one line:\n{result.stderr}"
    assert message.startswith("error: "), message
    for text in mentions:
        assert text in message, f"{text!r} not in {message!r}"


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_bad_definition_gives_one_clear_line_and_exit_2(cli: DagqCli, case: Case) -> None:
    path = cli.write(case.file, case.text)

    result = cli.run("run", path)

    assert_one_clear_line(result, *case.mentions)
    assert result.stdout == ""
    assert not (cli.workdir / "dagq.db").exists(), "nothing should be stored"


#: ``validate`` loads files exactly as ``run`` does; one case of each kind of check.
VALIDATE_CASES = ["malformed-yaml", "unknown-task-field", "cycle", "condition-names-a-non-parent"]


@pytest.mark.parametrize("case", [CASES[k] for k in VALIDATE_CASES], ids=VALIDATE_CASES)
def test_validate_reports_the_same_problem_with_exit_2(cli: DagqCli, case: Case) -> None:
    path = cli.write(case.file, case.text)

    result = cli.run("validate", path)

    assert_one_clear_line(result, *case.mentions)


@pytest.mark.parametrize(
    "example",
    sorted(EXAMPLES.glob("*.yaml")) + sorted(EXAMPLES.glob("*.json")),
    ids=lambda p: p.name,
)
def test_validate_accepts_a_good_file_with_exit_0(cli: DagqCli, example: Path) -> None:
    result = cli.run("validate", example)

    assert result.code == 0, result.output
    assert "ok" in result.stdout
    assert result.stderr == ""


# --- bad command lines ----------------------------------------------------------------


def good(cli: DagqCli) -> Path:
    return cli.write(
        "good.yaml",
        "name: good\nparams: {n: 1}\ntasks:\n  - {name: a, cmd: 'echo {{ params.n }}'}\n",
    )


def test_unknown_param_is_refused_naming_it_and_the_known_ones(cli: DagqCli) -> None:
    result = cli.run("run", good(cli), "-p", "m=3")

    assert_one_clear_line(result, "'m'", "known params: n")


def test_param_without_equals_sign_is_refused(cli: DagqCli) -> None:
    result = cli.run("run", good(cli), "-p", "n")

    assert_one_clear_line(result, "-p 'n'", "key=value")


def test_nonexistent_file_is_refused(cli: DagqCli) -> None:
    result = cli.run("run", "no-such-file.yaml")

    assert_one_clear_line(result, "no-such-file.yaml", "no such file")


def test_unwritable_store_path_is_refused_naming_it(cli: DagqCli) -> None:
    (cli.workdir / "a-file").write_text("not a directory\n")
    store = cli.workdir / "a-file" / "dagq.db"

    result = cli.run("run", good(cli), "--store", f"sqlite:///{store}", store=False)

    assert_one_clear_line(result, str(store))


def test_unsupported_store_url_is_refused(cli: DagqCli) -> None:
    result = cli.run("run", good(cli), "--store", "ftp://example.com/x", store=False)

    assert_one_clear_line(result, "ftp://example.com/x", "sqlite:///")


def test_invalid_workflow_id_is_refused(cli: DagqCli) -> None:
    result = cli.run("run", good(cli), "--id", "../escape")

    assert_one_clear_line(result, "'../escape'")
