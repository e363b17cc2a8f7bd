"""The boundary around the coordinator's work on one workflow.

Each step of that work (load, resolve, apply, stage, commit, settle, sweep) runs
inside :func:`step`. What escapes a step is sorted by kind:

* a :class:`~dagq.errors.TransientError` (unreachable, throttled, a lost race) passes
  through unchanged: the work is retried later, with backoff;
* :class:`~dagq.errors.LeaseLost` passes through: the coordinator must stop;
* anything else — a :class:`~dagq.errors.PermanentError` (undecodable, too large,
  invalid) or an exception nobody expected — becomes a :class:`WorkflowFault`
  naming the step, and the coordinator quarantines that workflow alone
  (:mod:`dagq.quarantine`); it is never retried as it is.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from dagq.errors import LeaseLost, TransientError
from dagq.quarantine import Record, reason_of


class WorkflowFault(Exception):
    """One workflow's work failed for good at ``step``; the workflow is quarantined."""

    def __init__(self, step: str, cause: BaseException) -> None:
        super().__init__(reason_of(step, cause))
        self.step = step
        self.cause = cause
        self.reason = str(self)


class Held(Exception):
    """The workflow is quarantined already: its events are kept, not applied."""

    def __init__(self, record: Record | None, etag: str) -> None:
        super().__init__("quarantined")
        #: None when the record itself could not be decoded (it is replaced).
        self.record = record
        self.etag = etag


@contextmanager
def step(name: str) -> Iterator[None]:
    """Run one step of a workflow's work: a failure that is the workflow's own becomes
    a :class:`WorkflowFault`; transient errors and a lost lease pass through."""
    try:
        yield
    except (WorkflowFault, Held, TransientError, LeaseLost):
        raise
    except Exception as exc:
        raise WorkflowFault(name, exc) from exc
