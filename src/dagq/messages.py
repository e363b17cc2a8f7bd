"""What travels on the queues: task messages to workers, events to the coordinator.

Bodies are msgpack (compact and fast); every struct is frozen. A completion-queue
message carries a batch of events so a busy worker sends few messages; on a store that
bills per request, a task-queue message may carry a bundle of task messages (a msgpack
array of them; a single task message is a msgpack map).
"""

import functools
from typing import Any, Literal

import msgspec

from dagq import payloads

#: An output larger than this (encoded as JSON) is stored as a document and passed
#: by reference.
OUTPUT_INLINE_LIMIT = payloads.OUTPUT_INLINE_BYTES
#: Upstream outputs above this total travel as a document instead of in the message.
INPUTS_INLINE_LIMIT = payloads.INPUTS_INLINE_BYTES


class TaskSpec(msgspec.Struct, frozen=True, omit_defaults=True, kw_only=True, gc=False):
    """What a worker needs to run a task, with params already rendered in.

    Not tracked by the garbage collector (a plan holds one per task; its fields are
    plain data that never refer back to it).
    """

    #: ``processor``: a task that says what to run only through ``kwargs`` (an
    #: ai4s-jobq form): the worker's processor runs it with ``args`` (those kwargs).
    kind: Literal["shell", "python", "processor"]
    cmd: str | list[str] | None = None
    call: str | None = None
    args: Any = None
    #: Set when ``args`` read upstream outputs: the worker renders them, with these
    #: params, once the inputs are known (so no text is ever rendered twice).
    render_args: bool = False
    params: dict[str, Any] = msgspec.field(default_factory=dict)
    env: dict[str, str] = msgspec.field(default_factory=dict)
    cwd: str | None = None
    timeout_s: float | None = None
    non_retryable_exit_codes: tuple[int, ...] = ()
    #: The task runs under ai4s-jobq semantics (docs/architecture.md §5): a failed
    #: attempt keeps the output it wrote, invalid JSON in the output file completes the
    #: task with no output and a warning, and the ai4s-jobq environment contract applies.
    jobq: bool = False
    #: ai4s-jobq's ``bg_dirsync_to``: where the task's files are copied while it runs
    #: and once at the end (a directory, or an azure:// blob prefix on the azure store).
    dirsync_to: str | None = None


class TaskMessage(msgspec.Struct, frozen=True, omit_defaults=True, kw_only=True):
    """One attempt of one task, as sent to a task queue."""

    workflow_id: str
    task: int
    name: str
    attempt: int
    spec: TaskSpec
    inputs: dict[str, Any] = msgspec.field(default_factory=dict)
    input_refs: dict[str, str] = msgspec.field(default_factory=dict)
    inputs_ref: str | None = None
    idempotency_key: str = ""
    #: A looping task's iteration (1-based) and what the previous one returned.
    iteration: int = 0
    previous: Any = None
    previous_ref: str | None = None
    #: This attempt's time limit when a task deadline leaves less than ``spec.timeout_s``.
    timeout_s: float | None = None
    #: The workflow's epoch when sent; a stop covers the attempts of its epoch and before.
    epoch: int = 0
    #: This is the task's compensation (its undo), not the task.
    undo: bool = False
    #: One instance of a foreach task: its index, and its item (inline, or in the
    #: items document ``item_ref`` at that index).
    item_index: int = -1
    item: Any = None
    item_ref: str | None = None
    #: The spec is too large for the message: it is this document (``spec`` holds only
    #: its kind). See :mod:`dagq.payloads`.
    spec_ref: str | None = None
    #: Even without its spec the message is too large: all of it is this document, and
    #: this message carries only what a worker needs before loading it.
    body_ref: str | None = None
    #: The W3C traceparent of this attempt's ``send`` span, and when the message was
    #: due (sent, plus its delay): set only while telemetry is on (see
    #: :mod:`dagq.observability`); messages without them decode as before.
    traceparent: str = ""
    due_at: float = 0.0
    #: The workflow's name, for the worker's spans (telemetry on only).
    workflow_name: str = ""
    #: When the coordinator dispatched this attempt (its clock; 0: not said, as in
    #: messages written before it was added): the workflow was running then, so a
    #: worker that starts the attempt soon after need not read its control document.
    dispatched_at: float = 0.0
    #: When this run of the workflow was submitted (its state's ``created_at``; 0: not
    #: said). A workflow purged and submitted again under the same id writes its
    #: documents (outputs, inputs, specs) under the same keys as the run before, so a
    #: worker keeps the documents it read by run and key.
    run: float = 0.0


# --- events to the coordinator ----------------------------------------------


class TaskStarted(msgspec.Struct, frozen=True, tag="started", kw_only=True):
    """A worker began an attempt."""

    workflow_id: str
    task: int
    attempt: int
    at: float
    worker: str = ""
    undo: bool = False
    item: int = -1
    #: How many times the message carrying the attempt has been delivered (2 and up: a
    #: delivery before did not finish it).
    delivery: int = 1


class TaskFinished(msgspec.Struct, frozen=True, tag="finished", omit_defaults=True, kw_only=True):
    """A worker finished an attempt, successfully or not."""

    workflow_id: str
    task: int
    attempt: int
    at: float
    ok: bool
    output: Any = None
    output_ref: str | None = None
    error: str | None = None
    retryable: bool = True
    retry_after_s: float | None = None
    #: The exception class of a failed Python task, for retry_on / no_retry_on.
    error_type: str | None = None
    duration_s: float = 0.0
    worker: str = ""
    #: The event reports on the task's compensation (its undo), not the task.
    undo: bool = False
    #: The event reports on one instance (item index) of a foreach task.
    item: int = -1
    #: Something the user should know about an attempt that still counts as done
    #: (ai4s-jobq semantics: invalid JSON in the output file), kept in the history.
    warning: str | None = None
    #: The W3C traceparent of the attempt's ``process`` span (telemetry on only).
    traceparent: str = ""


