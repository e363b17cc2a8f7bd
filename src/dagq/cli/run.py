"""``dagq run``: submit (or resume) a workflow and drive it here, with live progress.

Start-up comes first: the file is loaded and checked, and — when it has Python tasks —
the zygote that forks their processes is launched (:mod:`dagq.zygote`) before
the runtime is imported (:mod:`dagq.cli.local_run`: the coordinator, the worker, the
live display), so that the new interpreter boots on another core meanwhile.
"""

from __future__ import annotations

from pathlib import Path

import click

from dagq import observability, zygote
from dagq.cli import EXIT_USAGE
from dagq.cli.definitions import load_definition
from dagq.definition import WorkflowDef
from dagq.errors import DagqError
from dagq.plan import parse_param


def run_command(
    file: Path,
    params: tuple[str, ...],
    workers: int,
    workflow_id: str | None,
    store_url: str,
    *,
    quiet: bool = False,
    processor: str | None = None,
    metrics_port: int | None = None,
) -> int:
    """Run the workflow and return the process exit code."""
    import_paths = [str(file.resolve().parent), str(Path.cwd())]
    try:
        definition = load_definition(file)
        overrides = dict(parse_param(p) for p in params)
        if processor is not None:
            from dagq.runners.python import add_import_paths, check_processor

            add_import_paths(import_paths)
            check_processor(processor)
        observability.start("run", metrics_port)
    except DagqError as exc:
        click.echo(f"error: {exc}", err=True)
        return EXIT_USAGE
    if processor is not None or _has_python_tasks(definition):
        zygote.prestart()
    from dagq.cli import local_run  # the runtime: imported while the zygote boots

    try:
        return local_run.run_here(
            definition,
            overrides=overrides,
            workers=workers,
            workflow_id=workflow_id,
            store_url=store_url,
            import_paths=import_paths,
            quiet=quiet,
            source=str(file),
            processor=processor,
        )
    except DagqError as exc:
        click.echo(f"error: {exc}", err=True)
        return EXIT_USAGE
    finally:
        observability.stop()


def retry_run_command(
    store_url: str,
    workflow_id: str,
    tasks: list[str],
    *,
    workers: int,
    import_paths: tuple[str, ...],
    quiet: bool = False,
) -> int:
    """``dagq retry ID --run``: retry a finished run and drive it here, as ``dagq run``
    does (no cluster needed); returns the process exit code."""
    from dagq.cli import local_run

    try:
        submitted = local_run.submitted(store_url, workflow_id)
        return local_run.run_here(
            submitted.definition,
            overrides=submitted.params,
            workers=workers,
            workflow_id=workflow_id,
            store_url=store_url,
            import_paths=[*import_paths, str(Path.cwd())],
            quiet=quiet,
            source="FILE",
            processor=None,
            retry_tasks=tasks,
        )
    except DagqError as exc:
        click.echo(f"error: {exc}", err=True)
        return EXIT_USAGE


def _has_python_tasks(definition: WorkflowDef) -> bool:
    return any(task.call is not None for task in definition.tasks)
