"""The workloads W1-W4, as definitions built in Python, with the value each must end with.

Every task consumes its parents' outputs (``bench/tasks.py``): W1 ``mid = root + 1``,
``join = sum(mids)``; W2 each step the previous + 1; W3 each task the sum of its 100
parents; W4 five steps of + 1. :func:`final` says which task's output proves the data
flowed, and what it must be.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dagq.definition import WorkflowDef
from dagq.loading import load_data

TASKS = "bench.tasks"


def fan_out_data(n: int, module: str = TASKS) -> dict[str, Any]:
    """W1: 1 root -> n parallel ``root + 1`` -> 1 join (their sum)."""
    # Each name, and the mids' parents and call, made once and shared (as a definition
    # read from a file shares nothing, the run itself never depends on it): at
    # n=1,000,000 the benchmark's own copies would weigh tens of MB.
    names = [f"t{i}" for i in range(n)]
    call, parents = f"{module}:add_one", ["root"]
    tasks: list[dict[str, Any]] = [{"name": "root", "call": f"{module}:one"}]
    tasks += [{"name": name, "call": call, "depends_on": parents} for name in names]
    tasks.append({"name": "join", "call": f"{module}:total", "depends_on": names})
    return {"name": f"w1-fan-out-{n}", "tasks": tasks}


def fan_out_foreach_data(n: int, module: str = TASKS) -> dict[str, Any]:
    """W1 as users write a wide fan-out: a root makes the list of n items, one ``foreach``
    task runs ``item + 1`` over it (n instances), the join sums the list of their outputs.

    The same data flow and final value (2n) as :func:`fan_out_data`, in three tasks: a
    static definition of 1,000,002 tasks is over ``validation.MAX_TASKS`` and the 32 MiB
    definition bound, which stay (they guard the coordinator against hostile input)."""
    return {
        "name": f"w1-foreach-{n}",
        "tasks": [
            {"name": "root", "call": f"{module}:ones", "args": {"n": n}},
            {
                "name": "mid",
                "call": f"{module}:item_plus_one",
                "depends_on": ["root"],
                "foreach": "inputs.root",
            },
            {"name": "join", "call": f"{module}:total_items", "depends_on": ["mid"]},
        ],
    }


def chain_data(n: int, module: str = TASKS, name: str = "w2-chain") -> dict[str, Any]:
    """W2 (and W4's unit): n tasks in strict sequence, each the previous output + 1."""
    tasks: list[dict[str, Any]] = [{"name": "s0", "call": f"{module}:one"}]
    tasks += [
        {"name": f"s{i}", "call": f"{module}:add_one", "depends_on": [f"s{i - 1}"]}
        for i in range(1, n)
    ]
    return {"name": f"{name}-{n}", "tasks": tasks}


def layered_data(layers: int, width: int, module: str = TASKS) -> dict[str, Any]:
    """W3: layers x width tasks, each the sum of every task of the layer above."""
    tasks: list[dict[str, Any]] = []
    for layer in range(layers):
        above = [f"l{layer - 1}-{j}" for j in range(width)] if layer else []
        call = f"{module}:total" if layer else f"{module}:one"
        tasks += [
            {"name": f"l{layer}-{j}", "call": call, **({"depends_on": above} if above else {})}
            for j in range(width)
        ]
    return {"name": f"w3-layered-{layers}x{width}", "tasks": tasks}


def fan_out(n: int) -> WorkflowDef:
    """W1 as a definition."""
    return load_data(fan_out_data(n), source="W1")


def chain(n: int) -> WorkflowDef:
    """W2 as a definition."""
    return load_data(chain_data(n), source="W2")


def layered(layers: int, width: int) -> WorkflowDef:
    """W3 as a definition."""
    return load_data(layered_data(layers, width), source="W3")


def short_chain(n: int = 5) -> WorkflowDef:
    """W4 unit: a chain of 5 tasks (W4 submits many of these at once)."""
    return load_data(chain_data(n, name="w4-chain"), source="W4")


#: name -> size label -> the workload's shape: (W1: n; W2: n; W3: layers, width; W4: n)
#: and the number of workflows submitted at once.
SHAPES: dict[str, dict[str, tuple[tuple[int, ...], int]]] = {
    "W1": {
        "tiny": ((50,), 1),
        "small": ((1_000,), 1),
        "full": ((10_000,), 1),
        "huge": ((100_000,), 1),
        "scale": ((1_000_000,), 1),  # as a foreach (FOREACH)
    },
    "W2": {"tiny": ((20,), 1), "small": ((200,), 1), "full": ((200,), 1), "huge": ((200,), 1)},
    "W3": {
        "tiny": ((3, 10), 1),
        "small": ((10, 100), 1),
        "full": ((10, 100), 1),
        "huge": ((10, 100), 1),
    },
    "W4": {
        "tiny": ((5,), 10),
        "small": ((5,), 200),
        "full": ((5,), 200),
        "huge": ((5,), 200),
        "scale": ((5,), 100_000),  # W4 x 500
    },
}
#: W1's sizes run as a ``foreach`` fan-out (:func:`fan_out_foreach_data`): ``scale`` (a
#: static definition of a million tasks is refused), and any ``foreach=COUNT``.
FOREACH = ("scale",)
#: The workloads whose size may also be given as ``n=COUNT``: W1's fan-out width, W2's
#: chain length, W4's number of workflows.
COUNTED = ("W1", "W2", "W4")


def shape(workload: str, size: str) -> tuple[tuple[int, ...], int]:
    """The shape and number of workflows of ``workload`` at ``size``: a label of
    :data:`SHAPES`, or ``n=COUNT`` (W1 ``n=50000``: a fan-out of 50,000; W4 ``n=10000``:
    10,000 workflows). ValueError names what is wrong."""
    sizes = SHAPES[workload]
    if size in sizes:
        return sizes[size]
    key, sep, value = size.partition("=")
    keys = ("n", "foreach") if workload == "W1" else ("n",)
    if workload not in COUNTED or key not in keys or not sep:
        labels = ", ".join(sorted(sizes))
        counted = " or n=COUNT" if workload in COUNTED else ""
        counted += " or foreach=COUNT" if workload == "W1" else ""
        raise ValueError(f"unknown size {size!r} for {workload}: {labels}{counted}")
    try:
        n = int(value.replace("_", "").replace(",", ""))
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"size {size!r} for {workload}: COUNT must be a whole number >= 1")
    if workload == "W4":
        return (5,), n
    return (n,), 1


