"""The ``dagq`` command: a thin adapter over the library.

Each command lives in a module of :mod:`dagq.cli.commands`, imported only when that
command runs or its help is shown (click's lazy group pattern: ``COMMANDS`` names them),
and heavy modules are imported inside the commands, so a command starts without building
every other command's options or importing what it does not use.
Exit codes: 0 success, 1 the workflow failed or was cancelled, 2 usage or
validation error.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
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
        metavar="URL",
        envvar="DAGQ_STORE",
        default=DEFAULT_STORE,
        show_default=True,
        help="Where state lives: sqlite:///relative/path.db or sqlite:////absolute/path.db "
        "(one file, several processes), azure://ACCOUNT/PREFIX (Azure Storage; pip install "
        "'dagq[azure]'), postgresql://USER@HOST:PORT/DATABASE[?schema=NAME] (PostgreSQL; "
        "pip install 'dagq[postgres]'), memory:// (this process only); env DAGQ_STORE.",
    )(function)


def processor_option(function: F) -> F:
    """``--processor MODULE:FUNCTION``: ai4s-jobq's custom processor."""
    return click.option(
        "--processor",
        default=None,
        metavar="MODULE:FUNCTION",
        help="The function that runs tasks saying what to run only through their kwargs "
        "(ai4s-jobq's custom processor): it gets the kwargs as keyword arguments, and "
        "returns the output.",
    )(function)


def metrics_port_option(function: F) -> F:
    """``--metrics-port``: serve Prometheus metrics (the long-running commands)."""
    return click.option(
        "--metrics-port",
        type=click.IntRange(1, 65535),
        default=None,
        envvar="DAGQ_METRICS_PORT",
        help="Serve Prometheus metrics on this port at /metrics (127.0.0.1, or "
        "DAGQ_METRICS_ADDR); needs dagq[otel]. Traces: the OTEL_* variables (README).",
    )(function)


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    """Print one clear line to stderr and exit."""
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


class OneLineUsageError(click.UsageError):
    """A usage error of click's (a bad option, a missing argument) in dagq's style:
    one line, ``error: …``, exit 2 — as every other error of the command."""

    def __init__(self, cause: click.UsageError) -> None:
        message = " ".join(cause.format_message().split()).replace(". (Did", " (did")
        message = message.replace(". Did you mean", "; did you mean")
        message = message[:1].lower() + message[1:]
        path = cause.ctx.command_path if cause.ctx is not None else "dagq"
        super().__init__(f"{message.rstrip('.')} — see '{path} --help'", cause.ctx)

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


# Each command's name -> "module:attribute" under dagq.cli.commands.
COMMANDS = {
    "run": "run:run",
    "validate": "validate:validate",
    "completion": "completion:completion",
    "schema": "schema:schema",
    "coordinator": "processes:coordinator",
    "worker": "processes:worker",
    "server": "processes:server",
    "workers": "processes:workers",
    "submit": "control:submit",
    "cancel": "control:cancel",
    "retry": "control:retry",
    "signal": "control:signal",
    "status": "status:status",
    "summary": "status:summary",
    "explain": "status:explain",
    "list": "looking:list_",
    "tasks": "looking:tasks",
    "output": "looking:output",
    "logs": "looking:logs",
    "events": "looking:events",
    "graph": "looking:graph",
    "doctor": "store:doctor",
    "purge": "store:purge",
    "quarantine": "store:quarantine_group",
    "dlq": "store:dlq",
    "token": "store:token_group",
    "config": "store:config_group",
    "store": "store:store_group",
}


class DagqGroup(click.Group):
    """The ``dagq`` group: lists the commands of ``COMMANDS`` and imports one's module only
    when it is looked up (to run, or to show help); renders click's usage errors as dagq's
    own one-line errors."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """``dagq`` as its own process runs it (the console script, ``python -m dagq``):
        what is alive as it exits is left to the exit, not collected once more
        (:func:`dagq.garbage.exiting`), and ``dagq run`` launches its zygote before it
        parses anything (:mod:`dagq.cli.early`). Called with the arguments to parse (a
        test's), or not to exit, it is :meth:`main` alone."""
        if args or "args" in kwargs or not kwargs.get("standalone_mode", True):
            return self.main(*args, **kwargs)
        if sys.argv[1:2] == ["run"]:
            from dagq.cli.early import launch_zygote

            launch_zygote(sys.argv[1:])  # of Python tasks: their zygote boots meanwhile
        try:
            return self.main(*args, **kwargs)
        finally:
            from dagq import garbage

            garbage.exiting()

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            module, _, attribute = COMMANDS[cmd_name].partition(":")
            # __import__ (not importlib's): -X importtime sees what it imports.
            found = __import__(f"dagq.cli.commands.{module}", fromlist=[attribute])
            command = getattr(found, attribute)
            self.add_command(command, cmd_name)
        return super().get_command(ctx, cmd_name)

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.UsageError as exc:
            raise OneLineUsageError(exc) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.UsageError as exc:
            if isinstance(exc, OneLineUsageError):
                raise
            raise OneLineUsageError(exc) from None


@click.group(cls=DagqGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(None, "-V", "--version", package_name="dagq", message="%(prog)s %(version)s")
@click.pass_context
def main(ctx: click.Context) -> None:
    """dagq: durable workflows of tasks, from one laptop to a fleet."""
    if ctx.invoked_subcommand in ("config", "completion"):  # no settings needed (config
        return  # reads, or replaces, a broken file itself)
    from dagq import config
    from dagq.cli.settings import default_map
    from dagq.errors import DagqError

    try:
        overridden = config.load().overridden()
    except DagqError as exc:
        fail(str(exc))
    if overridden and ctx.invoked_subcommand is not None:
        ctx.default_map = default_map(main, overridden, ctx.invoked_subcommand)


def json_option(function: F) -> F:
    """``--json``: stable machine-readable output."""
    return click.option("--json", "as_json", is_flag=True, help="Print JSON (stable fields).")(
        function
    )


def yes_option(function: F) -> F:
    """``--yes``: do a destructive bulk action without asking."""
    return click.option(
        "-y", "--yes", is_flag=True, help="Do not ask for confirmation (needed without a terminal)."
    )(function)


def _exit(run: Callable[[], int]) -> NoReturn:
    """Run a command's body and exit with its code; a dagq error is one line, exit 2
    (never a traceback)."""
    from dagq.errors import DagqError

    try:
        code = run()
    except DagqError as exc:
        click.echo(f"error: {exc}", err=True)
        code = EXIT_USAGE
    sys.exit(code)
