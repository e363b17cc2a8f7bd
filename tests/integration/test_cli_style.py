"""One style of error, and the version, through the CLI as a user types it.

click's usage errors (a bad option, a missing argument, an unknown command) look like
dagq's own: one line ``error: …`` on stderr, exit 2, nothing on stdout.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.cli_harness import DagqCli
from tests.integration.test_run_bad_input import assert_one_clear_line

pytestmark = pytest.mark.timeout(60)

USAGE_ERRORS = {
    "unknown-option": (
        ("run", "wf.yaml", "--wrokers", "2"),
        ("no such option '--wrokers'", "did you mean", "'--workers'", "dagq run --help"),
    ),
    "missing-argument": (("run",), ("missing argument 'FILE'", "dagq run --help")),
    "bad-value": (("run", "wf.yaml", "--workers", "0"), ("invalid value for '--workers'",)),
    "bad-choice": (("worker", "--isolation", "fork"), ("'fork' is not one of",)),
    "unknown-command": (("stauts", "x"), ("no such command 'stauts'", "dagq --help")),
    "nested-group": (("dlq", "purge", "--bad"), ("no such option '--bad'", "dagq dlq purge")),
    "missing-import-path": (
        ("worker", "--import-path", "no-such-dir"),
        ("'--import-path'", "'no-such-dir' does not exist"),
    ),
    "empty-id-run": (("run", "wf.yaml", "--id", ""), ("workflow id '' is not valid",)),
    "empty-id-submit": (("submit", "wf.yaml", "--id", ""), ("workflow id '' is not valid",)),
}


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[DagqCli]:
    with DagqCli(tmp_path) as cli:
        cli.write("wf.yaml", "name: wf\ntasks: [{name: a, cmd: 'true'}]\n")
        yield cli


@pytest.mark.parametrize("case", USAGE_ERRORS.values(), ids=USAGE_ERRORS.keys())
def test_usage_errors_are_one_line_of_dagqs_style(
    cli: DagqCli, case: tuple[tuple[str, ...], tuple[str, ...]]
) -> None:
    args, mentions = case

    result = cli.run(*args)

    assert_one_clear_line(result, *mentions)
    assert result.stdout == ""
    assert "Usage:" not in result.output


def test_an_empty_id_stores_nothing(cli: DagqCli) -> None:
    cli.run("submit", "wf.yaml", "--id", "")

    assert cli.json("list") == []


def test_a_call_that_is_not_module_colon_function_says_what_is_expected(cli: DagqCli) -> None:
    cli.write("bad.yaml", "name: bad\ntasks: [{name: a, call: notamodule}]\n")

    result = cli.run("validate", "bad.yaml")

    assert_one_clear_line(result, "bad.yaml", "tasks[0] 'a'.call", "expected MODULE:FUNCTION")


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version_flags_print_the_installed_version(cli: DagqCli, flag: str) -> None:
    import dagq

    result = cli.run(flag)

    assert result.code == 0, result.output
    assert result.stdout == f"dagq {dagq.__version__}\n"
    assert dagq.__version__[0].isdigit()


def test_python_dash_m_dagq_is_the_dagq_command(cli: DagqCli) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "dagq", "validate", "wf.yaml"],
        cwd=cli.workdir,
        env=cli.env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    usage = subprocess.run(
        [sys.executable, "-m", "dagq", "run"],
        cwd=cli.workdir,
        env=cli.env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )

    assert done.returncode == 0, done.stderr
    assert "wf.yaml: ok" in done.stdout
    assert usage.returncode == 2
    assert usage.stderr.startswith("error: missing argument 'FILE' — see 'dagq run --help'")
