"""Durable patterns survive a coordinator crash in the middle: a real ``dagq coordinator``
is SIGKILLed while a timer is pending, a task waits for a signal, a loop iterates, a
foreach fans out or a race is being run, and a fresh coordinator finishes the workflow correctly."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.cli_harness import DagqCli, wait_until

pytestmark = pytest.mark.timeout(90)

#: Python tasks the worker imports from the scratch directory.
TASKS = """
import json, os, time

def refine(ctx):
    previous = ctx.previous or {"draft": 0}
    with open("iterations.log", "a") as log:
        log.write(f"{ctx.iteration}\\n")
    time.sleep(0.3)
    draft = previous["draft"] + 1
    return {"draft": draft, "valid": draft >= 3}

def slow(seconds):
    time.sleep(seconds)
    return {"slept": seconds}

def split(n):
    return list(range(n))

def square(item, index):
    with open("items.log", "a") as log:
        log.write(f"{index}\\n")
    time.sleep(0.02)
    return item * item

def collect(inputs):
    return inputs["square"]

def mark(name):
    with open("ran.log", "a") as log:
        log.write(name + "\\n")
    return name
"""


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[DagqCli]:
    with DagqCli(tmp_path) as cli:
        (tmp_path / "pattern_tasks.py").write_text(TASKS)
        yield cli


def crash_and_restart(cli: DagqCli, coordinator: object) -> object:
    """SIGKILL the coordinator (no lease release, nothing flushed on the way out)."""
    coordinator.kill()  # type: ignore[attr-defined]
    return cli.start_coordinator()


def output(cli: DagqCli, workflow_id: str, task: str) -> object:
    result = cli.run("output", workflow_id, task)
    assert result.code == 0, result.output
    return json.loads(result.stdout)


def worker(cli: DagqCli) -> None:
    cli.start_worker("-q", "default", "-c", "4", "--import-path", str(cli.workdir))


def test_a_pending_timer_fires_after_a_coordinator_crash(cli: DagqCli) -> None:
    coordinator = cli.start_coordinator()
    worker(cli)
    cli.submit_here(
        "timer",
        {
            "name": "timer",
            "tasks": [
                {"name": "nap", "sleep_s": 2},
                {
                    "name": "after",
                    "call": "pattern_tasks:mark",
                    "args": {"name": "after"},
                    "depends_on": ["nap"],
                },
            ],
        },
    )
    wait_until(lambda: cli.statuses("timer")["nap"] == "waiting", timeout_s=10, what="the timer")
    crash_and_restart(cli, coordinator)
    assert cli.wait_for_end("timer", timeout_s=30) == "completed"
    assert (cli.workdir / "ran.log").read_text().split() == ["after"]


def test_a_signal_reaches_a_task_waiting_across_a_coordinator_crash(cli: DagqCli) -> None:
    coordinator = cli.start_coordinator()
    worker(cli)
    cli.submit_here(
        "approval",
        {
            "name": "approval",
            "tasks": [
                {"name": "review", "wait_for": {"signal": "approve", "timeout_s": 600}},
                {
                    "name": "publish",
                    "call": "pattern_tasks:mark",
                    "args": {"name": "publish"},
                    "depends_on": ["review"],
                    "condition": "inputs.review.approved",
                },
            ],
        },
    )
    wait_until(
        lambda: cli.statuses("approval")["review"] == "waiting", timeout_s=10, what="the wait"
    )
    crash_and_restart(cli, coordinator)
    sent = cli.run("signal", "approval", "approve", "--data", '{"approved": true}')
    assert sent.code == 0, sent.output
    assert cli.wait_for_end("approval", timeout_s=30) == "completed"
    assert output(cli, "approval", "review") == {"approved": True}
    assert (cli.workdir / "ran.log").read_text().split() == ["publish"]


def test_a_signal_sent_while_no_coordinator_runs_is_kept(cli: DagqCli) -> None:
    coordinator = cli.start_coordinator()
    cli.submit_here(
        "early",
        {
            "name": "early",
            "tasks": [
                {"name": "prepare", "call": "pattern_tasks:slow", "args": {"seconds": 0.1}},
                {"name": "review", "wait_for": {"signal": "go"}, "depends_on": ["prepare"]},
            ],
        },
    )
    coordinator.kill()
    assert cli.run("signal", "early", "go").code == 0  # before the task even waits
    cli.start_coordinator()
    worker(cli)
    assert cli.wait_for_end("early", timeout_s=30) == "completed"


def test_a_loop_resumes_its_iterations_after_a_coordinator_crash(cli: DagqCli) -> None:
    coordinator = cli.start_coordinator()
    worker(cli)
    cli.submit_here(
        "loop",
        {
            "name": "loop",
            "tasks": [
                {
                    "name": "refine",
                    "call": "pattern_tasks:refine",
                    "loop": {"until": "output.valid", "max_iterations": 5},
                },
            ],
        },
    )
    log = cli.workdir / "iterations.log"
    wait_until(
        lambda: log.exists() and "2" in log.read_text().split(),
        timeout_s=20,
        what="the second iteration",
    )
    crash_and_restart(cli, coordinator)
    assert cli.wait_for_end("loop", timeout_s=45) == "completed"
    assert output(cli, "loop", "refine") == {"draft": 3, "valid": True}
    iterations = log.read_text().split()
    assert iterations[-1] == "3" and set(iterations) == {"1", "2", "3"}


def test_a_foreach_fan_out_finishes_every_item_once_after_a_coordinator_crash(
    cli: DagqCli,
) -> None:
    coordinator = cli.start_coordinator()
    worker(cli)
    cli.submit_here(
        "fan",
        {
            "name": "fan",
            "tasks": [
                {"name": "split", "call": "pattern_tasks:split", "args": {"n": 60}},
                {
                    "name": "square",
                    "call": "pattern_tasks:square",
                    "depends_on": ["split"],
                    "foreach": "inputs.split",
                    "max_parallel": 4,
                },
                {"name": "collect", "call": "pattern_tasks:collect", "depends_on": ["square"]},
            ],
        },
    )
    log = cli.workdir / "items.log"
    wait_until(
        lambda: log.exists() and len(log.read_text().split()) >= 8,
        timeout_s=20,
        what="the instances to be running",
    )
    crash_and_restart(cli, coordinator)
    assert cli.wait_for_end("fan", timeout_s=60) == "completed"
    # Outputs in index order, one per item; an instance runs again only if it was
    # running when the coordinator died (at-least-once), never more than that.
    assert output(cli, "fan", "collect") == [i * i for i in range(60)]
    ran = [int(i) for i in log.read_text().split()]
    assert set(ran) == set(range(60))
    assert len(ran) - 60 <= 4


def test_a_race_won_before_a_crash_stays_won(cli: DagqCli) -> None:
    coordinator = cli.start_coordinator()
    worker(cli)
    cli.submit_here(
        "race",
        {
            "name": "race",
            "tasks": [
                {"name": "fast", "call": "pattern_tasks:slow", "args": {"seconds": 0.2}},
                {"name": "slow", "call": "pattern_tasks:slow", "args": {"seconds": 30}},
                {
                    "name": "first",
                    "call": "pattern_tasks:mark",
                    "args": {"name": "first"},
                    "depends_on": ["fast", "slow"],
                    "dep_policy": "any",
                    "cancel_remaining": True,
                },
            ],
        },
    )
    wait_until(
        lambda: cli.statuses("race")["slow"] == "cancelled",
        timeout_s=20,
        what="the loser to be cancelled",
    )
    crash_and_restart(cli, coordinator)
    assert cli.wait_for_end("race", timeout_s=30) == "completed"
    statuses = cli.statuses("race")
    assert statuses == {"fast": "completed", "slow": "cancelled", "first": "completed"}


def test_signal_bad_input_gets_a_clear_error(cli: DagqCli) -> None:
    cli.start_coordinator()
    cli.submit_here("s", {"name": "s", "tasks": [{"name": "w", "wait_for": {"signal": "go"}}]})
    unknown = cli.run("signal", "s", "stop")
    assert unknown.code == 2 and "waits for: go" in unknown.stderr
    missing = cli.run("signal", "nope", "go")
    assert missing.code == 2 and "no workflow 'nope'" in missing.stderr
    bad = cli.run("signal", "s", "go", "--data", "{oops")
    assert bad.code == 2 and "--data is not valid JSON" in bad.stderr


def test_early_signals_are_each_kept_for_the_next_wait_and_a_surplus_is_refused(
    cli: DagqCli,
) -> None:
    cli.start_coordinator()
    cli.submit_here(
        "twice",
        {
            "name": "twice",
            "tasks": [
                {"name": "prepare", "cmd": "true"},
                {"name": "first", "wait_for": {"signal": "go"}, "depends_on": ["prepare"]},
                {"name": "second", "wait_for": {"signal": "go"}, "depends_on": ["first"]},
            ],
        },
    )
    assert cli.run("signal", "twice", "go", "--data", "1").code == 0
    assert cli.run("signal", "twice", "go", "--data", "2").code == 0
    wait_until(
        lambda: cli.run_state("twice")[2].signals == {"go": [1, 2]},
        timeout_s=15,
        what="both signals to be kept",
    )

    surplus = cli.run("signal", "twice", "go", "--data", "3")

    assert surplus.code == 2, surplus.output
    assert "already holds 2 unused 'go' signal(s)" in surplus.stderr
    assert len(surplus.stderr.strip().splitlines()) == 1
    worker(cli)  # now 'prepare' runs and each wait takes the next signal
    assert cli.wait_for_end("twice", timeout_s=30) == "completed"
    assert (output(cli, "twice", "first"), output(cli, "twice", "second")) == (1, 2)


#: An undo that applies its side effect once per idempotency key, whatever reruns.
UNDO = (
    'grep -qx "$DAGQ_IDEMPOTENCY_KEY" undone.keys 2>/dev/null || '
    '{ sleep {pause}; echo "$DAGQ_IDEMPOTENCY_KEY" >> undone.keys; '
    'echo "$DAGQ_TASK" >> undone.log; }'
)


def saga(pause: float) -> dict[str, object]:
    undo = {
        "cmd": UNDO.replace("{pause}", str(pause)),
        "num_retries": 2,
        "retry": {"backoff_s": 0.1},
    }
    return {
        "name": "saga",
        "tasks": [
            {"name": "reserve", "cmd": "true", "compensate": undo},
            {"name": "charge", "cmd": "true", "depends_on": ["reserve"], "compensate": undo},
            {"name": "ship", "cmd": "exit 9", "depends_on": ["charge"]},
        ],
    }


def test_a_compensation_chain_survives_a_coordinator_crash_and_undoes_each_task_once(
    cli: DagqCli,
) -> None:
    coordinator = cli.start_coordinator()
    worker(cli)
    cli.submit_here("saga", saga(pause=1.5))
    wait_until(
        lambda: cli.workflow_status("saga") == "compensating",
        timeout_s=20,
        what="the compensation to start",
    )
    crash_and_restart(cli, coordinator)
    assert cli.wait_for_end("saga", timeout_s=60) == "failed"
    assert (cli.workdir / "undone.log").read_text().split() == ["charge", "reserve"]
    tasks = {t["name"]: t for t in cli.json("tasks", "saga")}
    assert tasks["reserve"]["compensation"] == tasks["charge"]["compensation"] == "done"


def test_an_undo_that_keeps_failing_ends_in_compensation_failed_and_doctor_says_so(
    cli: DagqCli,
) -> None:
    workflow = saga(pause=0)
    workflow["tasks"][0]["compensate"] = {
        "cmd": "exit 3",
        "num_retries": 1,  # type: ignore[index]
        "retry": {"backoff_s": 0.1},
    }
    cli.start_coordinator()
    worker(cli)
    cli.submit_here("saga", workflow)
    assert cli.wait_for_end("saga", timeout_s=60) == "compensation_failed"
    status = cli.run("status", "saga")
    assert "a compensation failed" in status.stdout
    doctor = cli.run("doctor")
    assert doctor.code == 1 and "compensation_failed" in doctor.stdout
    listed = cli.json("list")
    assert listed[0]["status"] == "compensation_failed"
