"""Asking before a destructive bulk command (``dlq purge --all``, ``purge --older-than``).

On a terminal the command asks; anywhere else (a pipe, a script, cron) it needs
``--yes``, so a mistyped line in a script is refused instead of removing everything.
"""

from __future__ import annotations

import sys

import click

from dagq.errors import UsageError

#: The exit code of a command the person declined at the prompt: nothing was done.
EXIT_DECLINED = 1


def confirm(action: str, *, yes: bool) -> None:
    """Go on if ``yes`` or the person at the terminal says so; else refuse (exit 2
    without a terminal, exit 1 when declined)."""
    if yes:
        return
    if not sys.stdin.isatty():
        raise UsageError(f"{action} needs confirmation: pass --yes (no terminal to ask on)")
    if not click.confirm(f"{action}?", default=False, err=True):
        click.echo("nothing done", err=True)
        sys.exit(EXIT_DECLINED)
