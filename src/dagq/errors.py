"""The exception tree: one root, a shallow hierarchy, messages that name what is wrong.

Store backends translate their driver errors into these at their boundary
(``raise StoreUnavailable(...) from exc``), so nothing above the stores ever sees
a driver exception.

Errors come in two kinds, and callers act on the kind, not on the message:

* **transient** (:class:`TransientError`): the store is unreachable, throttled, or a
  conditional write lost a race. Retrying later, with backoff, may succeed.
* **permanent** (:class:`PermanentError`): the data itself is at fault — too large,
  undecodable, invalid. Retrying can never help; the unit of work it belongs to (one
  workflow, one task, one message) fails or is quarantined, and nothing else stops.
"""

from __future__ import annotations


class DagqError(Exception):
    """Root of every error dagq raises on purpose."""


class TransientError(DagqError):
    """Retrying later may help (an outage, throttling, a lost race)."""


class PermanentError(DagqError):
    """Retrying will never help: the input or the stored data is at fault."""


class ValidationError(PermanentError):
    """A workflow definition, parameter or name is not acceptable.

    The message names the file, task and field at fault, and what to do.
    """


class UsageError(DagqError):
    """A command was called the wrong way (unknown workflow, bad option value)."""


class WorkflowNotFound(UsageError):
    """No workflow with that id exists in the store."""


class TaskNotFound(UsageError):
    """A workflow has no task with that name."""


class WorkflowExists(DagqError):
    """A workflow with that id exists already, with a different definition."""


# --- store errors -----------------------------------------------------------


class StoreError(DagqError):
    """Something went wrong talking to a store."""


class StoreUnavailable(StoreError, TransientError):
    """The store cannot be reached or refused the operation; retrying later may help."""


class ConflictError(StoreError, TransientError):
    """A conditional write lost: the document changed (if-match) or exists (if-none-match)."""


class NotFoundError(StoreError):
    """The document, message or row does not exist."""


class MessageTooLarge(StoreError, PermanentError):
    """A queue message body is over the portable size limit; send a reference instead."""


class DamagedData(StoreError, PermanentError):
    """A stored document or a message cannot be decoded (corrupt, truncated, foreign)."""


class PayloadTooLarge(ValidationError):
    """A value (a param, signal data, an output, a definition) is over a documented
    bound: too many bytes or nested too deep. The message names the value and the bound.
    """


class MessageLost(StoreError):
    """A receipt is no longer valid: the message was deleted or handed to another receiver."""


class LeaseHeld(StoreError):
    """A lease is held by another owner."""

    def __init__(self, name: str, holder: str, age_s: float, expires_in_s: float) -> None:
        super().__init__(
            f"lease {name!r} is held by {holder} (acquired {age_s:.0f}s ago, "
            f"expires in {expires_in_s:.0f}s unless renewed)"
        )
        self.name = name
        self.holder = holder
        self.age_s = age_s
        self.expires_in_s = expires_in_s


class LeaseLost(StoreError):
    """A lease we held expired or was taken over; the holder must stop writing."""


# --- signals raised by task code -------------------------------------------


class TaskSignal(DagqError):
    """Base of the exceptions a task may raise to steer its retries."""


class NonRetryable(TaskSignal):
    """Raise from a task to fail it at once, whatever retries are left."""


class RetryAfter(TaskSignal):
    """Raise from a task to fail this attempt and ask for the next one after ``seconds``."""

    def __init__(self, seconds: float, message: str = "") -> None:
        super().__init__(message or f"task asked to be retried after {seconds:g}s")
        self.seconds = float(seconds)
