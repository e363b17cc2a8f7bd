"""`dagq schema`: the JSON Schema of workflow files.

Imported only when the command runs or shows its help (see :mod:`dagq.cli`)."""

from __future__ import annotations

import click


@click.command()
def schema() -> None:
    """Print the JSON Schema of workflow files (for editor completion)."""
    import json

    from dagq.definition import json_schema

    click.echo(json.dumps(json_schema(), indent=2))
