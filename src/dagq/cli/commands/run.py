"""`dagq run`: a workflow FILE in this process until it ends.

Imported only when the command runs or shows its help (see :mod:`dagq.cli`)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from dagq.cli import (
    metrics_port_option,
    processor_option,
    store_option,
)
from dagq.cli.log_output import LogFormat, log_options
from dagq.cli.log_output import configure as configure_logging


@click.command()
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
@click.option(
    "--quiet",
    is_flag=True,
    help="No live progress and no task table: the result in one line (a failure names "
    "its failed tasks on a second).",
)
@processor_option
@metrics_port_option
@log_options("warning")
def run(
    *,
    file: Path,
    params: tuple[str, ...],
    workers: int,
    workflow_id: str | None,
    store_url: str,
    quiet: bool,
    processor: str | None,
    log_level: str,
    log_format: LogFormat,
    metrics_port: int | None,
) -> None:
    """Run a workflow FILE (YAML, JSON or Python) in this process until it ends."""
    from dagq.cli.run import run_command

    configure_logging(log_level, log_format)

    sys.exit(
        run_command(
            file,
            params,
            workers,
            workflow_id,
            store_url,
            quiet=quiet,
            processor=processor,
            metrics_port=metrics_port,
        )
    )
