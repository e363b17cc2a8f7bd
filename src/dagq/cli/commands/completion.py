"""`dagq completion`: the shell completion script.

Imported only when the command runs or shows its help (see :mod:`dagq.cli`)."""

from __future__ import annotations

import click


@click.command()
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion(*, shell: str) -> None:
    """Print the shell completion script for SHELL (commands, options, choices).

    \b
    bash:  eval "$(dagq completion bash)"   (in ~/.bashrc)
    zsh:   eval "$(dagq completion zsh)"    (in ~/.zshrc)
    fish:  dagq completion fish > ~/.config/fish/completions/dagq.fish
    """
    from click.shell_completion import get_completion_class

    from dagq.cli import main

    completer = get_completion_class(shell)
    assert completer is not None  # the choice admits only shells click supports
    click.echo(completer(main, {}, "dagq", "_DAGQ_COMPLETE").source())
