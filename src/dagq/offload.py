"""Running the CPU-heavy part of a large workflow's step in a thread.

When the root of a 100,000-task fan-out completes, one step of the coordinator makes
every task ready, builds 100,000 task messages and encodes a delta: seconds of pure
Python. On the event loop that would starve everything sharing it (heartbeats, the
lease keeper, the workers of ``dagq run``). So the step of a *heavy* workflow — one
over :data:`LARGE_TASKS` tasks and instances, or one whose foreach tasks may still
fan out — runs in a thread of its own; Python's GIL switch interval then hands the
loop the interpreter every few milliseconds.

While that thread runs, the workflow's working copy is being changed off the loop,
so nothing on the loop may read it: readers outside the coordinator wait for
:meth:`Offload.idle` (the coordinator's own work on one workflow is sequential), and
the cache never evicts a workflow that is :meth:`~Offload.busy`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ParamSpec, TypeVar

from dagq import garbage
from dagq.persistence import INLINE_TASKS
from dagq.plan import Plan
from dagq.state import RunState, TaskStatus

#: A workflow with more tasks and foreach instances than this has its steps run in a
#: thread (the threshold above which its state is stored as a base and deltas).
LARGE_TASKS = INLINE_TASKS
#: The name of the thread that runs heavy steps.
STEP_THREAD = "dagq-step"

_P = ParamSpec("_P")
_T = TypeVar("_T")


def heavy(plan: Plan, state: RunState) -> bool:
    """Could one step of this workflow keep the loop busy for long?

    A large workflow, yes (a fan-out, a cancel or a retry touches every task). A small
    one only while one of its foreach tasks has yet to expand (into any number of
    instances).
    """
    size = state.n_tasks + sum(g.n for g in state.groups.values())
    if size > LARGE_TASKS:
        return True
    return any(
        index not in state.groups
        and state.task_status[index] in (TaskStatus.PENDING, TaskStatus.READY)
        for index in plan.foreach
    )


class Offload:
    """Runs steps in a thread, one workflow at a time, and tells readers when it is done.

    The thread is started once, ahead (:meth:`start`), and reused: a thread started
    while another one holds the GIL waits for it to say it has started, and that took
    the loop 20-45 ms. One thread is enough: steps are pure Python, which the GIL
    runs one at a time anyway.
    """

    def __init__(self) -> None:
        self._busy: dict[str, asyncio.Future[object]] = {}
        self._thread: ThreadPoolExecutor | None = None
        #: How many steps ran in a thread (for tests and benchmarks).
        self.count = 0

    def start(self) -> None:
        """Start the thread that runs steps, if it is not running yet."""
        if self._thread is None:
            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=STEP_THREAD)
            self._thread.submit(int).result()  # the thread exists once this returns

    def close(self) -> None:
        """Let the thread end once it has finished what it runs (:meth:`start` starts
        another one)."""
        if self._thread is not None:
            self._thread.shutdown(wait=False)
            self._thread = None

    def release(self, *lists: list[Any]) -> None:
        """Let go of large lists (a fan-out's 100,000 sent task messages) in the step
        thread, a chunk at a time (:func:`dagq.garbage.release`), not on the loop.

        The thread holds them until it has emptied them, so whatever else the loop
        still holds (the committed batch) is freed cheaply whenever it goes. Without
        the thread (not started, or closed) the lists are simply left to the caller.
        """
        if self._thread is not None and any(len(items) > garbage.RELEASE_CHUNK for items in lists):
            self._thread.submit(garbage.release, *lists)

    def busy(self, workflow_id: str) -> bool:
        """Is a thread changing this workflow's working copy right now?"""
        return workflow_id in self._busy

    async def idle(self, workflow_id: str) -> None:
        """Return once no thread is changing this workflow's working copy."""
        while (running := self._busy.get(workflow_id)) is not None:
            await asyncio.wait({running})

    async def run(
        self,
        workflow_id: str,
        off_loop: bool,
        work: Callable[_P, _T],
        *args: _P.args,
        **kwargs: _P.kwargs,
    ) -> _T:
        """``work(*args, **kwargs)``: in a thread if ``off_loop``, else here and now.

        If the caller is cancelled meanwhile the thread still runs to its end, and the
        workflow stays busy until it has (its working copy is not the loop's before).
        """
        if not off_loop:
            return work(*args, **kwargs)
        if workflow_id in self._busy:  # the coordinator's work on one workflow is sequential
            raise RuntimeError(f"a step of {workflow_id} is already running in a thread")
        self.start()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[_T] = loop.run_in_executor(
            self._thread, lambda: work(*args, **kwargs)
        )
        self._busy[workflow_id] = future  # type: ignore[assignment]
        self.count += 1

        def done(_: asyncio.Future[_T]) -> None:
            self._busy.pop(workflow_id, None)
            if not future.cancelled():
                future.exception()  # retrieved: a caller cancelled meanwhile never will

        future.add_done_callback(done)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            with contextlib.suppress(BaseException):
                await asyncio.wait({future})  # the copy is the loop's again only then
            raise
