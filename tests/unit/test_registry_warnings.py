"""A worker's record that cannot be written says why, even when the store only hangs."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from dagq import registry
from dagq.stores import open_store
from dagq.stores.intercepting import intercepted


def _record() -> registry.WorkerRecord:
    return registry.WorkerRecord(
        id="w1",
        host="here",
        pid=1,
        queues=["default"],
        concurrency=1,
        started_at=0.0,
        last_seen=0.0,
        heartbeat_s=0.05,
    )


async def _hang(operation: str, args: tuple[Any, ...], call: Callable[[], Awaitable[Any]]) -> Any:
    if operation.startswith("documents."):
        await asyncio.Event().wait()  # a store that never answers
    return await call()


async def test_a_store_that_does_not_answer_is_named_in_the_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = intercepted(open_store("memory://"), _hang)
    keeper = registry.Registration(store.documents, _record, clock=lambda: 0.0)
    with caplog.at_level(logging.WARNING, logger="dagq.worker"):
        await keeper.beat()
        keeper._key = registry.record_key("w1")
        await asyncio.wait_for(keeper.withdraw(), 10)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == (
        "cannot write this worker's record (retrying): the store did not answer within 1 s"
    )
    assert lines[1].endswith("(it expires on its own): the store did not answer within 5 s")
