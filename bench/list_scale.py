"""``dagq list`` on a store of many workflows (issue 17: 100,000 workflows, W4 x 500).

    python -m bench.list_scale [--workflows 100000] [--runs 10] [--store PATH]

Fills a SQLite store with the index rows that many finished W4 workflows (5 chained
tasks each) leave behind — the rows the coordinator writes, in batches of 1,000 through
the store's own :class:`~dagq.stores.base.Batch` — unless the file already holds that
many, then times ``dagq list`` (the default page, and ``--status failed``) as a user
types it, a fresh process each run. Prints one JSON line per command: the median and
minimum wall seconds and the load average. Only ``dagq list`` is timed: filling the
store is not.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from dagq.stores import open_store
from dagq.stores.base import Batch, IndexRow

TASKS = 5
BATCH = 1_000


def w4_row(n: int, now: float) -> IndexRow:
    """The index row of the n-th W4 workflow, finished: one in fifty failed."""
    failed = n % 50 == 0
    counts = {"completed": 3, "failed": 1, "upstream_failed": 1} if failed else {"completed": 5}
    data: dict[str, object] = {"total": TASKS, "counts": counts, "finished_at": now}
    if failed:
        data["error"] = "task 'step-3' failed: exit code 1"
    created = now - 100_000 + n  # one a second, the newest last
    return IndexRow(
        id=f"w4-{n:06d}",
        name="w4",
        status="failed" if failed else "completed",
        created_at=created,
        updated_at=created + 0.5,
        data=data,
    )


async def fill(url: str, workflows: int) -> int:
    """Write the rows that are missing; how many the index holds afterwards."""
    store = open_store(url)
    try:
        have = 0
        while await store.index.get(f"w4-{have:06d}") is not None and have < workflows:
            have += BATCH
        have = max(0, have - BATCH)
        now = time.time()
        for start in range(have, workflows, BATCH):
            batch = Batch(store)
            for n in range(start, min(start + BATCH, workflows)):
                batch.upsert(w4_row(n, now))
            await batch.commit()
        return workflows
    finally:
        await store.close()


def timed(command: list[str], runs: int, env: dict[str, str]) -> dict[str, object]:
    """Median and minimum wall seconds of ``runs`` fresh runs of ``command``."""
    walls: list[float] = []
    lines = 0
    for _ in range(runs):
        began = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
        walls.append(time.perf_counter() - began)
        lines = done.stdout.count("\n")
    return {
        "command": " ".join(command[1:]),
        "median_s": round(statistics.median(walls), 3),
        "min_s": round(min(walls), 3),
        "lines": lines,
        "load": round(os.getloadavg()[0], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workflows", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--store", type=Path, default=Path(".dagq/list-scale.db"))
    args = parser.parse_args()
    args.store.parent.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{args.store.resolve()}"
    began = time.perf_counter()
    asyncio.run(fill(url, args.workflows))
    filled = time.perf_counter() - began
    print(json.dumps({"store": str(args.store), "workflows": args.workflows, "fill_s": filled}))
    dagq = str(Path(sys.executable).with_name("dagq"))
    env = {**os.environ, "DAGQ_STORE": url, "DAGQ_CONFIG": ""}
    for extra in ([], ["--status", "failed"], ["--json"]):
        print(json.dumps(timed([dagq, "list", *extra], args.runs, env)), flush=True)


if __name__ == "__main__":
    main()
