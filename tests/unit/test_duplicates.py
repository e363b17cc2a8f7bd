"""Every message delivered twice: each task message and each completion message is
sent in two copies with different ids (as Azure Queue Storage would deliver a
re-sent message), and the engine still ends every workflow correctly, applying each
completion once."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

from dagq.history import read_history
from dagq.local import LocalRunner
from dagq.stores.base import OutgoingMessage
from dagq.stores.memory import open_memory_store
from dagq.views import load_view
from tests.helpers import definition

pytestmark = pytest.mark.timeout(30)


class Doubling:
    """Queues that send every message twice, the copy under a fresh id."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.copies = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def send(self, queue: str, messages: Sequence[OutgoingMessage]) -> None:
        await self._inner.send(queue, messages)
        copies = [OutgoingMessage(m.body, delay_s=m.delay_s) for m in messages]
        await self._inner.send(queue, copies)
        self.copies += len(copies)


async def test_a_workflow_ends_right_when_every_message_arrives_twice() -> None:
    store = open_memory_store()
    doubling = Doubling(store.queues)
    store.queues = doubling  # type: ignore[assignment]
    tasks: list[dict[str, Any]] = [{"name": "root", "call": "tests.sample_tasks:echo"}]
    tasks += [
        {"name": f"f{i}", "call": "tests.sample_tasks:echo", "depends_on": ["root"]}
        for i in range(20)
    ]
    flaky = {"name": "flaky", "call": "tests.sample_tasks:busy_once", "num_retries": 2}
    tasks.append({**flaky, "depends_on": ["root"]})
    tasks.append(
        {"name": "join", "call": "tests.sample_tasks:echo", "depends_on": ["flaky", "f0", "f19"]}
    )
    runner = LocalRunner(store, workers=4)
    result = await runner.submit(definition(tasks), params={}, workflow_id="w")

    status = await asyncio.wait_for(runner.drive(), 20)

    assert status == "completed"
    assert doubling.copies > 20  # the duplicates really went out
    view = await load_view(store, result.workflow_id)
    attempts = {t.name: (t.status, t.attempts) for t in view.tasks}
    assert attempts.pop("flaky") == ("completed", 2)
    assert set(attempts.values()) == {("completed", 1)}
    history = await read_history(store, "w")
    completed = Counter(e.task for e in history if e.kind == "completed")
    assert set(completed.values()) == {1} and len(completed) == len(tasks)
