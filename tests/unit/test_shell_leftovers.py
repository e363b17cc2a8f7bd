"""A shell task ends when its command does, even if a child it left running holds the
output pipes open: what it printed is kept, and the leftovers are killed."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path

import pytest

from dagq.messages import TaskSpec
from dagq.runners import TaskContext
from dagq.runners.shell import LINGER_S, run_shell

CTX = TaskContext(workflow_id="wf", task="t", attempt=1, idempotency_key="k")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.timeout(60)
async def test_a_background_child_holding_the_pipes_does_not_keep_the_task_running(
    tmp_path: Path,
) -> None:
    pids = tmp_path / "child.pid"
    cmd = f"(while true; do echo tick; sleep 0.2; done) & echo $! > {pids}; echo started"
    loop = asyncio.get_running_loop()
    began = loop.time()

    outcome = await asyncio.wait_for(
        run_shell(TaskSpec(kind="shell", cmd=cmd), CTX, work_dir=str(tmp_path)), 40
    )

    assert outcome.ok, outcome.error
    assert loop.time() - began < LINGER_S + 20  # it ended: it did not wait for the child
    log = (outcome.log or b"").decode()
    assert "started" in log and "tick" in log
    child = int(pids.read_text())
    for _ in range(100):
        if not _alive(child):
            break
        await asyncio.sleep(0.05)
    assert not _alive(child), "the child left running was not killed"


@pytest.mark.timeout(60)
async def test_a_task_ignoring_sigterm_is_killed_when_its_stop_is_cut_short(
    tmp_path: Path,
) -> None:
    # A worker's drain cancels the task (SIGTERM, grace period), then a second Ctrl-C
    # cancels that wait: the group must not be left running.
    pids = tmp_path / "task.pid"
    cmd = f"trap '' TERM; echo $$ > {pids}; while true; do sleep 0.1; done"
    job = asyncio.create_task(
        run_shell(TaskSpec(kind="shell", cmd=cmd), CTX, work_dir=str(tmp_path))
    )
    for _ in range(400):
        if pids.exists() and pids.read_text().strip():
            break
        await asyncio.sleep(0.05)
    pid = int(pids.read_text())
    try:
        await asyncio.sleep(0.5)
        job.cancel()  # the drain's cancel: SIGTERM, ignored; the grace period starts
        await asyncio.sleep(0.3)
        assert _alive(pid), "SIGTERM was expected to be ignored by the task"
        job.cancel()  # stop now
        with pytest.raises(asyncio.CancelledError):
            await job
        assert not await _still_running(pid), "the task's process was left running"
    finally:
        _kill(pid)  # a failing run leaves nothing behind


@pytest.mark.timeout(60)
async def test_a_task_cancelled_as_soon_as_it_started_is_killed(tmp_path: Path) -> None:
    pids = tmp_path / "task.pid"
    cmd = f"trap '' TERM; echo $$ > {pids}; while true; do sleep 0.1; done"
    job = asyncio.create_task(
        run_shell(TaskSpec(kind="shell", cmd=cmd), CTX, work_dir=str(tmp_path))
    )
    while not (pids.exists() and pids.read_text().strip()):
        await asyncio.sleep(0.001)
    pid = int(pids.read_text())
    try:
        job.cancel()
        with pytest.raises(asyncio.CancelledError):
            await job
        assert not await _still_running(pid), "the task's process was left running"
    finally:
        _kill(pid)


async def _still_running(pid: int) -> bool:
    """Whether ``pid`` is still alive after up to 10 s."""
    for _ in range(200):
        if not _alive(pid):
            return False
        await asyncio.sleep(0.05)
    return _alive(pid)


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.timeout(60)
async def test_a_task_cancelled_at_any_point_of_its_start_leaves_no_descriptor_open(
    tmp_path: Path,
) -> None:
    # Cancelled after 0, 1, 2, ... turns of the loop: somewhere among them between the
    # spawn and the wait (the output pipes half set up), where nothing closed them.
    spec = TaskSpec(kind="shell", cmd="sleep 30")
    await asyncio.sleep(0)
    before = _open_fds()
    for turns in range(40):
        job = asyncio.create_task(run_shell(spec, CTX, work_dir=str(tmp_path)))
        for _ in range(turns):
            await asyncio.sleep(0)
        job.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await job
    for _ in range(100):  # transports close on the loop's next turns
        if _open_fds() <= before:
            break
        await asyncio.sleep(0.02)
    assert _open_fds() <= before
