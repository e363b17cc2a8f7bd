"""Small builders shared by the tests (not a test module)."""

from __future__ import annotations

import asyncio
from typing import Any

from dagq import keys, machine
from dagq.loading import load_data
from dagq.messages import Event, SubmitRequested, TaskFinished, TaskStarted, decode_events
from dagq.plan import Plan, compile_plan, resolve_params
from dagq.state import RunState, TaskStatus
from dagq.stores.base import Store


async def finished(store: Store, n: int) -> list[TaskFinished]:
    """The first ``n`` completion events (waits for them)."""
    events: list[TaskFinished] = []
    while len(events) < n:
        got = await store.queues.receive(
            keys.COMPLETIONS_QUEUE, max_messages=32, visibility_timeout_s=60
        )
        for m in got:
            events += [e for e in decode_events(m.body) if isinstance(e, TaskFinished)]
        if not got:
            await store.queues.wait(keys.COMPLETIONS_QUEUE, 0.05)
    return events


def definition(tasks: list[dict[str, Any]], **workflow: Any) -> Any:
    """A validated definition from task dicts (shell tasks by default)."""
    for task in tasks:
        if not {"cmd", "call", "kwargs", "sleep_s", "wait_for"} & set(task):
            task["cmd"] = "true"
    return load_data({"name": "test", "tasks": tasks, **workflow}, source="test")


class Sim:
    """Drives the pure state machine by hand: no store, no clock, no workers."""

    def __init__(
        self,
        tasks: list[dict[str, Any]],
        *,
        overrides: dict[str, Any] | None = None,
        **workflow: Any,
    ) -> None:
        d = definition(tasks, **workflow)
        self.plan: Plan = compile_plan(d, resolve_params(d, overrides or {}))
        self.state = RunState("wf-1", len(self.plan.tasks), created_at=1000.0)
        self.now = 1000.0
        self.dispatched: list[tuple[str, int, float]] = []
        self.history: list[Any] = []
        self.finished = False
        self.stop = False

    def apply(self, event: Event) -> machine.Effects:
        fx = machine.Effects()
        machine.apply(self.plan, self.state, event, self.now, fx)
        self._collect(fx)
        return fx

    def _collect(self, fx: machine.Effects) -> None:
        self.dispatched += [
            (self.plan.tasks[d.task].name, d.attempt, d.delay_s) for d in fx.dispatch
        ]
        self.history += fx.history
        self.finished |= fx.finished
        self.stop |= fx.stop

    def start(self) -> machine.Effects:
        return self.apply(SubmitRequested(workflow_id="wf-1"))

    def index(self, name: str) -> int:
        return self.plan.by_name[name]

    def started(self, name: str, attempt: int | None = None) -> machine.Effects:
        i = self.index(name)
        return self.apply(
            TaskStarted(
                workflow_id="wf-1", task=i, attempt=attempt or self.state.attempt[i], at=self.now
            )
        )

    def finish(
        self,
        name: str,
        *,
        ok: bool = True,
        output: Any = None,
        attempt: int | None = None,
        **extra: Any,
    ) -> machine.Effects:
        i = self.index(name)
        return self.apply(
            TaskFinished(
                workflow_id="wf-1",
                task=i,
                attempt=attempt or self.state.attempt[i],
                at=self.now,
                ok=ok,
                output=output,
                **extra,
            )
        )

    def status(self, name: str) -> str:
        return TaskStatus(self.state.task_status[self.index(name)]).label

    def statuses(self) -> dict[str, str]:
        return {t.name: self.status(t.name) for t in self.plan.tasks}

    def ready_names(self) -> list[str]:
        return [
            t.name for t in self.plan.tasks if self.state.task_status[t.index] == TaskStatus.READY
        ]


class GatedQueues:
    """Queues whose sends to ``queue`` wait until ``open`` is set (after setting
    ``sending``): to hold a write in flight while a test does something else."""

    def __init__(self, inner: Any, queue: str) -> None:
        self._inner = inner
        self._queue = queue
        self.sending = asyncio.Event()
        self.open = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def send(self, queue: str, messages: Any) -> None:
        if queue == self._queue:
            self.sending.set()
            await self.open.wait()
        await self._inner.send(queue, messages)
