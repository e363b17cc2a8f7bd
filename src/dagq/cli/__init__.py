"""The ``dagq`` command: a thin adapter over the library.

Heavy modules are imported inside the commands so ``dagq --help`` starts fast.
Exit codes: 0 success, 1 the workflow failed or was cancelled, 2 usage or
validation error.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, NoReturn, TypeVar

import click

from dagq.cli.log_output import LogFormat, log_options
from dagq.cli.log_output import configure as configure_logging

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


PROCESSOR_HELP = (
    "The function that runs tasks saying what to run only through their kwargs "
    "(ai4s-jobq's custom processor): it gets the kwargs as keyword arguments, and "
    "returns the output."
)


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


class DagqGroup(click.Group):
    """The ``dagq`` group: renders click's usage errors as dagq's own one-line errors."""

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
    if overridden:
        ctx.default_map = default_map(main, overridden)


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
@click.option(
    "--quiet",
    is_flag=True,
    help="No live progress and no task table: the result in one line (a failure names "
    "its failed tasks on a second).",
)
@click.option(
    "--processor",
    default=None,
    metavar="MODULE:FUNCTION",
    help=PROCESSOR_HELP,
)
@click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    default=None,
    envvar="DAGQ_METRICS_PORT",
    help="Serve Prometheus metrics on this port at /metrics (127.0.0.1, or "
    "DAGQ_METRICS_ADDR); needs dagq[otel]. Traces: the OTEL_* variables (README).",
)
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


@main.command()
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


@main.command()
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion(*, shell: str) -> None:
    """Print the shell completion script for SHELL (commands, options, choices).

    \b
    bash:  eval "$(dagq completion bash)"   (in ~/.bashrc)
    zsh:   eval "$(dagq completion zsh)"    (in ~/.zshrc)
    fish:  dagq completion fish > ~/.config/fish/completions/dagq.fish
    """
    from click.shell_completion import get_completion_class

    completer = get_completion_class(shell)
    assert completer is not None  # the choice admits only shells click supports
    click.echo(completer(main, {}, "dagq", "_DAGQ_COMPLETE").source())


@main.command()
def schema() -> None:
    """Print the JSON Schema of workflow files (for editor completion)."""
    import json

    from dagq.definition import json_schema

    click.echo(json.dumps(json_schema(), indent=2))


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


# --- long-running processes --------------------------------------------------------------


@main.command()
@store_option
@click.option("--break-lease", is_flag=True, help="Take over from a coordinator that died.")
@click.option(
    "--log-interval",
    default=10.0,
    show_default=True,
    type=click.FloatRange(0.1),
    help="Seconds between throughput/backlog log lines.",
)
@click.option(
    "--lease-ttl",
    default=30.0,
    show_default=True,
    type=click.FloatRange(1.0),
    help="Seconds the coordinator lease lasts unless renewed (renewed every third of it); "
    "a coordinator that cannot renew stops before it expires.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    default=None,
    envvar="DAGQ_METRICS_PORT",
    help="Serve Prometheus metrics on this port at /metrics (127.0.0.1, or "
    "DAGQ_METRICS_ADDR); needs dagq[otel]. Traces: the OTEL_* variables (README).",
)
@log_options("info")
def coordinator(
    *,
    metrics_port: int | None,
    store_url: str,
    break_lease: bool,
    log_interval: float,
    lease_ttl: float,
    log_level: str,
    log_format: LogFormat,
) -> None:
    """Advance every workflow of the store until stopped (SIGTERM/SIGINT: graceful)."""
    from dagq.cli.serve import run_coordinator

    configure_logging(log_level, log_format)

    _exit(
        lambda: run_coordinator(
            store_url,
            break_lease=break_lease,
            log_interval_s=log_interval,
            lease_ttl_s=lease_ttl,
            metrics_port=metrics_port,
        )
    )


@main.command()
@store_option
@click.option(
    "-q",
    "--queue",
    "queues",
    multiple=True,
    default=("default",),
    show_default=True,
    help="A queue to serve (repeatable).",
)
@click.option(
    "-c",
    "--concurrency",
    default=4,
    show_default=True,
    type=click.IntRange(1, 4096),
    help="How many tasks run at once.",
)
@click.option(
    "--import-path",
    "import_paths",
    multiple=True,
    type=click.Path(file_okay=False, exists=True),
    help="A directory to import Python tasks from (repeatable; it must exist).",
)
@click.option(
    "--idle-timeout",
    type=click.FloatRange(0),
    default=None,
    help="Exit after this many seconds without work.",
)
@click.option(
    "--visibility-timeout",
    default=60.0,
    show_default=True,
    type=click.FloatRange(1),
    help="Seconds a task's message stays hidden per heartbeat.",
)
@click.option(
    "--grace",
    default=30.0,
    show_default=True,
    type=click.FloatRange(0),
    help="On SIGTERM, seconds running tasks get to finish before being released.",
)
@click.option(
    "--backlog",
    type=click.IntRange(0),
    default=None,
    help="Tasks of a bundle kept beyond the free slots, started as slots free up "
    "(default: as many as -c; 0 gives every extra task back at once).",
)
@click.option(
    "--isolation",
    type=click.Choice(["process", "thread"]),
    default="process",
    show_default=True,
    help="Where Python tasks run: pool processes (a crash or hang kills only its task) "
    "or this worker's threads (trusted code only: a crash stops the worker, a sync task "
    "past its timeout cannot be stopped).",
)
@click.option("--processor", default=None, metavar="MODULE:FUNCTION", help=PROCESSOR_HELP)
@click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    default=None,
    envvar="DAGQ_METRICS_PORT",
    help="Serve Prometheus metrics on this port at /metrics (127.0.0.1, or "
    "DAGQ_METRICS_ADDR); needs dagq[otel]. Traces: the OTEL_* variables (README).",
)
@log_options("info")
@click.option(
    "--heartbeat",
    default=3.0,
    show_default=True,
    type=click.FloatRange(0.1, 3600),
    help="Seconds between rewrites of this worker's record (dagq workers); it counts "
    "as gone after 3 missed.",
)
def worker(
    *,
    metrics_port: int | None,
    log_level: str,
    log_format: LogFormat,
    store_url: str,
    queues: tuple[str, ...],
    concurrency: int,
    import_paths: tuple[str, ...],
    idle_timeout: float | None,
    visibility_timeout: float,
    grace: float,
    backlog: int | None,
    isolation: Literal["process", "thread"],
    processor: str | None,
    heartbeat: float,
) -> None:
    """Run tasks from the given queues until stopped (SIGTERM: finish, then release)."""
    from dagq.cli.serve import run_worker
    from dagq.runners.python import add_import_paths, check_processor
    from dagq.validation import check_queue_name
    from dagq.worker import WorkerOptions

    configure_logging(log_level, log_format)

    def body() -> int:
        for queue in queues:
            check_queue_name(queue)
        paths = (*import_paths, str(Path.cwd()))
        if processor is not None:
            add_import_paths(paths)
            check_processor(processor)
        options = WorkerOptions(
            queues=queues,
            concurrency=concurrency,
            processor=processor,
            import_paths=paths,
            idle_timeout_s=idle_timeout,
            visibility_timeout_s=visibility_timeout,
            shutdown_grace_s=grace,
            backlog=backlog,
            isolation=isolation,
            heartbeat_s=heartbeat,
        )
        return run_worker(store_url, options, metrics_port=metrics_port)

    _exit(body)


@main.command()
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to bind; any but loopback (127.0.0.1, ::1, localhost) requires tokens.",
)
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535))
@click.option(
    "--auth",
    is_flag=True,
    help="Require a token (Authorization: Bearer) on loopback too; see 'dagq token'.",
)
@store_option
@click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    default=None,
    envvar="DAGQ_METRICS_PORT",
    help="Serve Prometheus metrics on this port at /metrics (127.0.0.1, or "
    "DAGQ_METRICS_ADDR); needs dagq[otel]. Traces: the OTEL_* variables (README).",
)
@log_options("info")
def server(
    *,
    host: str,
    port: int,
    auth: bool,
    store_url: str,
    metrics_port: int | None,
    log_level: str,
    log_format: LogFormat,
) -> None:
    """Serve the HTTP job API (/v1; OpenAPI at /docs) until SIGTERM; needs dagq[server]."""
    from dagq import observability
    from dagq.server.runner import run_server

    configure_logging(log_level, log_format)

    def body() -> int:
        observability.start("server", metrics_port)
        observability.ready()  # up before it listens (its exporter is made in start)
        try:
            return run_server(
                store_url,
                host=host,
                port=port,
                auth=auth,
                log_level=log_level,
                log_format=log_format,
            )
        finally:
            observability.stop()

    _exit(body)


@main.command()
@store_option
@json_option
def workers(*, store_url: str, as_json: bool) -> None:
    """Live workers: id, host, pid, queues, running tasks, version, started, last seen."""
    from dagq.cli.workers import run_workers

    _exit(lambda: run_workers(store_url, as_json=as_json))


# --- submitting and controlling ------------------------------------------------------------


@main.command()
@click.argument("files", nargs=-1, required=True, metavar="FILE...")
@click.option(
    "-p",
    "--param",
    "params",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a param (repeatable; for every file).",
)
@click.option(
    "--id", "workflow_id", default=None, help="Name the workflow (idempotent; one FILE only)."
)
@click.option(
    "--wait",
    is_flag=True,
    help="Wait for the run(s) to end and print each final status; exit 0 if completed, "
    "1 if not, 3 at --timeout.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(0),
    default=None,
    metavar="S",
    help="With --wait: give up waiting after S seconds (exit 3; the run goes on).",
)
@store_option
@json_option
def submit(
    *,
    files: tuple[str, ...],
    params: tuple[str, ...],
    workflow_id: str | None,
    wait: bool,
    timeout: float | None,
    store_url: str,
    as_json: bool,
) -> None:
    """Submit workflow FILEs to the store's coordinator; prints each id.

    FILE '-' reads the paths of the files from standard input, one per line.
    """
    import contextlib
    import io

    from dagq import observability
    from dagq.cli.control import run_submit_many
    from dagq.cli.waiting import wait_for_runs

    if timeout is not None and not wait:
        fail("--timeout goes with --wait")

    def body() -> int:
        observability.start("client")  # a run's trace begins with its submit span
        try:
            return submit_all()
        finally:
            observability.stop()

    def submit_all() -> int:
        ids: list[str] = []
        # --wait --json prints one document, the final statuses: the ids are in them.
        quiet = contextlib.redirect_stdout(io.StringIO()) if wait and as_json else None
        with quiet or contextlib.nullcontext():
            code = run_submit_many(
                store_url, files, params, workflow_id=workflow_id, as_json=as_json, ids=ids
            )
        if not wait or not ids:
            return code
        return max(code, wait_for_runs(store_url, ids, timeout_s=timeout, as_json=as_json))

    _exit(body)


@main.command()
@click.argument("workflow_id")
@store_option
def cancel(*, workflow_id: str, store_url: str) -> None:
    """Cancel a workflow: pending tasks at once, running ones are stopped."""
    from dagq.cli.control import run_cancel

    _exit(lambda: run_cancel(store_url, workflow_id))


@main.command()
@click.argument("workflow_id")
@click.option("--task", "tasks", multiple=True, help="Only this task (repeatable).")
@click.option(
    "--run",
    "here",
    is_flag=True,
    help="Drive the retried run in this process, as dagq run does (no coordinator or "
    "workers needed).",
)
@click.option(
    "--workers",
    default=4,
    show_default=True,
    type=click.IntRange(1, 1024),
    help="With --run: how many tasks run at once.",
)
@click.option(
    "--import-path",
    "import_paths",
    multiple=True,
    type=click.Path(file_okay=False, exists=True),
    help="With --run: a directory to import Python tasks from (repeatable).",
)
@click.option("--quiet", is_flag=True, help="With --run: no live progress; the result in one line.")
@store_option
def retry(
    *,
    workflow_id: str,
    tasks: tuple[str, ...],
    here: bool,
    workers: int,
    import_paths: tuple[str, ...],
    quiet: bool,
    store_url: str,
) -> None:
    """Re-run the failed, upstream_failed and cancelled tasks of a finished workflow.

    A coordinator and workers take the retried run up; with --run, this process does.
    """
    from dagq.cli.control import run_retry

    if here:
        from dagq.cli.run import retry_run_command

        sys.exit(
            retry_run_command(
                store_url,
                workflow_id,
                list(tasks),
                workers=workers,
                import_paths=import_paths,
                quiet=quiet,
            )
        )
    _exit(lambda: run_retry(store_url, workflow_id, list(tasks)))


# --- looking -------------------------------------------------------------------------------


@main.command()
@click.argument("workflow_id")
@click.option(
    "--watch",
    is_flag=True,
    help="Refresh until it ends (piped: one line per interval); exit with its code.",
)
@click.option(
    "--interval",
    default=2.0,
    show_default=True,
    type=click.FloatRange(0.1),
    metavar="S",
    help="With --watch: seconds between refreshes.",
)
@click.option("--by-layer", is_flag=True, help="Progress per layer of the DAG (dagq summary).")
@store_option
@json_option
def status(
    *,
    workflow_id: str,
    watch: bool,
    interval: float,
    by_layer: bool,
    store_url: str,
    as_json: bool,
) -> None:
    """State, counts, progress, rate, ETA (or what it waits for) and failed tasks."""
    from dagq.cli.status import run_status

    given = click.get_current_context().get_parameter_source("interval")
    if not watch and given is not click.core.ParameterSource.DEFAULT:
        fail("--interval needs --watch (it is the time between refreshes)")
    if by_layer:
        if watch:
            fail("--by-layer and --watch cannot be combined")
        summary_command(workflow_id, store_url, as_json)
    _exit(
        lambda: run_status(
            store_url, workflow_id, watch=watch, as_json=as_json, interval_s=interval
        )
    )


@main.command()
@click.argument("workflow_id")
@store_option
@json_option
def summary(*, workflow_id: str, store_url: str, as_json: bool) -> None:
    """Progress per layer of the DAG (depth: the longest path from a root)."""
    summary_command(workflow_id, store_url, as_json)


def summary_command(workflow_id: str, store_url: str, as_json: bool) -> NoReturn:
    """``dagq summary`` (also ``dagq status --by-layer``)."""
    from dagq.cli.explain import run_summary

    _exit(lambda: run_summary(store_url, workflow_id, as_json=as_json))


@main.command()
@click.argument("workflow_id")
@click.argument("task")
@store_option
@json_option
def explain(*, workflow_id: str, task: str, store_url: str, as_json: bool) -> None:
    """Why TASK is in its state: policy, parents, condition, retries, what it waits for."""
    from dagq.cli.explain import run_explain

    _exit(lambda: run_explain(store_url, workflow_id, task, as_json=as_json))


@main.command(name="list")
@click.option("--status", "status_filter", default=None, help="Only workflows in this state.")
@click.option("--name", default=None, help="Only workflows with this name.")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 100_000))
@click.option(
    "--recent",
    type=click.IntRange(1, 100_000),
    default=None,
    metavar="N",
    help="The N newest (the same as --limit N).",
)
@store_option
@json_option
def list_(
    *,
    status_filter: str | None,
    name: str | None,
    limit: int,
    recent: int | None,
    store_url: str,
    as_json: bool,
) -> None:
    """Workflows, newest first."""
    from dagq.cli.workflow_list import run_list

    limit = recent if recent is not None else limit
    _exit(
        lambda: run_list(store_url, status=status_filter, name=name, limit=limit, as_json=as_json)
    )


@main.command()
@click.argument("workflow_ids", nargs=-1, metavar="[ID]...")
@click.option("--state", "--status", "state", default=None, help="Only tasks in this state.")
@click.option("--queue", default=None, help="Only tasks of this queue.")
@click.option("--prefix", default=None, help="Only tasks whose name starts with this.")
@click.option(
    "--limit",
    type=click.IntRange(0),
    default=None,
    help="At most this many tasks, 0 for all (default: all of the IDs given; 100 without).",
)
@click.option(
    "--instances",
    is_flag=True,
    help="Also list each foreach task's instances (name[0], name[1], ...), of one ID.",
)
@store_option
@json_option
def tasks(
    *,
    workflow_ids: tuple[str, ...],
    state: str | None,
    queue: str | None,
    prefix: str | None,
    limit: int | None,
    instances: bool,
    store_url: str,
    as_json: bool,
) -> None:
    """Tasks of workflows (of every recent one without ID): state, attempt, queue, timing,
    error."""
    from dagq.cli.inspect import TaskFilter, run_tasks

    if instances and len(workflow_ids) != 1:
        fail("--instances lists the instances of one workflow: give exactly one ID")
    wanted = TaskFilter(state=state, queue=queue, prefix=prefix, limit=limit, instances=instances)
    _exit(lambda: run_tasks(store_url, list(workflow_ids), wanted, as_json=as_json))


@main.command()
@click.argument("workflow_id")
@click.argument("task")
@store_option
def output(*, workflow_id: str, task: str, store_url: str) -> None:
    """The output of a completed task, as JSON (of one instance: 'TASK[2]')."""
    from dagq.cli.inspect import run_output

    name, item, undo = _attempt_name(task, item=None, undo=False)
    if undo:
        fail(f"TASK '{task}': a compensation has no output")
    _exit(lambda: run_output(store_url, workflow_id, name, item=item))


def _attempt_name(task: str, *, item: int | None, undo: bool) -> tuple[str, int, bool]:
    """TASK as typed — ``name``, ``name[2]`` (an instance), ``name#undo`` — merged with
    ``--item`` / ``--undo``."""
    from dagq.keys import split_attempt_name

    name, index, compensation = split_attempt_name(task)
    if item is not None and index >= 0 and item != index:
        fail(f"TASK '{task}' names instance {index} but --item says {item}")
    return name, item if item is not None else index, undo or compensation


@main.command()
@click.argument("workflow_id")
@click.argument("task")
@click.option("--attempt", type=click.IntRange(1), default=None, help="Default: the latest.")
@click.option(
    "--item", type=click.IntRange(0), default=None, help="One instance of a foreach task."
)
@click.option("--undo", is_flag=True, help="The task's compensation.")
@click.option(
    "-f",
    "--follow",
    is_flag=True,
    help="Print the attempt's output as it comes (waiting for it to start), until it "
    "ends; exit 0 if it completed, 1 if not.",
)
@store_option
def logs(
    *,
    workflow_id: str,
    task: str,
    attempt: int | None,
    item: int | None,
    undo: bool,
    follow: bool,
    store_url: str,
) -> None:
    """The kept stdout/stderr of a task's attempt, then its whole error text.

    TASK may name one instance of a foreach task ('TASK[2]') or a compensation
    ('TASK#undo').
    """
    from dagq.cli.follow import run_follow
    from dagq.cli.inspect import run_logs

    name, index, undo = _attempt_name(task, item=item, undo=undo)
    if follow:
        _exit(
            lambda: run_follow(store_url, workflow_id, name, attempt=attempt, item=index, undo=undo)
        )
    _exit(lambda: run_logs(store_url, workflow_id, name, attempt=attempt, item=index, undo=undo))


@main.command()
@click.argument("workflow_id")
@click.option(
    "--task",
    default=None,
    help="Only what concerns this task (with its instances and compensation), or one "
    "instance ('TASK[2]').",
)
@store_option
@json_option
def events(*, workflow_id: str, task: str | None, store_url: str, as_json: bool) -> None:
    """The history of a workflow: what happened, when, to which task, and why."""
    from dagq.cli.inspect import run_events

    _exit(lambda: run_events(store_url, workflow_id, task=task, as_json=as_json))


@main.command()
@click.argument("target")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "mermaid", "dot"]),
    default="text",
    show_default=True,
)
@store_option
def graph(*, target: str, fmt: str, store_url: str) -> None:
    """Draw a workflow FILE, or a submitted workflow ID with its task states."""
    from dagq.cli.control import run_graph

    _exit(lambda: run_graph(store_url, target, fmt))


# --- looking after the store --------------------------------------------------------------


@main.command()
@store_option
@json_option
def doctor(*, store_url: str, as_json: bool) -> None:
    """Check the store, coordinator, queues and workflows; suggest a fix for each problem."""
    from dagq.cli.admin import run_doctor

    _exit(lambda: run_doctor(store_url, as_json=as_json))


@main.command()
@click.argument("workflow_id", required=False)
@click.option(
    "--older-than",
    "older_than",
    type=click.FloatRange(0),
    default=None,
    metavar="DAYS",
    help="Purge every finished workflow older than this.",
)
@click.option("--force", is_flag=True, help="Also purge an unfinished workflow.")
@yes_option
@store_option
def purge(
    *, workflow_id: str | None, older_than: float | None, force: bool, yes: bool, store_url: str
) -> None:
    """Remove a workflow's state, outputs, logs and index row (finished ones only).

    --older-than asks for confirmation on a terminal, and needs --yes elsewhere.
    """
    from dagq.cli.admin import run_purge

    _exit(
        lambda: run_purge(store_url, workflow_id, older_than_days=older_than, force=force, yes=yes)
    )


@main.group(name="quarantine")
def quarantine_group() -> None:
    """Workflows the coordinator set aside after their work failed: list, release."""


@quarantine_group.command("list")
@store_option
@json_option
def quarantine_list(*, store_url: str, as_json: bool) -> None:
    """Quarantined workflows: since when, at which step, why, how many events are kept."""
    from dagq.cli.quarantine import run_list

    _exit(lambda: run_list(store_url, as_json=as_json))


@quarantine_group.command("release")
@click.argument("workflow_id")
@store_option
def quarantine_release(*, workflow_id: str, store_url: str) -> None:
    """Let the coordinator try WORKFLOW_ID again, once the cause is fixed."""
    from dagq.cli.quarantine import run_release

    _exit(lambda: run_release(store_url, workflow_id))


@main.group()
def dlq() -> None:
    """Dead-lettered messages: list, show, replay after a fix, purge."""


@dlq.command("list")
@click.option("--queue", default=None, help="Only this queue's dead letters.")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 100_000))
@store_option
@json_option
def dlq_list(*, queue: str | None, limit: int, store_url: str, as_json: bool) -> None:
    """Dead letters, oldest first: key, queue, what they carried, why they died."""
    from dagq.cli.dlq import run_list

    _exit(lambda: run_list(store_url, queue, limit, as_json=as_json))


@dlq.command("show")
@click.argument("key")
@store_option
@json_option
def dlq_show(*, key: str, store_url: str, as_json: bool) -> None:
    """One dead letter: where it was, why, and its decoded content."""
    from dagq.cli.dlq import run_show

    _exit(lambda: run_show(store_url, key, as_json=as_json))


@dlq.command("replay")
@click.argument("keys", nargs=-1)
@click.option("--all", "every", is_flag=True, help="Every dead letter (of --queue).")
@click.option("--queue", default=None, help="With --all: only this queue's.")
@store_option
def dlq_replay(*, keys: tuple[str, ...], every: bool, queue: str | None, store_url: str) -> None:
    """Send dead letters back to their queues (after a fix), then remove them."""
    from dagq.cli.dlq import run_replay

    _exit(lambda: run_replay(store_url, keys, every=every, queue=queue))


@dlq.command("purge")
@click.argument("keys", nargs=-1)
@click.option("--all", "every", is_flag=True, help="Every dead letter (of --queue).")
@click.option("--queue", default=None, help="With --all: only this queue's.")
@yes_option
@store_option
def dlq_purge(
    *, keys: tuple[str, ...], every: bool, queue: str | None, yes: bool, store_url: str
) -> None:
    """Remove dead letters for good.

    --all asks for confirmation on a terminal, and needs --yes elsewhere.
    """
    from dagq.cli.dlq import run_purge

    _exit(lambda: run_purge(store_url, keys, every=every, queue=queue, yes=yes))


@main.command()
@click.argument("workflow_id")
@click.argument("name")
@click.option("--data", default=None, metavar="JSON", help="What the waiting task outputs.")
@store_option
def signal(*, workflow_id: str, name: str, data: str | None, store_url: str) -> None:
    """Send signal NAME (an approval, a decision) to a workflow; its waiting task completes."""
    from dagq.cli.control import run_signal

    _exit(lambda: run_signal(store_url, workflow_id, name, data))


@main.group(name="token")
def token_group() -> None:
    """Access tokens of 'dagq server': roles viewer, operator, admin; optional tenant."""


@token_group.command("create")
@click.option(
    "--role",
    required=True,
    metavar="ROLE",
    help="viewer (read), operator (also submit, cancel, retry, signal) or admin "
    "(also dead letters, purge, tokens).",
)
@click.option("--tenant", default="", help="See and act on only this tenant's workflows.")
@click.option(
    "--expires", default=None, metavar="DURATION", help="Expire after 90d, 12h, 30m, 1d12h..."
)
@click.option("--name", default="", help="Who or what holds it (shown in the audit trail).")
@store_option
@json_option
def token_create(
    *, role: str, tenant: str, expires: str | None, name: str, store_url: str, as_json: bool
) -> None:
    """Make a token and print it, once: the store keeps only its hash."""
    from dagq.cli.tokens import run_create

    _exit(
        lambda: run_create(
            store_url, role=role, tenant=tenant, expires=expires, name=name, as_json=as_json
        )
    )


@token_group.command("list")
@store_option
@json_option
def token_list(*, store_url: str, as_json: bool) -> None:
    """Every token: id, name, role, tenant, status (active, expired, revoked); no secrets."""
    from dagq.cli.tokens import run_list

    _exit(lambda: run_list(store_url, as_json=as_json))


@token_group.command("revoke")
@click.argument("token_id", metavar="ID")
@store_option
def token_revoke(*, token_id: str, store_url: str) -> None:
    """Revoke token ID: every server refuses it within 5 seconds."""
    from dagq.cli.tokens import run_revoke

    _exit(lambda: run_revoke(store_url, token_id))


@main.group(name="config")
def config_group() -> None:
    """The configuration file: store URL and defaults of run and worker."""


@config_group.command("init")
@click.option("--user", is_flag=True, help="Write the user's file, not ./dagq.yaml.")
@click.option("--force", is_flag=True, help="Replace an existing file.")
@click.option(
    "--store",
    "store_url",
    default=DEFAULT_STORE,
    show_default=True,
    help="The store URL to write into the file.",
)
def config_init(*, user: bool, force: bool, store_url: str) -> None:
    """Write a commented configuration file with the store URL and the defaults."""
    from dagq.cli.settings import run_init

    _exit(lambda: run_init(user=user, force=force, store=store_url))


@config_group.command("show")
@json_option
def config_show(*, as_json: bool) -> None:
    """The effective settings and where each comes from (default, a file, env)."""
    from dagq.cli.settings import run_show

    _exit(lambda: run_show(as_json=as_json))


@main.group(name="store")
def store_group() -> None:
    """The store as a whole: migrate its tables, copy it to another backend."""


@store_group.command("migrate")
@store_option
def store_migrate(*, store_url: str) -> None:
    """Create or upgrade a PostgreSQL store's tables (also done at first use), or
    convert an Azure store's index to this dagq's layout."""
    from dagq.cli.store_admin import run_migrate

    _exit(lambda: run_migrate(store_url))


@store_group.command("copy")
@click.argument("source_url", metavar="SRC")
@click.argument("destination_url", metavar="DST")
def store_copy(*, source_url: str, destination_url: str) -> None:
    """Copy the whole store SRC (definitions, states, history, index, pending messages,
    dead letters) into the new, empty store DST, e.g. a sqlite file into PostgreSQL.

    Stop the coordinator and the workers first; afterwards, point them at DST.
    """
    from dagq.cli.store_admin import run_copy

    _exit(lambda: run_copy(source_url, destination_url))
