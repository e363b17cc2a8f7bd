"""The payload layer under ``dagq run``: what a task, a param or a signal may carry,
and what happens above the bounds — on real processes, as a user sees it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dagq import payloads
from tests.integration.cli_harness import DagqCli

pytestmark = pytest.mark.timeout(120)

TASKS_MODULE = """
def long_error(ctx):
    raise ValueError("start-" + "x" * 60000 + "-end")


def deep_output(ctx):
    value = 1
    for _ in range(5000):
        value = [value]
    return value


def echo(value):
    return len(value)
"""


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DagqCli]:
    with DagqCli(tmp_path_factory.mktemp("payloads")) as cli:
        cli.write("tasks_mod.py", TASKS_MODULE)
        yield cli


@pytest.fixture
def cli(shared: DagqCli) -> Iterator[DagqCli]:
    with shared.scope() as cli:
        yield cli


def test_a_60000_character_error_ends_the_run_shown_cut_and_kept_whole(cli: DagqCli) -> None:
    path = cli.workflow(
        "long-error.yaml",
        {
            "name": "long-error",
            "tasks": [
                {"name": "boom", "call": "tasks_mod:long_error"},
                {"name": "fine", "cmd": "echo fine"},
            ],
        },
    )

    result = cli.run("run", path, "--id", "long-error", timeout_s=60)

    assert result.code == 1, result.output
    assert "ValueError:" in result.stdout and "start-xxx" in result.stdout
    assert result.summary_rows()["fine"][0] == "completed"
    error = cli.json("status", "long-error")["failed"][0]["error"]
    assert len(error) <= payloads.ERROR_INLINE_CHARS
    assert error.startswith("ValueError: start-xxx") and "characters cut" in error
    assert "whole text: dagq logs long-error boom" in error
    logs = cli.run("logs", "long-error", "boom")
    assert logs.code == 0, logs.output
    assert "start-" + "x" * 60000 + "-end" in logs.stdout


@pytest.mark.parametrize(
    "task",
    [
        {"call": "tasks_mod:deep_output"},
        {
            "cmd": "python3 -c \"import os; open(os.environ['DAGQ_OUTPUT'], 'w')"
            ".write('[' * 5000 + ']' * 5000)\""
        },
    ],
    ids=["python-return-value", "shell-dagq-output"],
)
def test_an_output_nested_5000_deep_fails_its_attempt_with_a_clear_error(
    cli: DagqCli, task: dict[str, str]
) -> None:
    path = cli.workflow("deep.yaml", {"name": "deep", "tasks": [{"name": "deep", **task}]})

    result = cli.run("run", path, timeout_s=60)

    assert result.code == 1, result.output
    assert "output is nested more than 100 levels deep" in result.stdout


def test_a_60_kb_param_on_the_command_line_runs_to_completion(cli: DagqCli) -> None:
    path = cli.workflow(
        "big-param.yaml",
        {
            "name": "big-param",
            "params": {"big": ""},
            "tasks": [{"name": "count", "cmd": "printf %s {{ params.big }} | wc -c > count.txt"}],
        },
    )

    result = cli.run("run", path, "-p", "big=" + "b" * 60_000, timeout_s=60)

    assert result.code == 0, result.output
    assert (cli.workdir / "count.txt").read_text().strip() == "60000"


def billion_laughs() -> str:
    lines = ['params:\n  a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for level in range(1, 10):
        prev, name = chr(ord("a") + level - 1), chr(ord("a") + level)
        lines.append(f"  {name}: &{name} [" + ", ".join([f"*{prev}"] * 9) + "]")
    lines.append("name: lol\ntasks: [{name: t, cmd: echo, args: *j}]")
    return "\n".join(lines) + "\n"


DEEP = "[" * 960 + "]" * 960
BAD_FILES = {
    "lol.yaml": (billion_laughs(), "its YAML aliases expand it beyond the limit"),
    "deep.json": (
        f'{{"name": "deep", "params": {{"p": {DEEP}}}, "tasks": [{{"name": "a", "cmd": "e"}}]}}',
        "params.p is nested more than 100 levels deep",
    ),
    "heavy.yaml": (
        "name: heavy\nparams: {p: " + "h" * (payloads.MAX_PARAMS_BYTES + 10) + "}\n"
        "tasks: [{name: a, cmd: echo}]\n",
        f"over the limit of {payloads.MAX_PARAMS_BYTES} bytes",
    ),
}


@pytest.mark.parametrize("command", ["validate", "run", "submit"])
def test_a_file_over_the_bounds_is_refused_alike_by_validate_run_and_submit(
    cli: DagqCli, command: str
) -> None:
    commands = {}
    for name, (text, _) in BAD_FILES.items():
        cli.write(name, text)
        commands[name] = [command, name]

    results = cli.run_many(commands, timeout_s=90)

    for name, (_, expected) in BAD_FILES.items():
        result = results[name]
        assert result.code == 2, (name, result.output)
        assert result.stdout == "", (name, result.stdout)
        assert result.stderr.startswith(f"error: {name}: ") and expected in result.stderr, name
        assert result.stderr.count("\n") == 1, (name, result.stderr)


@pytest.mark.parametrize("depth", [970, 5000])
def test_a_deeply_nested_param_or_signal_is_refused_at_the_source_in_one_line(
    cli: DagqCli, depth: int
) -> None:
    path = cli.workflow(
        "waits.yaml",
        {
            "name": "waits",
            "params": {"p": 0},
            "tasks": [{"name": "approve", "wait_for": {"signal": "go"}}],
        },
    )
    submitted = cli.run("submit", path, "--id", f"waits-{depth}")
    assert submitted.code == 0, submitted.output
    deep = "[" * depth + "]" * depth

    results = cli.run_many(
        {
            "run": ["run", str(path), "-p", f"p={deep}"],
            "submit": ["submit", str(path), "-p", f"p={deep}"],
            "signal": ["signal", f"waits-{depth}", "go", "--data", deep],
        },
        timeout_s=60,
    )

    for name, result in results.items():
        assert result.code == 2, (name, result.output)
        assert result.stderr.startswith("error: ") and "nested" in result.stderr, name
        assert result.stderr.count("\n") == 1, (name, result.stderr)
    tasks = cli.json("tasks", f"waits-{depth}")
    assert [t["status"] for t in tasks] != ["completed"]


def test_a_5000_character_name_is_never_echoed_in_full_on_the_command_line(cli: DagqCli) -> None:
    long = "n" * 5000
    path = cli.workflow(
        "named.yaml",
        {"name": "named", "tasks": [{"name": "approve", "wait_for": {"signal": "go"}}]},
    )
    submitted = cli.run("submit", path, "--id", "named")
    assert submitted.code == 0, submitted.output
    cli.write("long-queue.yaml", f"name: q\ntasks: [{{name: a, cmd: e, queue: {long}}}]\n")

    results = cli.run_many(
        {
            "status": ["status", long],
            "run-id": ["run", str(path), "--id", long],
            "logs-task": ["logs", "named", long],
            "signal-name": ["signal", "named", long],
            "param": ["run", str(path), "-p", f"{long}=1"],
            "queue": ["validate", "long-queue.yaml"],
        },
        timeout_s=60,
    )

    for name, result in results.items():
        assert result.code == 2, (name, result.output)
        assert result.stderr.startswith("error: "), (name, result.stderr[:300])
        assert len(result.stderr) < 400, (name, result.stderr[:500])
