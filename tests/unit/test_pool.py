"""The pool of processes that runs Python tasks: processes are reused from task to
task (never one per task), bounded by the slots, killed when their task is cancelled
or times out, replaced when they die, and all gone when the pool closes."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from dagq import zygote
from dagq.local import LocalRunner
from dagq.runners import StoredInputs, TaskContext
from dagq.runners.pool import TaskPool
from dagq.runners.python import add_import_paths
from dagq.stores.memory import open_memory_store
from dagq.submission import request_cancel
from dagq.views import load_view
from tests.helpers import definition
from tests.integration.cli_harness import pid_alive

pytestmark = pytest.mark.timeout(30)

CTX = TaskContext(workflow_id="w", task="t", attempt=1, idempotency_key="k")


async def until_gone(pid: int) -> None:
    deadline = time.monotonic() + 10
    while pid_alive(pid):
        assert time.monotonic() < deadline, f"process {pid} is still running"
        await asyncio.sleep(0.02)


async def test_one_process_runs_task_after_task() -> None:
    pool = TaskPool(4)
    try:
        pids = {(await pool.run("tests.sample_tasks:pid", {}, CTX, None)).output for _ in range(20)}
    finally:
        await pool.close()
    assert len(pids) == 1 and os.getpid() not in pids
    assert pool.started == 1


async def test_the_pool_adopts_the_zygote_launched_before_it() -> None:
    early = zygote.prestart()  # as `dagq run` does, before it imports the runtime
    pool = TaskPool(2)
    try:
        forked_by = (await pool.run("tests.sample_tasks:parent_pid", {}, CTX, None)).output
    finally:
        await pool.close()
    assert forked_by == early.process.pid
    assert early.process.poll() is not None  # closed with the pool
    later = zygote.take()  # adopted once: the next pool's is a new one
    later.control.close()  # it reads EOF and exits
    os.close(later.events)
    assert later.process.wait(timeout=10) == 0
    assert later.process.pid != early.process.pid


async def test_tasks_running_at_once_get_a_process_each_up_to_the_pool_size() -> None:
    pool = TaskPool(3)
    try:
        outcomes = await asyncio.gather(
            *(
                pool.run("tests.sample_tasks:async_pid", {"seconds": 0.3}, CTX, None)
                for _ in range(6)
            )
        )
    finally:
        await pool.close()
    assert all(o.ok for o in outcomes)
    assert len({o.output for o in outcomes}) == 3
    assert pool.started == 3


async def test_a_cancelled_task_has_its_process_killed_and_the_next_task_a_new_one(
    tmp_path: Path,
) -> None:
    pool = TaskPool(1)
    marker = tmp_path / "pid"
    try:
        running = asyncio.create_task(
            pool.run("tests.sample_tasks:pid_then_sleep", [str(marker), 60], CTX, None)
        )
        while not marker.exists() or not marker.read_text():
            await asyncio.sleep(0.02)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        await until_gone(int(marker.read_text()))
        after = await pool.run("tests.sample_tasks:pid", {}, CTX, None)
    finally:
        await pool.close()
    assert after.ok and after.output != int(marker.read_text())


async def test_a_timed_out_task_has_its_process_killed(tmp_path: Path) -> None:
    pool = TaskPool(1)
    marker = tmp_path / "pid"
    try:
        outcome = await pool.run("tests.sample_tasks:pid_then_sleep", [str(marker), 60], CTX, 0.5)
        await until_gone(int(marker.read_text()))
        after = await pool.run("tests.sample_tasks:pid", {}, CTX, 5)
    finally:
        await pool.close()
    assert outcome.error == "timed out after 0.5s; its process was killed"
    assert after.ok


async def test_closing_the_pool_ends_every_process(tmp_path: Path) -> None:
    pool = TaskPool(2)
    marker = tmp_path / "pid"
    idle = (await pool.run("tests.sample_tasks:pid", {}, CTX, None)).output
    busy = asyncio.create_task(
        pool.run("tests.sample_tasks:pid_then_sleep", [str(marker), 60], CTX, None)
    )
    while not marker.exists() or not marker.read_text():
        await asyncio.sleep(0.02)
    await asyncio.wait_for(pool.close(), 10)
    await until_gone(idle)
    await until_gone(int(marker.read_text()))
    assert (await busy).ok is False


async def test_a_directory_added_to_the_import_path_later_reaches_the_processes(
    tmp_path: Path,
) -> None:
    pool = TaskPool(1)
    try:
        pool.warm()
        first = await pool.run("late_module:answer", {}, CTX, None)
        (tmp_path / "late_module.py").write_text("def answer():\n    return 42\n")
        add_import_paths([str(tmp_path)])
        second = await pool.run("late_module:answer", {}, CTX, None)
    finally:
        await pool.close()
    assert "cannot import 'late_module:answer'" in (first.error or "")
    assert second.output == 42


async def test_cancelling_a_workflow_kills_the_process_of_its_running_python_task(
    tmp_path: Path,
) -> None:
    store = open_memory_store()
    runner = LocalRunner(store, workers=2)
    marker = tmp_path / "pid"
    task = {
        "name": "sleepy",
        "call": "tests.sample_tasks:pid_then_sleep",
        "args": [str(marker), 60],
    }
    await runner.submit(definition([task]), params={}, workflow_id="w")

    async def cancel_when_running(plan: object, st: object) -> None:
        if marker.exists() and marker.read_text() and not cancelled:
            cancelled.append(True)
            await request_cancel(store, "w", "enough")

    cancelled: list[bool] = []
    status = await asyncio.wait_for(runner.drive(cancel_when_running), 20)

    assert status == "cancelled"
    assert (await load_view(store, "w")).tasks[0].status == "cancelled"
    await until_gone(int(marker.read_text()))


async def test_a_process_that_died_is_noticed_though_its_own_child_holds_its_pipes(
    tmp_path: Path,
) -> None:
    pool = TaskPool(1)
    marker = tmp_path / "pid"
    try:
        outcome = await asyncio.wait_for(
            pool.run("tests.sample_tasks:fork_then_crash", [str(marker)], CTX, None), 10
        )
    finally:
        await pool.close()
    assert outcome.error == "its Python process was killed by signal SIGSEGV while running it"
    await until_gone(int(marker.read_text()))  # what the task started is killed too


async def test_stored_inputs_are_decoded_in_the_pool_process() -> None:
    stored = StoredInputs(
        inline={"a": 1},
        document=b'{"b": [2, 3]}',
        document_key="inputs/w/t",
        outputs=(("c", "outputs/w/c", b'"four"'),),
    )
    pool = TaskPool(1)
    try:
        outcome = await pool.run("tests.sample_tasks:inputs_of", {}, CTX, None, inputs=stored)
    finally:
        await pool.close()
    assert outcome.ok, outcome.error
    assert outcome.output == {"a": 1, "b": [2, 3], "c": "four"}


async def test_a_damaged_stored_input_fails_the_attempt_and_not_the_process() -> None:
    damaged = StoredInputs(document=b"{not json", document_key="inputs/w/t")
    pool = TaskPool(1)
    try:
        failed = await pool.run("tests.sample_tasks:inputs_of", {}, CTX, None, inputs=damaged)
        by_helper = await pool.run(
            "tests.sample_tasks:upstream_by_helper", {}, CTX, None, inputs=damaged
        )
        after = await pool.run("tests.sample_tasks:pid", {}, CTX, None)
    finally:
        await pool.close()
    assert not failed.ok
    assert (failed.error or "").startswith("cannot load upstream outputs: inputs document")
    assert not by_helper.ok and "inputs document (inputs/w/t)" in (by_helper.error or "")
    assert after.ok and pool.started == 1


async def test_inputs_are_decoded_only_for_a_function_that_can_see_them() -> None:
    """A function naming neither ``inputs`` nor ``ctx`` (a foreach instance that reads
    only its item) does not pay for decoding them; a dagq.jobq helper decodes them when
    it is asked."""
    damaged = StoredInputs(document=b"{not json", document_key="inputs/w/t")
    stored = StoredInputs(inline={"a": 1}, document=b'{"b": 2}', document_key="inputs/w/u")
    pool = TaskPool(1)
    try:
        unread = await pool.run("tests.sample_tasks:pid", {}, CTX, None, inputs=damaged)
        helper = await pool.run(
            "tests.sample_tasks:upstream_by_helper", {}, CTX, None, inputs=stored
        )
    finally:
        await pool.close()
    assert unread.ok, unread.error
    assert helper.ok and helper.output == {"a": 1, "b": 2}


async def test_stored_inputs_cross_to_a_process_once_and_fresh_bytes_again() -> None:
    """The instances of a foreach share their parents' outputs: a process is sent a
    document once and holds it; the same key with bytes fetched anew is sent anew."""
    first = StoredInputs(outputs=(("root", "outputs/w/root", b"[" + b"1," * 500_000 + b"1]"),))
    again = StoredInputs(outputs=(("root", "outputs/w/root", b"[1, 2]"),))
    pool = TaskPool(1)
    try:
        counted = [
            await pool.run("tests.sample_tasks:length", None, CTX, 30, inputs=first)
            for _ in range(20)
        ]
        (process,) = pool._processes
        held = len(process.held)
        fresh = await pool.run("tests.sample_tasks:length", None, CTX, 30, inputs=again)
        assert pool.started == 1
    finally:
        await pool.close()
    assert [o.output for o in counted] == [500_001] * 20
    assert held == 1
    assert fresh.output == 2


async def test_large_requests_and_replies_cross_whole_and_the_next_task_follows() -> None:
    """A reply is read a piece at a time (64 KiB, larger once its size is known); a
    reply of megabytes, a request of megabytes (stored inputs), and small ones right
    after, each reach the right task whole."""
    pool = TaskPool(2)
    inputs = StoredInputs(document=b'{"a": "' + b"y" * 3_000_000 + b'"}', document_key="doc")
    try:
        calls = [
            pool.run("tests.sample_tasks:big", {"size": 5_000_000}, CTX, 30),
            pool.run("tests.sample_tasks:length", None, CTX, 30, inputs=inputs),
            *(pool.run("tests.sample_tasks:big", {"size": n}, CTX, 30) for n in range(40)),
        ]
        outcomes = await asyncio.gather(*calls)
    finally:
        await pool.close()
    large, counted, *small = outcomes
    assert large.ok and large.output_json == b'"' + b"x" * 5_000_000 + b'"'
    assert large.output is None  # too large to travel inline: by reference, as JSON
    assert (counted.ok, counted.output) == (True, 3_000_000)
    assert [o.output for o in small] == ["x" * n for n in range(40)]
