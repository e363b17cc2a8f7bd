"""The ``dagq`` command: a thin adapter over the library.

Heavy modules are imported inside the commands so ``dagq --help`` starts fast.
Exit codes: 0 success, 1 the workflow failed or was cancelled, 2 usage or
validation error.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click

DEFAULT_STORE = "sqlite:///.dagq/dagq.db"
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

F = TypeVar("F", bound=Callable[..., Any])


def store_option(function: F) -> F:
    """``--store URL`` with ``DAGQ_STORE`` and a local SQLite file as fallbacks."""
    return click.option(
        "--store",
        "store_url",
        envvar="DAGQ_STORE",
        default=DEFAULT_STORE,
        show_default=True,
        help="Store URL (sqlite:///path.db, memory://); env DAGQ_STORE.",
    )(function)


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    """Print one clear line to stderr and exit."""
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="dagq")
def main() -> None:
    """dagq: durable workflows of tasks, from one laptop to a fleet."""


@main.command()
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "-p",
    "--param",
    "params",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a param (repeatable); the value is parsed as JSON if it can be.",
)
@click.option(
    "--workers",
    default=4,
    show_default=True,
    type=click.IntRange(1, 1024),
    help="How many tasks run at once.",
)
@click.option(
    "--id",
    "workflow_id",
    default=None,
    help="Name the run; the same id again resumes it or reports its result.",
)
@store_option
@click.option("--quiet", is_flag=True, help="No live progress; only the summary.")
def run(
    *,
    file: Path,
    params: tuple[str, ...],
    workers: int,
    workflow_id: str | None,
    store_url: str,
    quiet: bool,
) -> None:
    """Run a workflow FILE (YAML, JSON or Python) in this process until it ends."""
    from dagq.cli.run import run_command

    sys.exit(run_command(file, params, workers, workflow_id, store_url, quiet=quiet))


@main.command()
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
def validate(*, file: Path) -> None:
    """Check a workflow FILE and report the first problem found."""
    from dagq.cli.run import load_definition
    from dagq.errors import DagqError

    try:
        definition = load_definition(file)
    except DagqError as exc:
        fail(str(exc))
    click.echo(f"{file}: ok — workflow '{definition.name}', {len(definition.tasks)} tasks")


@main.command()
def schema() -> None:
    """Print the JSON Schema of workflow files (for editor completion)."""
    import json

    from dagq.definition import json_schema

    click.echo(json.dumps(json_schema(), indent=2))


def entry() -> None:
    """Console-script entry point with a friendly stance on Ctrl-C and broken pipes."""
    try:
        main()
    except BrokenPipeError:
        os._exit(EXIT_OK)
