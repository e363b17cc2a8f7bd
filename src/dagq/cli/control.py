"""Commands that change or draw workflows: submit, cancel, retry, graph."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path

import msgspec

from dagq import graph
from dagq.cli.definitions import load_definition
from dagq.cli.display import task_state
from dagq.cli.inspect import EXIT_OK, EXIT_USAGE, console, print_json, with_client
from dagq.client import Client
from dagq.definition import WorkflowDef, rule_set
from dagq.errors import DagqError, PayloadTooLarge, UsageError
from dagq.payloads import MAX_DEPTH
from dagq.plan import parse_param
from dagq.state import TaskStatus
from dagq.submission import check_signal_data, local_actor
from dagq.views import UNDO_LABELS, load_run

#: Who acts through these commands, in the runs' history (the audit trail).
CLI = local_actor("cli")


def run_submit(
    store_url: str,
    file: Path,
    params: tuple[str, ...],
    *,
    workflow_id: str | None,
    as_json: bool,
    ids: list[str] | None = None,
) -> int:
    """``dagq submit``: store the workflow and print its id."""
    definition = load_definition(file)
    overrides = dict(parse_param(p) for p in params)
    submission = with_client(
        store_url,
        lambda c: c.submit(definition, params=overrides, workflow_id=workflow_id, actor=CLI),
        create=True,
    )
    if ids is not None:
        ids.append(submission.id)
    if as_json:
        print_json(submission)
    else:
        print(submission.id, flush=True)
    return EXIT_OK


class FileSubmission(msgspec.Struct, frozen=True, kw_only=True):
    """One file of a ``dagq submit`` of several: its id, or why it was not submitted."""

    file: str
    id: str | None
    created: bool
    error: str | None


def run_submit_many(
    store_url: str,
    files: tuple[str, ...],
    params: tuple[str, ...],
    *,
    workflow_id: str | None,
    as_json: bool,
    ids: list[str] | None = None,
) -> int:
    """``dagq submit FILE...``: each file in turn, with its own id; '-' reads paths from
    standard input. One file given by name keeps the single-file output. The ids of the
    runs submitted are added to ``ids`` (for ``--wait``)."""
    if len(files) == 1 and files[0] != "-":
        return run_submit(
            store_url, Path(files[0]), params, workflow_id=workflow_id, as_json=as_json, ids=ids
        )
    paths = [path for name in files for path in (_stdin_paths() if name == "-" else [name])]
    if not paths:
        raise UsageError("no workflow file given (standard input held no paths)")
    if workflow_id is not None and len(paths) > 1:
        raise UsageError(f"--id names one workflow, but {len(paths)} files were given")
    overrides = dict(parse_param(p) for p in params)

    async def body(client: Client) -> list[FileSubmission]:
        results = []
        for path in paths:
            result = await _submit_one(client, path, overrides, workflow_id)
            if not as_json:
                _report(result)
            results.append(result)
        return results

    results = with_client(store_url, body, create=True)
    if ids is not None:
        ids += [r.id for r in results if r.id is not None]
    if as_json:
        print_json(results)
    return EXIT_USAGE if any(r.error is not None for r in results) else EXIT_OK


def _stdin_paths() -> list[str]:
    """The file paths on standard input, one per line (blank lines skipped)."""
    return [line.strip() for line in sys.stdin if line.strip()]


async def _submit_one(
    client: Client, path: str, overrides: Mapping[str, object], workflow_id: str | None
) -> FileSubmission:
    try:
        definition = load_definition(Path(path))
        submission = await client.submit(
            definition, params=overrides, workflow_id=workflow_id, actor=CLI
        )
    except DagqError as exc:
        message = str(exc)
        if not message.startswith(path):
            message = f"{path}: {message}"
        return FileSubmission(file=path, id=None, created=False, error=message)
    return FileSubmission(file=path, id=submission.id, created=submission.created, error=None)


def _report(result: FileSubmission) -> None:
    if result.error is not None:
        print(f"error: {result.error}", file=sys.stderr, flush=True)
    else:
        print(f"{result.id} {result.file}", flush=True)


def run_cancel(store_url: str, workflow_id: str) -> int:
    """``dagq cancel``."""
    with_client(store_url, lambda c: c.cancel(workflow_id, actor=CLI))
    console().print(f"cancel requested for {workflow_id}")
    return EXIT_OK


def run_retry(store_url: str, workflow_id: str, tasks: list[str]) -> int:
    """``dagq retry``."""
    taken_up = with_client(store_url, lambda c: c.retry(workflow_id, tasks or None, actor=CLI))
    which = ", ".join(tasks) if tasks else "all failed, upstream_failed and cancelled tasks"
    console().print(f"retry requested for {workflow_id}: {which}")
    if not taken_up:
        print(
            "warning: no coordinator has taken the request up yet; it runs when one does "
            f"(start one: dagq coordinator), or run it here: dagq retry {workflow_id} --run",
            file=sys.stderr,
        )
    return EXIT_OK


def run_signal(store_url: str, workflow_id: str, name: str, data: str | None) -> int:
    """``dagq signal``: deliver a signal (with JSON data) to a workflow."""
    value = None
    if data is not None:
        try:
            value = json.loads(data)
        except RecursionError:  # deeper than the parser's stack: far over the bound
            raise PayloadTooLarge(f"--data is nested more than {MAX_DEPTH} levels deep") from None
        except ValueError as exc:
            raise UsageError(f"--data is not valid JSON: {exc}") from None
        check_signal_data(name, value)  # refused here, before any store is opened
    with_client(store_url, lambda c: c.signal(workflow_id, name, value, actor=CLI))
    console().print(f"signal '{name}' sent to {workflow_id}")
    return EXIT_OK


def run_graph(store_url: str, target: str, fmt: str) -> int:
    """``dagq graph``: a file is drawn as defined; an id with its task states."""
    path = Path(target)
    if path.suffix in (".yaml", ".yml", ".json", ".py"):  # a missing file says so
        definition = load_definition(path)
        nodes = _nodes(definition, None)
    else:
        definition, nodes = with_client(store_url, lambda c: _submitted_nodes(c, target))
    print(graph.render(nodes, fmt, note=rule_set(definition).describe()))
    return EXIT_OK


async def _submitted_nodes(
    client: Client, workflow_id: str
) -> tuple[WorkflowDef, list[graph.Node]]:
    submitted, _, st = await load_run(client.store, workflow_id)
    states = [
        task_state(TaskStatus(code).label, UNDO_LABELS.get(st.undo_status.get(i, 0)))
        for i, code in enumerate(st.task_status)
    ]
    return submitted.definition, _nodes(submitted.definition, states)


def _nodes(definition: WorkflowDef, states: list[str] | None) -> list[graph.Node]:
    return graph.nodes_of(definition, states)
