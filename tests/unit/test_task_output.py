"""A Python task's output in a pool process: captured per attempt at the file
descriptor level, handed to a live sink as it comes, and everything put back after."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import pytest

from dagq.live_logs import CUT_NOTE, MAX_LIVE_BYTES, LiveLog
from dagq.runners import TaskContext
from dagq.runners.capture import ProcessOutput
from dagq.runners.child import _Redirection
from dagq.runners.pool import TaskPool
from dagq.stores.memory import open_memory_store

pytestmark = pytest.mark.timeout(30)

CTX = TaskContext(workflow_id="w", task="t", attempt=1, idempotency_key="k")


async def test_each_attempt_keeps_only_its_own_output() -> None:
    pool = TaskPool(1)
    try:
        first = await pool.run("tests.sample_tasks:say", {"text": "one", "stderr": "e1"}, CTX, None)
        second = await pool.run("tests.sample_tasks:say", {"text": "two"}, CTX, None)
    finally:
        await pool.close()

    assert first.log == b"--- stdout ---\none\n\n--- stderr ---\ne1\n"
    assert second.log == b"--- stdout ---\ntwo\n\n--- stderr ---\n"
    assert pool.started == 1  # the same process ran both


async def test_the_output_of_a_task_killed_at_its_timeout_is_kept() -> None:
    pool = TaskPool(1)
    try:
        outcome = await pool.run("tests.sample_tasks:say", {"text": "hi", "seconds": 30}, CTX, 1.0)
    finally:
        await pool.close()

    assert not outcome.ok
    assert "timed out" in (outcome.error or "")
    assert b"hi\n" in outcome.log


async def test_a_live_sink_gets_each_line_while_the_task_runs() -> None:
    seen: list[bytes] = []
    first_line = asyncio.Event()

    def sink(chunk: bytes) -> None:
        seen.append(chunk)
        first_line.set()

    pool = TaskPool(1)
    try:
        running = asyncio.ensure_future(
            pool.run(
                "tests.sample_tasks:say", {"text": "early", "seconds": 1.0}, CTX, None, live=sink
            )
        )
        await asyncio.wait_for(first_line.wait(), 10)
        assert not running.done()  # the line came while the task still ran
        await running
    finally:
        await pool.close()

    assert b"".join(seen) == b"early\n"


async def test_a_task_that_replaces_sys_stdout_does_not_silence_the_next() -> None:
    pool = TaskPool(1)
    try:
        await pool.run("tests.sample_tasks:hijack_stdout", {"text": "mine"}, CTX, None)
        after = await pool.run("tests.sample_tasks:say", {"text": "still heard"}, CTX, None)
    finally:
        await pool.close()

    assert b"still heard" in after.log


async def test_logging_without_a_handler_shows_info_and_is_undone_after() -> None:
    pool = TaskPool(1)
    try:
        during = await pool.run(
            "tests.sample_tasks:log_at", {"level": "info", "text": "x"}, CTX, None
        )
        again = await pool.run(
            "tests.sample_tasks:log_at", {"level": "debug", "text": "y"}, CTX, None
        )
    finally:
        await pool.close()

    assert b"INFO root: x" in during.log
    assert during.output == {"level": logging.INFO, "handlers": 1}
    assert again.output == {"level": logging.INFO, "handlers": 1}  # set up afresh, once
    assert b"y" not in again.log


async def test_live_output_is_bounded_and_says_where_it_stops() -> None:
    store = open_memory_store()
    live = LiveLog(store.documents, "logs/w/0000000-1-live/")
    for _ in range(40):
        live.write(b"z" * 64 * 1024)  # 2.5 MiB in all
    await live.close()

    keys = await store.documents.list("logs/w/0000000-1-live/")
    data = b"".join([(await store.documents.get(k)).data for k in keys])  # type: ignore[union-attr]

    assert len(data) == MAX_LIVE_BYTES + len(CUT_NOTE)
    assert data.endswith(CUT_NOTE)
    await store.close()


async def test_the_pool_process_tells_whether_output_waits_unread(tmp_path: Path) -> None:
    output = ProcessOutput(str(tmp_path), "p")
    output.open()
    redirection = _Redirection()
    try:
        attempt = output.begin()
        written = redirection.targets(output.paths)  # the pool process's write ends
        assert not redirection.unread(output.paths)
        os.write(written[1], b"late\n")
        assert redirection.unread(output.paths)
        output.end()  # drains
        assert not redirection.unread(output.paths)
        assert attempt.stderr.bytes() == b"late\n"
        assert redirection.unread(("elsewhere.out", "elsewhere.err"))  # unsure: yes
    finally:
        for fd in redirection.fifos.get(output.paths, ()):
            os.close(fd)
        output.close()


async def test_the_end_of_an_attempt_reads_nothing_when_told_nothing_waits(
    tmp_path: Path,
) -> None:
    output = ProcessOutput(str(tmp_path), "p")
    output.open()
    writer = os.open(output.paths[0], os.O_WRONLY)
    try:
        attempt = output.begin()
        os.write(writer, b"left by something the task started\n")
        output.end(drain=False)
        assert attempt.stdout.bytes() == b""  # not read into this attempt
    finally:
        os.close(writer)
        output.close()


async def test_a_task_that_wrote_nothing_spares_the_worker_its_drain(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    drains: list[bool] = []
    end = ProcessOutput.end

    def recorded(self: ProcessOutput, *, drain: bool = True) -> None:
        drains.append(drain)
        end(self, drain=drain)

    monkeypatch.setattr(ProcessOutput, "end", recorded)
    pool = TaskPool(1)
    try:
        silent = await pool.run("tests.sample_tasks:echo", {"a": 1}, CTX, None)
        spoke = await pool.run(
            "tests.sample_tasks:say", {"text": "heard", "stderr": "e"}, CTX, None
        )
    finally:
        await pool.close()

    assert silent.ok and silent.output == {"a": 1}
    assert silent.log == b""
    assert drains[0] is False
    assert spoke.log == b"--- stdout ---\nheard\n\n--- stderr ---\ne\n"
