"""`dagq status`, `summary` and `explain`: where a workflow stands.

Imported only when the command runs or shows its help (see :mod:`dagq.cli`)."""

from __future__ import annotations

from typing import NoReturn

import click

from dagq.cli import (
    _exit,
    fail,
    json_option,
    store_option,
)


@click.command()
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


@click.command()
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


@click.command()
@click.argument("workflow_id")
@click.argument("task")
@store_option
@json_option
def explain(*, workflow_id: str, task: str, store_url: str, as_json: bool) -> None:
    """Why TASK is in its state: policy, parents, condition, retries, what it waits for."""
    from dagq.cli.explain import run_explain

    _exit(lambda: run_explain(store_url, workflow_id, task, as_json=as_json))
