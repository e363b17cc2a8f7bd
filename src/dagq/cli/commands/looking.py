"""Looking into workflows: `dagq list`, `tasks`, `output`, `logs`, `events`, `graph`.

Imported only when the command runs or shows its help (see :mod:`dagq.cli`)."""

from __future__ import annotations

import click

from dagq.cli import (
    _exit,
    fail,
    json_option,
    store_option,
)


@click.command(name="list")
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


@click.command()
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


@click.command()
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


@click.command()
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


@click.command()
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


@click.command()
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