class SubmitRequested(msgspec.Struct, frozen=True, tag="submit", kw_only=True):
    """A client stored a new workflow; the coordinator should activate it."""

    workflow_id: str
    #: Who submitted it: filled in by the coordinator from the definition document
    #: (``Submitted.submitted_by``), which is there whichever way the run is found.
    actor: str = ""


class CancelRequested(msgspec.Struct, frozen=True, tag="cancel", kw_only=True):
    """A client asked to cancel a workflow."""

    workflow_id: str
    reason: str = "cancelled by request"
    #: Names this request: a copy delivered again is recognised and applied once.
    request_id: str = ""
    #: Who asked (the audit trail: recorded in the run's history).
    actor: str = ""


class SignalSent(msgspec.Struct, frozen=True, tag="signal", kw_only=True):
    """A client sent a signal (an approval, a decision) with optional data."""

    workflow_id: str
    name: str
    data: Any = None
    #: Names this request: a copy delivered again is recognised and applied once.
    request_id: str = ""
    #: Data too large for the event: the document holding it (JSON), stored by the
    #: client before it sent the signal.
    data_ref: str | None = None
    #: Who sent it (the audit trail: recorded in the run's history).
    actor: str = ""


class RetryRequested(msgspec.Struct, frozen=True, tag="retry", kw_only=True):
    """A client asked to re-run failed tasks (all, or the named ones) of a finished run."""

    workflow_id: str
    tasks: list[str] = msgspec.field(default_factory=list)
    #: Names this request: a copy delivered again is recognised and applied once.
    request_id: str = ""
    #: Names too many for the event: the document holding them (a JSON list).
    tasks_ref: str | None = None
    #: Who asked (the audit trail: recorded in the run's history).
    actor: str = ""


class DeadLetterHandled(msgspec.Struct, frozen=True, tag="dead_letter", kw_only=True):
    """Someone replayed or purged a dead letter that concerned the workflow: recorded in
    its history (``dead_letter_replayed`` / ``dead_letter_purged``), nothing else."""

    workflow_id: str
    #: "replayed" or "purged".
    action: str
    #: The dead letter's key, and what of this workflow it carried (tasks, events).
    key: str
    detail: str = ""
    #: Names this request: a copy delivered again is recorded once.
    request_id: str = ""
    #: Who did it (the audit trail).
    actor: str = ""


Event = (
    TaskStarted
    | TaskFinished
    | SubmitRequested
    | CancelRequested
    | RetryRequested
    | SignalSent
    | DeadLetterHandled
)


_encoder = msgspec.msgpack.Encoder()


# The decoders are built on first use: building one resolves the annotations of every
# struct it can meet (all of Event's), a cost for each command that never decodes one.
@functools.cache
def _task_decoder() -> msgspec.msgpack.Decoder[TaskMessage]:
    return msgspec.msgpack.Decoder(TaskMessage)


@functools.cache
def _batch_decoder() -> msgspec.msgpack.Decoder[list[Event]]:
    return msgspec.msgpack.Decoder(list[Event])


@functools.cache
def _tasks_decoder() -> msgspec.msgpack.Decoder[TaskMessage | list[TaskMessage]]:
    return msgspec.msgpack.Decoder(TaskMessage | list[TaskMessage])


def encode_task(message: TaskMessage) -> bytes:
    """Serialize a task message."""
    return _encoder.encode(message)


def decode_task(body: bytes) -> TaskMessage:
    """Parse a task message; raises msgspec.DecodeError/ValidationError if malformed."""
    try:
        return _task_decoder().decode(body)
    except RecursionError:
        raise _too_deep() from None


def join_tasks(encoded: list[bytes]) -> bytes:
    """One task-queue body carrying several encoded task messages (a bundle)."""
    return join_array(encoded)


def decode_tasks(body: bytes) -> list[TaskMessage]:
    """The task messages in a task-queue body: one, or a bundle's; raises msgspec
    errors if malformed."""
    try:
        decoded = _tasks_decoder().decode(body)
    except RecursionError:
        raise _too_deep() from None
    return decoded if isinstance(decoded, list) else [decoded]


def encode_event(event: Event) -> bytes:
    """Serialize one event; :func:`join_events` packs several into one message body."""
    return _encoder.encode(event)


def join_events(encoded: list[bytes]) -> bytes:
    """One completion-queue body (a msgpack array) from individually encoded events.

    Events are encoded one by one so a sender can measure them and split a batch
    below the queue's message size limit without encoding anything twice.
    """
    return join_array(encoded)


def join_array(encoded: list[bytes]) -> bytes:
    """A msgpack array of items that are already encoded, each on its own."""
    n = len(encoded)
    if n < 16:
        header = bytes([0x90 | n])
    elif n < 1 << 16:
        header = b"\xdc" + n.to_bytes(2, "big")
    else:
        header = b"\xdd" + n.to_bytes(4, "big")
    return header + b"".join(encoded)


def encode_events(events: list[Event]) -> bytes:
    """Serialize a batch of events for one completion-queue message."""
    return _encoder.encode(events)


def decode_events(body: bytes) -> list[Event]:
    """Parse a completion-queue message; raises msgspec errors if malformed (a value
    nested too deep to decode is malformed too: never a RecursionError)."""
    try:
        return _batch_decoder().decode(body)
    except RecursionError:
        raise _too_deep() from None


def _too_deep() -> msgspec.DecodeError:
    return msgspec.DecodeError("a value in the message is nested too deep to decode")
