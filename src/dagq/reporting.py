"""Reporting an attempt: the completion event, and the documents it points at.

A worker turns a runner's :class:`~dagq.runners.Outcome` into a small
:class:`~dagq.messages.TaskFinished` through the payload layer (:mod:`dagq.payloads`):

* the log tail is stored as a document (``keys.log``), never sent;
* an output above the inline limit is stored as a document and sent by reference; an
  output that is not JSON, is nested too deep or weighs more than
  ``payloads.MAX_OUTPUT_BYTES`` fails the attempt with a clear error (runners that
  have the output as JSON already — pool processes, shell tasks — check it there, off
  the event loop, and hand over the encoding);
* an error text above the inline limit is cut (head and tail kept) for the event, and
  the whole text is stored under ``keys.error`` (``dagq logs`` and ``Client.error``
  show it).

So a completion event stays far below the queue's message limit, whatever the task did.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import msgspec

from dagq import keys, payloads
from dagq.errors import DagqError, PayloadTooLarge
from dagq.messages import TaskFinished, TaskMessage
from dagq.runners import Outcome
from dagq.stores.base import Documents

#: An exception class name longer than this is cut (it rides in the event).
ERROR_TYPE_CHARS = 200


async def finished(
    documents: Documents,
    task: TaskMessage,
    outcome: Outcome,
    *,
    started: float,
    clock: Callable[[], float],
    worker: str,
    traceparent: str = "",
) -> TaskFinished:
    """The completion event of ``task``; what is too large for it is stored first.
    ``traceparent``: the attempt's ``process`` span (telemetry on), carried by the event."""
    puts: list[tuple[str, bytes]] = []
    if outcome.log:
        key = keys.log(
            task.workflow_id, task.task, task.attempt, item=task.item_index, undo=task.undo
        )
        puts.append((key, outcome.log))
    output, output_ref, error = outcome.output, None, outcome.error
    ok, retryable = outcome.ok, outcome.retryable
    # A failed attempt has an output only under ai4s-jobq semantics (what it wrote).
    if output is not None or outcome.output_json is not None:
        try:
            encoded = _encoded_output(outcome)
        except DagqError as exc:
            if ok:
                ok, retryable, error = False, False, str(exc)
            output = None
        else:
            if _too_large_inline(output, encoded):
                output_ref = keys.output(task.workflow_id, task.task, task.attempt)
                puts.append((output_ref, encoded))
                output = None
    if error is not None and len(error) > payloads.ERROR_INLINE_CHARS:
        key = keys.error(
            task.workflow_id, task.task, task.attempt, item=task.item_index, undo=task.undo
        )
        puts.append((key, error.encode("utf-8", "replace")))
        error = payloads.cut(error, note=_where_whole(task))
    if puts:
        await asyncio.gather(*(documents.put(key, data) for key, data in puts))
    now = clock()
    return TaskFinished(
        workflow_id=task.workflow_id,
        task=task.task,
        attempt=task.attempt,
        at=now,
        ok=ok,
        output=output,
        output_ref=output_ref,
        error=error,
        retryable=retryable,
        retry_after_s=outcome.retry_after_s,
        error_type=None if outcome.error_type is None else outcome.error_type[:ERROR_TYPE_CHARS],
        undo=task.undo,
        item=task.item_index,
        duration_s=now - started,
        worker=worker,
        warning=None if outcome.warning is None else payloads.cut(outcome.warning),
        traceparent=traceparent,
    )


def _encoded_output(outcome: Outcome) -> bytes:
    """The output as JSON, within the bounds (DagqError naming the one it breaks)."""
    if outcome.output_json is not None:  # encoded and checked by the runner
        return outcome.output_json
    encoded = payloads.encode_json(outcome.output, "the output")
    if len(encoded) > payloads.MAX_OUTPUT_BYTES:
        raise PayloadTooLarge(payloads.output_too_large(len(encoded), payloads.MAX_OUTPUT_BYTES))
    return encoded


def _too_large_inline(output: Any, encoded: bytes) -> bool:
    """Too large for the event, which is msgpack: a list of short floats weighs up to
    three times as much there as in JSON, so a JSON size near the limit is not enough."""
    if len(encoded) > payloads.OUTPUT_INLINE_BYTES:
        return True
    if len(encoded) * 3 <= payloads.OUTPUT_INLINE_BYTES:
        return False
    return len(msgspec.msgpack.encode(output)) > payloads.OUTPUT_INLINE_BYTES


def _where_whole(task: TaskMessage) -> str:
    """Where a person finds the whole text of a cut error."""
    options = f" --attempt {task.attempt}" if task.attempt > 1 else ""
    if task.item_index >= 0:
        options += f" --item {task.item_index}"
    if task.undo:
        options += " --undo"
    return f"whole text: dagq logs {task.workflow_id} {task.name}{options}"
