"""A workflow definition as a value: load it, validate it, dump it, load it back the same.

A thin layer over :mod:`dagq.loading` (which parses and validates) and
:class:`~dagq.definition.WorkflowDef` (the typed definition), with the names ai4s-jobq's
``WorkflowDefinition`` has, so code written against it reads the same::

    definition = WorkflowDefinition.from_file("pipeline.yaml")
    text = definition.to_json()
    assert WorkflowDefinition.from_json(text) == definition
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from dagq.definition import TaskDef, WorkflowDef, to_builtins
from dagq.errors import ValidationError
from dagq.loading import load_data, load_file


class WorkflowDefinition:
    """A validated workflow definition that dumps to JSON (or YAML) and loads back equal."""

    __slots__ = ("definition",)

    def __init__(self, definition: WorkflowDef) -> None:
        """Wrap a typed definition; call :meth:`validate` if it was built by hand."""
        self.definition = definition

    # --- loading ------------------------------------------------------------------------

    @classmethod
    def from_file(cls, path: str | Path) -> WorkflowDefinition:
        """Load and validate a ``.yaml``/``.yml``/``.json`` file, or a Python file that
        builds a :class:`~dagq.builder.Workflow`."""
        file = Path(path)
        if file.suffix == ".py":
            from dagq.builder import load_python_file

            return cls(load_python_file(file))
        return cls(load_file(file))

    @classmethod
    def from_json(cls, text: str | bytes, *, source: str = "<json>") -> WorkflowDefinition:
        """Load and validate a definition given as JSON text."""
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValidationError(
                f"{source}: line {exc.lineno}, column {exc.colno}: invalid JSON: {exc.msg}"
            ) from None
        except RecursionError:
            raise ValidationError(f"{source}: nested too deep") from None
        return cls(load_data(raw, source=source, text=text))

    @classmethod
    def from_yaml(cls, text: str, *, source: str = "<yaml>") -> WorkflowDefinition:
        """Load and validate a definition given as YAML text."""
        from dagq.loading import load_text

        return cls(load_text(text, source=source))

    @classmethod
    def from_dict(
        cls, data: Mapping[str, Any], *, source: str = "<definition>"
    ) -> WorkflowDefinition:
        """Validate already-parsed data (as ``json.load`` or ``yaml.safe_load`` give it)."""
        return cls(load_data(data, source=source))

    # --- checking and dumping ------------------------------------------------------------

    def validate(self) -> WorkflowDefinition:
        """Check every rule a file is checked against (types, bounds, names, the DAG,
        conditions); raises :class:`~dagq.errors.ValidationError`. Returns ``self``."""
        load_data(self.to_dict(), source=f"workflow '{self.name}'")
        return self

    def to_dict(self) -> dict[str, Any]:
        """Plain data (fields left at their default are left out)."""
        return to_builtins(self.definition)

    def to_json(self, *, indent: int | None = None) -> str:
        """JSON text that :meth:`from_json` loads back to an equal definition."""
        text = msgspec.json.encode(self.to_dict()).decode()
        return text if indent is None else msgspec.json.format(text, indent=indent)

    def to_yaml(self) -> str:
        """YAML text that :meth:`from_yaml` loads back to an equal definition."""
        from dagq.pyyaml import yaml

        data = self.to_dict()
        text: str = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
        # PyYAML writes a few line-break characters (NEL) in a form it reads back changed;
        # escaped, every character survives.
        if yaml.safe_load(text) != data:
            text = yaml.safe_dump(data, sort_keys=False, allow_unicode=False)
        return text

    # --- a value ------------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The workflow's name."""
        return self.definition.name

    @property
    def tasks(self) -> list[TaskDef]:
        """Its tasks, in the order defined."""
        return self.definition.tasks

    def __eq__(self, other: object) -> bool:
        if isinstance(other, WorkflowDefinition):
            return self.definition == other.definition
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.to_json())

    def __repr__(self) -> str:
        return f"WorkflowDefinition(name={self.name!r}, tasks={len(self.tasks)})"
