"""``dagq config init|show``, and the configuration applied to every command's defaults.

The settings reach the commands through click's ``default_map``: a flag beats an
environment variable (``--store`` over ``DAGQ_STORE``), which beats the files, which beat
the built-in defaults (see :mod:`dagq.config`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from dagq import config
from dagq.errors import UsageError


def default_map(
    group: click.Group, overridden: dict[str, Any], only: str | None = None
) -> dict[str, Any]:
    """Defaults for every command of ``group`` (and its subgroups) that takes a setting —
    or for the one named ``only`` (so that the other commands' modules stay unimported):
    ``store`` for each ``--store``, ``run.X`` / ``worker.X`` for that command's ``X``."""
    found: dict[str, Any] = {}
    ctx = click.Context(group)
    names = [only] if only is not None else group.list_commands(ctx)
    for name in names:
        command = group.get_command(ctx, name)
        if command is None:
            continue
        if isinstance(command, click.Group):
            nested = default_map(command, overridden)
            if nested:
                found[name] = nested
            continue
        params = {p.name for p in command.params}
        values: dict[str, Any] = {}
        if "store_url" in params and "store" in overridden:
            values["store_url"] = overridden["store"]
        for key, value in overridden.items():
            section, _, field = key.partition(".")
            if section == name and field in params:
                values[field] = value
        if values:
            found[name] = values
    return found


def run_init(*, user: bool, force: bool, store: str) -> int:
    """``dagq config init``: write a commented file (the project's, or the user's)."""
    path = config.user_file() if user else Path.cwd() / config.PROJECT_NAMES[0]
    if path.exists() and not force:
        raise UsageError(f"{path} exists already; pass --force to replace it")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(config.template(store), encoding="utf-8")
    click.echo(f"wrote {path}")
    return 0


def run_show(*, as_json: bool) -> int:
    """``dagq config show``: each setting, its value, and where it came from."""
    settings = config.load()
    if as_json:
        import msgspec

        click.echo(msgspec.json.encode(settings).decode())
        return 0
    if settings.files:
        click.echo("files: " + ", ".join(settings.files))
    else:
        click.echo(
            f"files: none (looked for {' or '.join(config.PROJECT_NAMES)} here and in the "
            f"parent directories, and {config.user_file()})"
        )
    width = max(len(s.key) for s in settings.settings)
    for setting in settings.settings:
        value = json.dumps(setting.value) if not isinstance(setting.value, str) else setting.value
        click.echo(f"{setting.key:<{width}}  {value}  ({setting.source})")
    return 0
