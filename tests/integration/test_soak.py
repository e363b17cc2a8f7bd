"""Soak: many workflows with random task failures while the coordinator and workers
are SIGKILLed and restarted at random; at the end every workflow is terminal, the
index agrees with the state, and every side effect happened at most once.

Short by default (CI); the long form is a documented command::

    DAGQ_SOAK_S=300 DAGQ_SOAK_WORKFLOWS=500 pytest tests/integration/test_soak.py -s
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.cli_harness import DagqCli, Started, lines, wait_until

SOAK_S = float(os.environ.get("DAGQ_SOAK_S", "20"))
WORKFLOWS = int(os.environ.get("DAGQ_SOAK_WORKFLOWS", "40"))

pytestmark = pytest.mark.timeout(SOAK_S + 300)

#: The effect is guarded by the idempotency key; then about one run in four fails.
FLAKY = (
    'k=effect-$(printf %s "$DAGQ_IDEMPOTENCY_KEY" | tr -c A-Za-z0-9 _); '
    'if [ ! -e "$k" ]; then touch "$k" && echo "$DAGQ_IDEMPOTENCY_KEY" >> effects.log; fi; '
    "[ $(od -An -N1 -tu1 /dev/urandom) -gt 60 ]"
)


def workflow(n: int) -> dict[str, object]:
    tasks: list[dict[str, object]] = [
        {"name": "a", "cmd": FLAKY, "num_retries": 4},
        {"name": "b", "cmd": FLAKY, "num_retries": 4, "depends_on": ["a"]},
        {"name": "c", "cmd": FLAKY, "num_retries": 4, "depends_on": ["a"]},
        {"name": "d", "cmd": FLAKY, "num_retries": 4, "depends_on": ["b", "c"]},
    ]
    if n % 10 == 0:  # some workflows are meant to fail
        tasks.append({"name": "boom", "cmd": "exit 3", "depends_on": ["a"]})
    return {"name": "soak", "tasks": tasks}


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[DagqCli]:
    with DagqCli(tmp_path) as cli:
        yield cli


def test_random_kills_lose_no_workflow_and_repeat_no_effect(cli: DagqCli) -> None:
    rng = random.Random(7)
    ids = [f"soak-{n}" for n in range(WORKFLOWS)]
    for n, workflow_id in enumerate(ids):
        cli.submit_here(workflow_id, workflow(n))
    worker_args = ("-q", "default", "-c", "4", "--visibility-timeout", "2")
    roles: dict[str, Started] = {
        "coordinator": cli.start("coordinator"),
        "worker-1": cli.start("worker", *worker_args),
        "worker-2": cli.start("worker", *worker_args),
    }
    kills: Counter[str] = Counter()
    order: list[str] = []
    ends = time.monotonic() + SOAK_S
    while time.monotonic() < ends:
        time.sleep(rng.uniform(0.5, 2.0))
        order = order or rng.sample(sorted(roles), len(roles))  # each in turn, shuffled
        victim = order.pop()
        roles[victim].kill()  # SIGKILL
        kills[victim] += 1
        args = ("coordinator",) if victim == "coordinator" else ("worker", *worker_args)
        roles[victim] = cli.start(*args)

    listed = wait_until(
        lambda: _all_terminal(cli, ids), timeout_s=240, what="every workflow to end"
    )

    statuses = Counter(row["status"] for row in listed.values())
    print(f"\nsoak: {WORKFLOWS} workflows, {SOAK_S:g}s, kills {dict(kills)}, {dict(statuses)}")
    assert len(kills) == 3 and kills.total() >= SOAK_S / 2.0
    assert set(statuses) <= {"completed", "failed"}
    assert statuses["failed"] >= WORKFLOWS // 10  # the ones meant to fail did
    effects = Counter(lines(cli.workdir / "effects.log"))
    assert [key for key, n in effects.items() if n > 1] == []  # no effect twice
    for workflow_id in ids:
        _, plan, st = cli.run_state(workflow_id)
        counts = dict(Counter(st.status_of(i).label for i in range(len(plan.tasks))))
        assert listed[workflow_id]["counts"] == counts, workflow_id  # the index agrees
        for i, task in enumerate(plan.tasks):
            if st.status_of(i).label == "completed":
                assert effects[f"{workflow_id}/{task.name}"] == 1, (workflow_id, task.name)
    for started in roles.values():
        assert started.process.poll() is None
        started.send(signal.SIGTERM)


def _all_terminal(cli: DagqCli, ids: list[str]) -> dict[str, dict[str, object]] | None:
    rows = {row["id"]: row for row in cli.json("list", "--limit", str(len(ids) + 10))}
    done = all(rows.get(i, {}).get("status") in ("completed", "failed") for i in ids)
    return rows if done else None
