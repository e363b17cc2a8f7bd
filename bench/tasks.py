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


def ones(n: int) -> list[int]:
    """The root of W1 as a foreach: the list of n items (each 1) to fan out over."""
    return [1] * n


def item_plus_one(item: int) -> int:
    """A foreach instance of W1: its item (the root's value) + 1."""
    return item + 1


def total_items(inputs: dict[str, Any]) -> int:
    """W1's join after a foreach: the sum of the list of its instances' outputs."""
    return sum(sum(v) for v in inputs.values())


def noop(**_: Any) -> None:
    """Do nothing (for the benchmarks of the server and the console)."""


def step(inputs: dict[str, Any]) -> int:
    """A chain step: consume the previous output, produce the next."""
    previous = next(iter(inputs.values()), 0)
    return int(previous or 0) + 1
