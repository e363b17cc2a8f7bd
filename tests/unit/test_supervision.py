"""Background tasks under a supervisor: a failure is restarted or stops the process."""

from __future__ import annotations

import asyncio
import logging

import pytest

from dagq import supervision
from dagq.supervision import BackgroundFailed, Supervisor

pytestmark = pytest.mark.timeout(10)


async def test_a_failed_task_that_may_restart_is_started_again(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(supervision, "FIRST_RESTART_S", 0.0)
    calls = 0
    second = asyncio.Event()

    async def flaky() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("boom")
        second.set()
        await asyncio.Event().wait()

    supervisor = Supervisor("test")
    with caplog.at_level(logging.ERROR, logger="dagq.supervision"):
        supervisor.start("flaky", flaky, restart=True)
        await asyncio.wait_for(second.wait(), 5)
    assert calls == 2
    supervisor.check()  # a restarted failure is not fatal
    assert "boom" in caplog.text and "restart 1" in caplog.text
    await supervisor.close()
    assert not supervisor.running("flaky")


async def test_a_failed_task_that_may_not_restart_is_fatal(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def keeper() -> None:
        raise RuntimeError("lease store exploded")

    supervisor = Supervisor("coordinator")
    with caplog.at_level(logging.CRITICAL, logger="dagq.supervision"):
        supervisor.start("lease", keeper, restart=False)
        await asyncio.wait_for(supervisor.failed.wait(), 5)
    with pytest.raises(BackgroundFailed, match="'lease' failed: RuntimeError: lease store"):
        supervisor.check()
    assert "Traceback" in caplog.text
    await supervisor.close()


async def test_a_task_that_returns_is_done_and_close_cancels_the_rest() -> None:
    supervisor = Supervisor("test")
    forever = asyncio.Event()

    async def quick() -> None:
        return None

    async def slow() -> None:
        await forever.wait()

    supervisor.start("quick", quick, restart=True)
    supervisor.start("slow", slow, restart=True)
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert not supervisor.running("quick")
    assert supervisor.running("slow")
    with pytest.raises(ValueError, match="running already"):
        supervisor.start("slow", slow, restart=True)
    await supervisor.close()
    assert not supervisor.running("slow")
    supervisor.check()
