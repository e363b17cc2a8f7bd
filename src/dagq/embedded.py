"""Running a workflow from Python — a script, a notebook — as ``dagq run`` does.

``dagq.run(workflow, params=..., workers=N, store=...)`` submits (or resumes) the
workflow and drives it in this process with a coordinator and a pool of workers,
through the same :class:`dagq.local.LocalRunner` calls as the ``dagq run`` command,
and returns the final status with the outputs of the completed tasks.
``dagq.run_async`` is the same for code that already runs an event loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from dagq.builder import Workflow
from dagq.client import Client, TaskInfo, as_definition
from dagq.definition import WorkflowDef
from dagq.local import LocalRunner
from dagq.payloads import decode_json
from dagq.state import TaskStatus
from dagq.stores import open_store
from dagq.stores.base import Store
from dagq.views import load_run

#: Where state lives unless ``store=`` says otherwise: the default of ``dagq run``.
DEFAULT_STORE = "sqlite:///.dagq/dagq.db"

WorkflowSource = WorkflowDef | Workflow | str | Path


class RunResult(msgspec.Struct, frozen=True, kw_only=True):
    """How an embedded run ended: its status, and the outputs of its completed tasks."""

    id: str
    name: str
    status: str
    counts: dict[str, int]
    error: str | None
    failed: list[TaskInfo]
    #: Task name → output, for every completed task (fetched if stored by reference).
    outputs: dict[str, Any]
    #: The id named a run that existed already (it was resumed, or had ended).
    resumed: bool

    @property
    def completed(self) -> bool:
        """Did the workflow complete?"""
        return self.status == "completed"


async def run_async(
    workflow: WorkflowSource,
    *,
    params: Mapping[str, Any] | None = None,
    workers: int = 4,
    store: str | Store = DEFAULT_STORE,
    workflow_id: str | None = None,
    import_paths: Sequence[str] = (),
    processor: str | None = None,
) -> RunResult:
    """Run ``workflow`` (a ``Workflow``, a definition, or a YAML/JSON/Python file path)
    here until it ends; the same id again resumes it or returns its result.

    Python tasks are imported from ``import_paths``, the workflow file's directory and
    the current directory. A bad definition or param raises ``ValidationError``.
    """
    paths = [*import_paths, *_file_directory(workflow), str(Path.cwd())]
    definition = as_definition(workflow)
    opened = open_store(store) if isinstance(store, str) else store
    try:
        runner = LocalRunner(opened, workers=workers, import_paths=paths, processor=processor)
        start = await runner.start(definition, params=params or {}, workflow_id=workflow_id)
        if start.quarantined is None and start.finished is None:
            await runner.drive()
        return await _result(opened, start.workflow_id, resumed=not start.created)
    finally:
        if isinstance(store, str):
            await opened.close()


def run(
    workflow: WorkflowSource,
    *,
    params: Mapping[str, Any] | None = None,
    workers: int = 4,
    store: str | Store = DEFAULT_STORE,
    workflow_id: str | None = None,
    import_paths: Sequence[str] = (),
    processor: str | None = None,
) -> RunResult:
    """:func:`run_async`, blocking. Inside a running event loop (a notebook's), the run
    goes on in a thread of its own (pass a store URL then, not a store object)."""
    call = run_async(
        workflow,
        params=params,
        workers=workers,
        store=store,
        workflow_id=workflow_id,
        import_paths=import_paths,
        processor=processor,
    )
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(call)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="dagq-run") as pool:
        return pool.submit(asyncio.run, call).result()


def _file_directory(workflow: WorkflowSource) -> list[str]:
    if isinstance(workflow, str | Path):
        return [str(Path(workflow).resolve().parent)]
    return []


async def _result(store: Store, workflow_id: str, *, resumed: bool) -> RunResult:
    status = await Client(store).status(workflow_id)
    _, plan, st = await load_run(store, workflow_id)
    outputs: dict[str, Any] = {}
    for i, task in enumerate(plan.tasks):
        if st.task_status[i] != TaskStatus.COMPLETED:
            continue
        ref = st.output_refs.get(i)
        if ref is None:
            outputs[task.name] = st.outputs.get(i)
            continue
        document = await store.documents.get(ref)
        outputs[task.name] = (
            None if document is None else decode_json(document.data, f"the output of {task.name}")
        )
    return RunResult(
        id=status.id,
        name=status.name,
        status=status.status,
        counts=status.counts,
        error=status.error,
        failed=status.failed,
        outputs=outputs,
        resumed=resumed,
    )
