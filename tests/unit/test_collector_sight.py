"""A large workflow's state keeps its per-task columns out of the garbage collector's sight.

A full collection visits every entry of every container it tracks, holding the GIL:
a list of 100,000 ints cost 1-2 ms a pass, on the event loop. Per-task numbers are
arrays and bytes (untracked); what a state may still track is bounded by what tasks
produced (their outputs), never by how many tasks there are.
"""

from __future__ import annotations

import gc
import subprocess
import sys
from typing import Any

from dagq.coordinator import Coordinator, CoordinatorOptions
from dagq.group import Group, decode_group, encode_group
from dagq.state import RunState
from dagq.stores.memory import open_memory_store
from dagq.submission import submit
from tests.conformance.conftest import FakeClock
from tests.helpers import definition
from tests.unit.test_coordinator import finished, load_state, post, take_tasks

N = 1500


def tracked_columns(obj: Any, n: int) -> list[str]:
    """The slots of ``obj`` whose value a full collection walks entry by entry, ``n``
    entries or more: tracked, and its traversal visits them (an array is tracked, but
    its traversal visits its type alone; a dict of plain values is not tracked)."""
    found = []
    for name in type(obj).__slots__:
        value = getattr(obj, name, None)
        if gc.is_tracked(value) and len(gc.get_referents(value)) >= n:
            found.append(name)
    return found


async def test_a_fan_outs_state_tracks_no_per_task_column() -> None:
    clock = FakeClock()
    store = open_memory_store(clock=clock)
    coordinator = Coordinator(store, CoordinatorOptions(), clock=clock)
    tasks = [{"name": "root"}] + [{"name": f"t{i}", "depends_on": ["root"]} for i in range(N)]
    tasks.append({"name": "join", "depends_on": [f"t{i}" for i in range(N)]})
    result = await submit(store, definition(tasks), workflow_id="wide", clock=clock)
    await coordinator.step()
    (root,) = await take_tasks(store)
    await post(store, finished(root, clock, output=1))
    await coordinator.step()  # the fan-out: N tasks dispatched
    sent = await take_tasks(store)
    await post(store, *(finished(t, clock, output=2) for t in sent[:100]))
    await coordinator.step()
    gc.collect()  # dicts of plain values are untracked once a collection has seen them
    entry = coordinator._cache.peek("wide")
    assert entry is not None
    assert tracked_columns(entry.state, N) == []
    loaded = await load_state(store, "wide", result.plan)  # decoded, then rebuilt
    gc.collect()
    assert loaded.attempt[sent[0].task] == 1
    assert tracked_columns(loaded, N) == []
    fresh = RunState("w", 10 * N, 0.0)
    assert tracked_columns(fresh, N) == []
    await store.close()


def test_a_large_foreach_groups_columns_are_untracked() -> None:
    group = Group(N, None, "ref")
    group.attempt[3] = 2
    copy = decode_group(encode_group(group))
    assert copy.attempt[3] == 2
    # ``unsent`` (a deque of the instances still to send) empties as they go out.
    assert [n for n in tracked_columns(copy, N) if n != "unsent"] == []


def test_modules_imported_once_settled_are_frozen_too() -> None:
    """``dagq run``'s display imports rich once the run is under way: its objects leave
    the collector's sight as the start-up's did (in a process of its own: freezing is
    for the whole process)."""
    code = (
        "import gc\n"
        "from dagq import garbage\n"
        "garbage.settle_late()\n"
        "assert gc.get_freeze_count() == 0, 'nothing settled yet: nothing frozen'\n"
        "garbage.settle()\n"
        "settled = gc.get_freeze_count()\n"
        "import rich.console\n"
        "garbage.settle_late()\n"
        "assert gc.get_freeze_count() > settled + 1000, (settled, gc.get_freeze_count())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
