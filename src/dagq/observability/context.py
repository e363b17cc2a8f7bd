"""What the current work concerns, for log lines: a workflow, a task, an attempt, and
the trace and span they belong to (a context variable, so concurrent tasks of one
worker each log their own)."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import msgspec

from dagq.observability import ids


class Concern(msgspec.Struct, frozen=True):
    """The work a log line is about."""

    workflow_id: str
    task: str = ""
    attempt: int = 0
    span_id: int = 0

    def fields(self) -> dict[str, str | int]:
        """The fields a structured log line gets."""
        out: dict[str, str | int] = {
            "workflow_id": self.workflow_id,
            "trace_id": ids.trace_hex(self.workflow_id),
        }
        if self.task:
            out["task"] = self.task
        if self.attempt:
            out["attempt"] = self.attempt
        if self.span_id:
            out["span_id"] = f"{self.span_id:016x}"
        return out


current: contextvars.ContextVar[Concern | None] = contextvars.ContextVar(
    "dagq_concern", default=None
)


@contextlib.contextmanager
def concerning(concern: Concern) -> Iterator[None]:
    """Log lines made in this block (and tasks it starts) are about ``concern``."""
    token = current.set(concern)
    try:
        yield
    finally:
        current.reset(token)
