"""Workflow files as the commands take them: YAML, JSON, or Python that builds one.

Kept apart from ``dagq run`` so ``dagq validate`` and ``dagq submit`` load a file
without importing the runtime (coordinator, worker, live display).
"""

from __future__ import annotations

from pathlib import Path

from dagq.definition import WorkflowDef
from dagq.loading import load_file


def load_definition(file: Path) -> WorkflowDef:
    """A definition from YAML/JSON, or from a Python file that builds one."""
    if file.suffix == ".py":
        from dagq.builder import load_python_file

        return load_python_file(file)
    return load_file(file)
