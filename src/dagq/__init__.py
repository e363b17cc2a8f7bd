"""dagq: a durable workflow engine for multi-step pipelines.

Public names are imported lazily so that ``dagq --help`` and small scripts start fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dagq.errors import DagqError, NonRetryable, RetryAfter, ValidationError

if TYPE_CHECKING:
    from dagq.builder import Workflow
    from dagq.client import Client, SyncClient
    from dagq.definition import WorkflowDef
    from dagq.embedded import RunResult, run, run_async
    from dagq.loading import load_file
    from dagq.runners import TaskContext
    from dagq.workflow_definition import WorkflowDefinition

__all__ = [
    "Client",
    "DagqError",
    "NonRetryable",
    "RetryAfter",
    "RunResult",
    "SyncClient",
    "TaskContext",
    "ValidationError",
    "Workflow",
    "WorkflowDef",
    "WorkflowDefinition",
    "__version__",
    "load_file",
    "run",
    "run_async",
]

_LAZY = {
    "Client": "dagq.client",
    "SyncClient": "dagq.client",
    "Workflow": "dagq.builder",
    "WorkflowDef": "dagq.definition",
    "load_file": "dagq.loading",
    "RunResult": "dagq.embedded",
    "run": "dagq.embedded",
    "run_async": "dagq.embedded",
    "TaskContext": "dagq.runners",
    "WorkflowDefinition": "dagq.workflow_definition",
}


def __getattr__(name: str) -> Any:
    if name == "__version__":
        return _version()
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'dagq' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


def _version() -> str:
    """The installed distribution's version (``dagq --version`` prints the same)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("dagq")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "0+unknown"
