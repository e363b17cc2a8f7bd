"""The long-running processes (`dagq coordinator`, `worker`, `server`) and `dagq workers`.

Imported only when the command runs or shows its help (see :mod:`dagq.cli`)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import click

from dagq.cli import (
    _exit,
    json_option,
    metrics_port_option,
    processor_option,
    store_option,
)
from dagq.cli.log_output import LogFormat, log_options
from dagq.cli.log_output import configure as configure_logging


@click.command()
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
@metrics_port_option
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


@click.command()
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
@processor_option
@metrics_port_option
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


@click.command()
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
@metrics_port_option
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


@click.command()
@store_option
@json_option
def workers(*, store_url: str, as_json: bool) -> None:
    """Live workers: id, host, pid, queues, running tasks, version, started, last seen."""
    from dagq.cli.workers import run_workers

    _exit(lambda: run_workers(store_url, as_json=as_json))
