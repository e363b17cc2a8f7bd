"""The peer: the same workloads on DBOS (SQLite system database), one JSON line a run.

Run by the python of the virtual environment ``python -m bench --peers dbos`` makes
(``bench/peers/__init__.py``), never by dagq's: it imports DBOS and ``bench/tasks.py``
(which imports nothing of dagq), nothing else of this repository.

    python bench/peers/dbos_peer.py '{"workload": "W1", "shape": [1000], "count": 1,
        "task": "join", "expected": 2000, "workers": 16, "runs": 3}'

Each task is a DBOS step calling the same function as dagq's task, with the same
inputs (its parents' outputs by name). Steps that run in sequence (a chain, W1's root
and join) are called one after the other in a workflow, DBOS's idiom; steps that run
in parallel (W1's mids, W3's layers) are child workflows of one step each, enqueued on
a queue with ``workers`` slots on this executor; W4's 200 chains are enqueued on it
too. The queue is polled every 10 ms (DBOS's default is 1 s, which would dominate).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dbos import DBOS, DBOSConfig

from bench.tasks import add_one, one, total

#: How often the queue and a waiting handle look at the database (DBOS's default, 1 s,
#: would dominate every figure; 0.1 s measured slower than this here).
POLL_S = 0.01


@DBOS.step()
def one_step() -> int:
    return one()


@DBOS.step()
def add_one_step(inputs: dict[str, Any]) -> int:
    return add_one(inputs)


@DBOS.step()
def total_step(inputs: dict[str, Any]) -> int:
    return total(inputs)


STEPS = {"one": one_step, "add_one": add_one_step, "total": total_step}


@DBOS.workflow()
def task_workflow(kind: str, inputs: dict[str, Any]) -> int:
    """One task run beside others: a child workflow of one step."""
    return STEPS[kind](inputs) if inputs or kind != "one" else one_step()


@DBOS.workflow()
def fan_out(n: int) -> dict[str, int]:
    root = one_step()
    handles = [_start(task_workflow, "add_one", {"root": root}) for _ in range(n)]
    mids = {f"t{i}": h.get_result(polling_interval_sec=POLL_S) for i, h in enumerate(handles)}
    return {"join": total_step(mids)}


@DBOS.workflow()
def chain(n: int) -> dict[str, int]:
    value = one_step()
    for i in range(1, n):
        value = add_one_step({f"s{i - 1}": value})
    return {f"s{n - 1}": value}


@DBOS.workflow()
def layered(layers: int, width: int) -> dict[str, int]:
    values: dict[str, int] = {}
    for layer in range(layers):
        kind, inputs = ("total", values) if layer else ("one", {})
        handles = [_start(task_workflow, kind, inputs) for _ in range(width)]
        values = {
            f"l{layer}-{j}": h.get_result(polling_interval_sec=POLL_S)
            for j, h in enumerate(handles)
        }
    return values


def _start(function: Any, *args: Any) -> Any:
    """Start a workflow beside others: on the queue, whose slots bound how many run."""
    return DBOS.retrieve_queue("tasks").enqueue(function, *args)


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """One run of the workload; its figures and the final value."""
    workload, shape, count = spec["workload"], spec["shape"], spec["count"]
    started = time.perf_counter()
    cpu_started = time.process_time()
    if workload == "W4":
        handles = [_start(chain, shape[0]) for _ in range(count)]
    elif workload == "W1":
        handles = [DBOS.start_workflow(fan_out, shape[0])]
    elif workload == "W2":
        handles = [DBOS.start_workflow(chain, shape[0])]
    else:
        handles = [DBOS.start_workflow(layered, shape[0], shape[1])]
    outputs = [h.get_result(polling_interval_sec=POLL_S) for h in handles]
    wall = time.perf_counter() - started
    tasks = count * (
        shape[0] + 2 if workload == "W1" else shape[0] * shape[-1] if workload == "W3" else shape[0]
    )
    values = [o.get(spec["task"]) for o in outputs]
    return {
        "workload": workload,
        "mode": "peer",
        "peer": "dbos",
        "status": ["completed"],
        "tasks": tasks,
        "wall_s": round(wall, 4),
        "tasks_per_s": round(tasks / wall, 1),
        "cpu_s": round(time.process_time() - cpu_started, 4),
        "result": values[0],
        "expected": spec["expected"],
        "result_ok": all(v == spec["expected"] for v in values),
        "slots": spec["workers"],
    }


def main() -> None:
    spec = json.loads(sys.argv[1])
    from importlib.metadata import version

    with tempfile.TemporaryDirectory(prefix="dagq-bench-dbos-") as tmp:
        config: DBOSConfig = {
            "name": "dagq-bench-peer",
            "system_database_url": f"sqlite:///{Path(tmp) / 'dbos.sqlite'}",
            "run_admin_server": False,
            "log_level": "WARNING",
        }
        DBOS(config=config)
        DBOS.launch()
        DBOS.register_queue(
            "tasks", worker_concurrency=spec["workers"], polling_interval_sec=POLL_S
        )
        try:
            for _ in range(spec["runs"]):
                result = run(spec) | {"version": version("dbos"), "size": spec["size"]}
                print(json.dumps(result), flush=True)
        finally:
            DBOS.destroy()


if __name__ == "__main__":
    main()
