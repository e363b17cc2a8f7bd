"""No-op tasks for the benchmark: the engine's overhead is what is measured."""

from __future__ import annotations

from typing import Any


def noop(**_: Any) -> None:
    """Do nothing."""


def step(inputs: dict[str, Any]) -> int:
    """A chain step: consume the previous output, produce the next."""
    previous = next(iter(inputs.values()), 0)
    return int(previous or 0) + 1