def is_foreach(workload: str, size: str) -> bool:
    """Does ``workload`` at ``size`` fan out with a ``foreach`` (W1 ``scale``,
    ``foreach=COUNT``)?"""
    return workload == "W1" and (size in FOREACH or size.startswith("foreach="))


def data(workload: str, size: str, module: str = TASKS) -> dict[str, Any]:
    """The definition of one workflow of ``workload``, as a file would hold it."""
    (*dims,), _ = shape(workload, size)
    if is_foreach(workload, size):
        return fan_out_foreach_data(dims[0], module)
    if workload == "W1":
        return fan_out_data(dims[0], module)
    if workload == "W3":
        return layered_data(dims[0], dims[1], module)
    return chain_data(dims[0], module, name="w2-chain" if workload == "W2" else "w4-chain")


def final(workload: str, size: str) -> tuple[str, int]:
    """The task whose output proves the data flowed, and the value it must have."""
    dims, _ = shape(workload, size)
    if workload == "W1":
        return "join", 2 * dims[0]  # n mids of root (1) + 1
    if workload == "W3":
        layers, width = dims
        return f"l{layers - 1}-0", width ** (layers - 1)
    return f"s{dims[0] - 1}", dims[0]  # W2, W4: 1, then + 1 per step


def _builder(workload: str, size: str) -> Callable[[], WorkflowDef]:
    return lambda: load_data(data(workload, size), source=workload)


def sized(workload: str, size: str) -> tuple[Callable[[], WorkflowDef], int]:
    """The definition builder and number of workflows of ``workload`` at ``size`` (a
    label or ``n=COUNT``, :func:`shape`)."""
    _, count = shape(workload, size)
    return _builder(workload, size), count


#: name -> (size label -> (definition builder, number of workflows))
SIZES: dict[str, dict[str, tuple[Callable[[], WorkflowDef], int]]] = {
    workload: {size: (_builder(workload, size), count) for size, (_, count) in sizes.items()}
    for workload, sizes in SHAPES.items()
}
