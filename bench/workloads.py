"""The workloads W1-W4, as definitions built in Python."""

from __future__ import annotations

from collections.abc import Callable

from dagq.definition import WorkflowDef
from dagq.loading import load_data

NOOP = "bench.tasks:noop"


def fan_out(n: int) -> WorkflowDef:
    """W1: 1 root -> n parallel tasks -> 1 join."""
    tasks = [{"name": "root", "call": NOOP}]
    tasks += [{"name": f"t{i}", "call": NOOP, "depends_on": ["root"]} for i in range(n)]
    tasks.append({"name": "join", "call": NOOP, "depends_on": [f"t{i}" for i in range(n)]})
    return load_data({"name": f"w1-fan-out-{n}", "tasks": tasks}, source="W1")


def chain(n: int) -> WorkflowDef:
    """W2: n tasks in strict sequence, each consuming the previous output."""
    tasks = [{"name": "s0", "call": "bench.tasks:step"}]
    tasks += [
        {"name": f"s{i}", "call": "bench.tasks:step", "depends_on": [f"s{i - 1}"]}
        for i in range(1, n)
    ]
    return load_data({"name": f"w2-chain-{n}", "tasks": tasks}, source="W2")


def layered(layers: int, width: int) -> WorkflowDef:
    """W3: layers x width tasks, each depending on every task of the layer above."""
    tasks = []
    for layer in range(layers):
        above = [f"l{layer - 1}-{j}" for j in range(width)] if layer else []
        tasks += [
            {"name": f"l{layer}-{j}", "call": NOOP, **({"depends_on": above} if above else {})}
            for j in range(width)
        ]
    return load_data({"name": f"w3-layered-{layers}x{width}", "tasks": tasks}, source="W3")


def short_chain(n: int = 5) -> WorkflowDef:
    """W4 unit: a chain of 5 tasks (W4 submits many of these at once)."""
    tasks = [{"name": "c0", "call": NOOP}]
    tasks += [{"name": f"c{i}", "call": NOOP, "depends_on": [f"c{i - 1}"]} for i in range(1, n)]
    return load_data({"name": "w4-chain-5", "tasks": tasks}, source="W4")


#: name -> (size label -> (definition builder, number of workflows))
SIZES: dict[str, dict[str, tuple[Callable[[], WorkflowDef], int]]] = {
    "W1": {
        "tiny": (lambda: fan_out(50), 1),
        "small": (lambda: fan_out(1_000), 1),
        "full": (lambda: fan_out(10_000), 1),
        "huge": (lambda: fan_out(100_000), 1),
    },
    "W2": {
        "tiny": (lambda: chain(20), 1),
        "small": (lambda: chain(200), 1),
        "full": (lambda: chain(200), 1),
        "huge": (lambda: chain(200), 1),
    },
    "W3": {
        "tiny": (lambda: layered(3, 10), 1),
        "small": (lambda: layered(10, 100), 1),
        "full": (lambda: layered(10, 100), 1),
        "huge": (lambda: layered(10, 100), 1),
    },
    "W4": {
        "tiny": (short_chain, 10),
        "small": (short_chain, 200),
        "full": (short_chain, 200),
        "huge": (short_chain, 200),
    },
}
