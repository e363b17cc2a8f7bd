"""Compiled plans shared by everything in one process, by definition fingerprint.

A plan depends only on a definition and its resolved params, and the fingerprint of a
submitted workflow is a hash of both (:func:`dagq.submission.fingerprint`). In one
process the client compiles a definition when it submits it, the coordinator when it
loads the workflow, and every reader of the run (``Client.status``, ``wait``, the
summary ``dagq run`` prints) when it reads it: compiled once here, each of them takes
the same plan (a 1,000-task plan costs ~40 ms to compile; 200 submits of one
definition compiled it 200 times). Plans are never changed by those who use them, so
one object is shared.

Bounded by the tasks of the plans kept, least recently used first out; a plan larger
than the bound is compiled and not kept (a million-task run's plan lives as long as
its coordinator holds it, no longer).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from dagq.definition import WorkflowDef
from dagq.plan import Plan, compile_plan

#: The tasks of all plans kept together, at most.
MAX_TASKS = 200_000


class Compiled:
    """Plans by fingerprint, least recently used first out (safe from any thread)."""

    def __init__(self, max_tasks: int = MAX_TASKS) -> None:
        self.max_tasks = max_tasks
        self._plans: OrderedDict[str, Plan] = OrderedDict()
        self._tasks = 0
        self._lock = threading.Lock()
        #: Plans compiled here (a cache that compiles too often shows in tests).
        self.compiles = 0

    def get(self, fingerprint: str) -> Plan | None:
        """The plan kept for ``fingerprint``, if any."""
        with self._lock:
            found = self._plans.get(fingerprint)
            if found is not None:
                self._plans.move_to_end(fingerprint)
            return found

    def plan(self, definition: WorkflowDef, params: Mapping[str, Any], fingerprint: str) -> Plan:
        """The plan of ``definition`` with ``params``, whose fingerprint is ``fingerprint``:
        kept, or compiled now (outside the lock: two threads may both compile a new one,
        and either plan is the same)."""
        found = self.get(fingerprint)
        if found is not None:
            return found
        plan = compile_plan(definition, params)
        with self._lock:
            self.compiles += 1
        self.keep(fingerprint, plan)
        return plan

    def keep(self, fingerprint: str, plan: Plan) -> None:
        """Keep a plan compiled elsewhere for ``fingerprint``."""
        size = len(plan.tasks)
        with self._lock:
            if size > self.max_tasks or fingerprint in self._plans:
                return
            self._plans[fingerprint] = plan
            self._tasks += size
            while self._tasks > self.max_tasks:
                _, dropped = self._plans.popitem(last=False)
                self._tasks -= len(dropped.tasks)

    def clear(self) -> None:
        """Forget every plan."""
        with self._lock:
            self._plans.clear()
            self._tasks = 0


#: This process's plans.
PLANS = Compiled()


def plan_of(definition: WorkflowDef, params: Mapping[str, Any], fingerprint: str) -> Plan:
    """The plan of a definition with its params (and their fingerprint), compiled at
    most once in this process while it is kept."""
    return PLANS.plan(definition, params, fingerprint)
