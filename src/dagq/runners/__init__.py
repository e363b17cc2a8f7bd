"""Running one attempt of a task: a shell command or a Python function.

Each runner returns an :class:`Outcome`; it never raises for a task's own failure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dagq.errors import DamagedData
from dagq.payloads import decode_json


@dataclass(frozen=True, slots=True)
class TaskContext:
    """What a task may know about itself. Python tasks receive it as ``ctx``."""

    workflow_id: str
    task: str
    attempt: int
    idempotency_key: str
    inputs: dict[str, Any] = field(default_factory=dict)
    #: In a loop: which iteration this is (1-based; 0 outside loops) and what the
    #: previous iteration returned.
    iteration: int = 0
    previous: Any = None
    #: In a foreach: this instance's item and its index in the list (-1 outside).
    item: Any = None
    index: int = -1
    #: This attempt's task message id (``<workflow id>/<task>/<attempt>``; ai4s-jobq's
    #: ``JOBQ_TASK_ID``).
    task_id: str = ""
    #: A file the worker creates when the task must stop (its workflow was cancelled):
    #: :func:`dagq.jobq.is_cancelled` looks for it. Empty outside a worker.
    cancel_file: str = ""
    #: The W3C traceparent of the attempt's span (empty when tracing is off): a Python
    #: task runs inside it, a shell task gets it as ``TRACEPARENT``.
    traceparent: str = ""


@dataclass(frozen=True, slots=True)
class StoredInputs:
    """A task's upstream outputs as they are stored, not yet decoded.

    A Python task in a pool process gets these and decodes them there: a join over
    100,000 parents has an inputs document of megabytes, whose decoding (one C call
    that holds the GIL for tens of milliseconds) and pickling would otherwise stall
    the worker's event loop.
    """

    #: The inputs carried in the task message itself.
    inline: dict[str, Any] = field(default_factory=dict)
    #: The task's inputs document (JSON: parent name -> output), if it has one. On the
    #: way to a pool process that holds it already, a document's bytes are left out
    #: (None; :mod:`dagq.runners.held`).
    document: bytes | None = None
    document_key: str = ""
    #: Outputs stored one by one: (parent name, document key, JSON).
    outputs: tuple[tuple[str, str, bytes | None], ...] = ()

    def decode(self) -> dict[str, Any]:
        """The inputs by parent name (DamagedData if a document cannot be decoded)."""
        inputs = dict(self.inline)
        if self.document_key:
            what = f"inputs document ({self.document_key})"
            if self.document is None:
                raise DamagedData(f"{what} was not received")
            merged = decode_json(self.document, what)
            if not isinstance(merged, dict):
                raise DamagedData(f"{what} is not a mapping of outputs by parent name")
            inputs.update(merged)
        for name, key, data in self.outputs:
            if data is None:
                raise DamagedData(f"the output of '{name}' ({key}) was not received")
            inputs[name] = decode_json(data, f"the output of '{name}' ({key})")
        return inputs


@dataclass(frozen=True, slots=True)
class Outcome:
    """How an attempt ended."""

    ok: bool
    output: Any = None
    #: The output already encoded as JSON and checked against the bounds, when the
    #: runner has it (a pool process, a shell task's file): reporting then neither
    #: encodes it again nor needs ``output`` decoded when it goes by reference.
    output_json: bytes | None = None
    error: str | None = None
    retryable: bool = True
    retry_after_s: float | None = None
    error_type: str | None = None
    log: bytes = b""
    #: Something the user should know about an attempt that still counts (ai4s-jobq
    #: semantics: invalid JSON in the output file); sent with the completion.
    warning: str | None = None


def tail(text: str, limit: int = 2000) -> str:
    """The last ``limit`` characters of ``text``, marked when cut."""
    text = text.strip()
    return text if len(text) <= limit else "…" + text[-limit:]
