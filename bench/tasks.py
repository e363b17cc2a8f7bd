"""The benchmark's tasks: they consume their parents' outputs, so data flows as in a
real pipeline, and the final value proves it did (``bench.workloads.final``).

The same functions, under the same names, are what the peer runs (``bench/peers``).
"""

from __future__ import annotations

from typing import Any


def one() -> int:
    """A root: the first value."""
    return 1


def add_one(inputs: dict[str, Any]) -> int:
    """A mid of the fan-out, a step of a chain: its parent's output + 1."""
    return sum(inputs.values()) + 1


def total(inputs: dict[str, Any]) -> int:
    """A join, a task of a layer: the sum of its parents' outputs."""
    return sum(inputs.values())


def noop(**_: Any) -> None:
    """Do nothing (for the benchmarks of the server and the console)."""


def step(inputs: dict[str, Any]) -> int:
    """A chain step: consume the previous output, produce the next."""
    previous = next(iter(inputs.values()), 0)
    return int(previous or 0) + 1
