"""Submitting and controlling: `dagq submit`, `cancel`, `retry`, `signal`.

Imported only when the command runs or shows its help (see :mod:`dagq.cli`)."""

from __future__ import annotations

import sys

import click

from dagq.cli import (
    _exit,
    fail,
    json_option,
    store_option,
)


@click.command()
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


@click.command()
@click.argument("workflow_id")
@store_option
def cancel(*, workflow_id: str, store_url: str) -> None:
    """Cancel a workflow: pending tasks at once, running ones are stopped."""
    from dagq.cli.control import run_cancel

    _exit(lambda: run_cancel(store_url, workflow_id))


@click.command()
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


@click.command()
@click.argument("workflow_id")
@click.argument("name")
@click.option("--data", default=None, metavar="JSON", help="What the waiting task outputs.")
@store_option
def signal(*, workflow_id: str, name: str, data: str | None, store_url: str) -> None:
    """Send signal NAME (an approval, a decision) to a workflow; its waiting task completes."""
    from dagq.cli.control import run_signal

    _exit(lambda: run_signal(store_url, workflow_id, name, data))
