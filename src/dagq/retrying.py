"""Whether a failed attempt is tried again, and after how long (pure).

The answer depends on the failure (retryable? which exception type?), the task's
retry policy and what its earlier attempts used: attempts, total delay, time since
its round of attempts began (``task_deadline_s``).
"""

from __future__ import annotations

import msgspec

from dagq.backoff import retry_delay
from dagq.messages import TaskFinished
from dagq.plan import PlanTask


class Attempts(msgspec.Struct, frozen=True):
    """What a task's (or an instance's) earlier attempts used."""

    used: int
    delay_spent: float
    round_started: float | None


def decide_retry(
    task: PlanTask, event: TaskFinished, past: Attempts, now: float, key: str
) -> tuple[str | None, float]:
    """(None, delay) to retry after ``delay``; else (why not, 0)."""
    policy = task.retry
    if not event.retryable:
        return "not retryable", 0.0
    kind = event.error_type
    if kind is not None and kind in policy.no_retry_on:
        return f"{kind} is in no_retry_on", 0.0
    if kind is not None and policy.retry_on and kind not in policy.retry_on:
        return f"{kind} is not in retry_on", 0.0
    if past.used >= task.max_attempts:
        return f"{past.used} of {task.max_attempts} attempts used", 0.0
    delay = event.retry_after_s
    if delay is None:
        delay = retry_delay(policy, past.used, key)
    cap = policy.max_total_delay_s
    if cap is not None and past.delay_spent + delay > cap:
        return f"retry delays would pass max_total_delay_s={cap:g}", 0.0
    deadline = task.task_deadline_s
    started = now if past.round_started is None else past.round_started
    if deadline is not None and now + delay >= started + deadline:
        return f"task deadline of {deadline:g}s exceeded", 0.0
    return None, delay
