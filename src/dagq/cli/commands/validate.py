"""`dagq validate`: check a workflow FILE.

Imported only when the command runs or shows its help (see :mod:`dagq.cli`)."""

from __future__ import annotations

from pathlib import Path

import click

from dagq.cli import (
    fail,
)


@click.command()
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
def validate(*, file: Path) -> None:
    """Check a workflow FILE and report the first problem found.

    A valid file also gets the rule set it runs with (ai4s-jobq's or dagq's, and why)
    and a warning for each thing it says that has no effect (exit 0 all the same).
    """
    from dagq.cli.definitions import load_definition
    from dagq.cli.printable import printable
    from dagq.definition import rule_set
    from dagq.errors import DagqError
    from dagq.params import describe_params
    from dagq.validation import warnings

    try:
        definition = load_definition(file)
    except DagqError as exc:
        fail(str(exc))
    for warning in warnings(definition):
        click.echo(f"warning: {file}: {warning}", err=True)
    name = printable(definition.name, one_line=True)
    click.echo(f"{file}: ok — workflow '{name}', {len(definition.tasks)} tasks")
    click.echo(f"  {rule_set(definition).describe()}")
    if definition.params:
        click.echo(f"  params: {describe_params(definition.params)}")
