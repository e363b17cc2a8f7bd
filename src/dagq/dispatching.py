"""Turning a state machine's dispatch decision into a task message.

Upstream outputs ride in the message while they are small; above the inline limit
they travel as one ``inputs`` document, and outputs that were already stored by
reference are passed by their key. A message still above
``payloads.TASK_MESSAGE_INLINE_BYTES`` sends its spec by reference, and if need be all
of itself, so no message ever exceeds the queue limit.

Where every request is billed (Azure), task messages sent together to one queue go
out as bundles: one queue message carrying several tasks (:func:`bundle`); a worker
starts what it can and gives the rest back (see :mod:`dagq.worker`). The coordinator
bundles the sends of a whole batch (:func:`bundle_sends`), so many workflows that each
dispatch one task share one queue message.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from dagq import keys
from dagq.machine import Dispatch
from dagq.messages import INPUTS_INLINE_LIMIT, TaskMessage, TaskSpec, encode_task, join_tasks
from dagq.observability import ids
from dagq.payloads import PREVIOUS_INLINE_BYTES, TASK_MESSAGE_INLINE_BYTES
from dagq.plan import Plan, PlanTask
from dagq.state import RunState, TaskStatus
from dagq.stores.base import BatchOp, OutgoingMessage, SendOp

#: A loop's previous output rides in the message up to this size, else as a document.
PREVIOUS_INLINE_LIMIT = PREVIOUS_INLINE_BYTES
#: A bundle's body stays under this many bytes (the queue limit is 48 KiB).
BUNDLE_BYTES = 40 * 1024


class Outgoing(msgspec.Struct, frozen=True):
    """A task message ready to send, and the inputs document it needs stored first."""

    queue: str
    message: OutgoingMessage
    documents: tuple[tuple[str, bytes], ...] = ()
    #: The id of this attempt's ``send`` span, named in the message (0: not traced).
    span_id: int = 0
    #: What the attempt runs (``task``, ``task[i]``, ``task#undo``) and its number.
    name: str = ""
    attempt: int = 0


def send_span_ids(workflow_id: str) -> tuple[int, int]:
    """(trace id, a new span id) for an attempt's ``send`` span."""
    return ids.trace_id(workflow_id), ids.new_span_id()


#: The inline inputs of tasks with the same parents, gathered once for a whole batch of
#: dispatches (a layer of 100 tasks each fed by the same 100 parents).
SharedInputs = dict[tuple[int, ...], tuple[dict[str, Any], dict[str, str]]]


def task_message(
    plan: Plan,
    state: RunState,
    dispatch: Dispatch,
    *,
    sent_at: float | None = None,
    traced: bool = True,
    dispatched_at: float = 0.0,
    shared: SharedInputs | None = None,
) -> Outgoing:
    """Build the message for one dispatched attempt (of a task, or of its undo).

    With ``sent_at`` (telemetry is on), the message says when it is due, for the
    worker's queue-wait metric and span; ``traced`` too (tracing is on), it names its
    ``send`` span (a W3C traceparent) and the workflow (for the worker's spans).
    ``dispatched_at`` is when the coordinator decided to send it (see the worker's
    control checks). ``shared`` keeps inline inputs for the other messages built from
    the same state: tasks with the same parents get the same inputs, gathered once.
    """
    task = plan.tasks[dispatch.task]
    workflow_id = state.workflow_id
    documents: list[tuple[str, bytes]] = []
    kept = None if shared is None or dispatch.undo else shared.get(task.parents)
    if kept is not None:
        (inputs, refs), inputs_ref = kept, None
    else:
        sources = list(task.parents)
        if dispatch.undo:  # an undo also sees what the task itself returned
            sources.append(dispatch.task)
        inputs, refs, inputs_ref = _inputs(plan, state, sources, dispatch, documents)
        if shared is not None and not dispatch.undo and inputs_ref is None:
            shared[task.parents] = (inputs, refs)
    iteration = 0 if dispatch.undo else state.iteration.get(dispatch.task, 0)
    previous, previous_ref = None, None
    if iteration > 1:  # a loop's next iteration sees what the last one returned
        previous_ref = state.output_refs.get(dispatch.task)
        previous = state.outputs.get(dispatch.task)
        encoded = msgspec.json.encode(previous)
        if previous_ref is None and len(encoded) > PREVIOUS_INLINE_LIMIT:
            previous_ref = keys.inputs(workflow_id, dispatch.task, dispatch.attempt) + "-previous"
            documents.append((previous_ref, encoded))
        if previous_ref is not None:
            previous = None
    spec, queue = task.spec, task.queue
    if dispatch.undo:
        assert task.undo is not None
        spec, queue = task.undo.spec, task.undo.queue
    item, item_ref = None, None
    if dispatch.item >= 0:  # one instance of a foreach task
        group = state.groups[dispatch.task]
        if group.items is not None:
            item = group.items[dispatch.item]
        else:
            item_ref = group.items_ref
    span_id, traceparent, due_at, workflow_name = 0, "", 0.0, ""
    if sent_at is not None:  # the defaults are left out of the message
        due_at = sent_at + max(dispatch.delay_s, 0.0)
        if traced:
            span_id, traceparent = ids.new_traceparent(workflow_id)
            workflow_name = plan.name
    message = TaskMessage(
        workflow_id=workflow_id,
        task=dispatch.task,
        name=task.name,
        attempt=dispatch.attempt,
        spec=spec,
        inputs=inputs,
        input_refs=refs,
        inputs_ref=inputs_ref,
        idempotency_key=keys.idempotency_key(
            workflow_id, task.name, item=dispatch.item, undo=dispatch.undo
        ),
        iteration=iteration,
        previous=previous,
        previous_ref=previous_ref,
        timeout_s=None if dispatch.undo else _attempt_timeout(task, state, dispatch),
        epoch=state.epoch,
        undo=dispatch.undo,
        item_index=dispatch.item,
        item=item,
        item_ref=item_ref,
        traceparent=traceparent,
        due_at=due_at,
        workflow_name=workflow_name,
        dispatched_at=dispatched_at,
        run=state.created_at,
    )
    body = encode_task(message)
    if len(body) > TASK_MESSAGE_INLINE_BYTES:
        body = _by_reference(message, body, documents)
    return Outgoing(
        queue=queue,
        message=OutgoingMessage(
            body=body,
            id=attempt_id(message),
            delay_s=max(dispatch.delay_s, 0.0),
        ),
        documents=tuple(documents),
        span_id=span_id,
        name=keys.attempt_name(task.name, item=dispatch.item, undo=dispatch.undo),
        attempt=dispatch.attempt,
    )


def _by_reference(message: TaskMessage, body: bytes, documents: list[tuple[str, bytes]]) -> bytes:
    """The body of a task message too large to send: its spec (a large param rendered
    into a command, a long undo command) goes to a document shared by every attempt;
    if that is not enough, the whole message goes to a document of its own and the
    message keeps only what a worker needs before it loads it."""
    workflow_id, spec = message.workflow_id, message.spec
    spec_ref = keys.spec(workflow_id, message.task, undo=message.undo)
    documents.append((spec_ref, msgspec.msgpack.encode(spec)))
    message = msgspec.structs.replace(message, spec=TaskSpec(kind=spec.kind), spec_ref=spec_ref)
    body = encode_task(message)
    if len(body) <= TASK_MESSAGE_INLINE_BYTES:
        return body
    body_ref = keys.task_body(
        workflow_id, message.task, message.attempt, item=message.item_index, undo=message.undo
    )
    documents.append((body_ref, body))
    stub = TaskMessage(
        workflow_id=workflow_id,
        task=message.task,
        name=message.name,
        attempt=message.attempt,
        spec=message.spec,
        idempotency_key=message.idempotency_key,
        timeout_s=message.timeout_s,
        epoch=message.epoch,
        undo=message.undo,
        item_index=message.item_index,
        body_ref=body_ref,
        traceparent=message.traceparent,
        due_at=message.due_at,
        workflow_name=message.workflow_name,
        dispatched_at=message.dispatched_at,
    )
    return encode_task(stub)


def attempt_id(task: TaskMessage) -> str:
    """The id of an attempt's task message: one id per (task or instance or undo, attempt)."""
    name = keys.attempt_name(task.name, item=task.item_index, undo=task.undo)
    return keys.message_id(task.workflow_id, name, task.attempt)


def _inputs(
    plan: Plan,
    state: RunState,
    sources: list[int],
    dispatch: Dispatch,
    documents: list[tuple[str, bytes]],
) -> tuple[dict[str, Any], dict[str, str], str | None]:
    """Upstream outputs inline, by reference, or (if too many) as one document.

    Under dagq's rules a task sees its completed parents; under ai4s-jobq's, every
    direct parent: a failed one's output too, and None where there is none (so the
    worker can write ai4s-jobq's upstream-refs file).
    """
    inputs: dict[str, Any] = {}
    refs: dict[str, str] = {}
    for p in sources:
        status = state.task_status[p]
        if status != TaskStatus.COMPLETED and not (plan.jobq and status == TaskStatus.FAILED):
            if plan.jobq:
                inputs[plan.tasks[p].name] = None
            continue
        name = plan.tasks[p].name
        ref = state.output_refs.get(p)
        if ref is not None:
            refs[name] = ref
        else:
            inputs[name] = state.outputs.get(p)
    if inputs:
        encoded = msgspec.json.encode(inputs)
        if len(encoded) > INPUTS_INLINE_LIMIT:
            if dispatch.item >= 0:  # every instance sees the same inputs: one document
                key = keys.inputs(state.workflow_id, dispatch.task, 0) + "-foreach"
            else:
                suffix = "-undo" if dispatch.undo else ""
                key = keys.inputs(state.workflow_id, dispatch.task, dispatch.attempt) + suffix
            documents.append((key, encoded))
            return {}, refs, key
    return inputs, refs, None


def _attempt_timeout(task: PlanTask, state: RunState, dispatch: Dispatch) -> float | None:
    """A task deadline may leave this attempt less time than its own timeout.

    The deadline counts from the task's first send (``round_started``); this attempt
    is sent at its own dispatch time (an instance's, for one of a foreach task).
    """
    deadline = task.task_deadline_s
    started = state.round_started.get(dispatch.task)
    if deadline is None or started is None:
        return None
    if dispatch.item >= 0:
        sent = state.groups[dispatch.task].dispatched_at[dispatch.item]
    else:
        sent = state.dispatched_at[dispatch.task]
    remaining = max(0.001, started + deadline - max(sent, started))
    if task.timeout_s is not None and task.timeout_s <= remaining:
        return None
    return remaining


def bundle(messages: Sequence[OutgoingMessage], size: int) -> list[OutgoingMessage]:
    """Pack task messages for one queue into bundles of up to ``size`` tasks.

    Only messages due now are packed (a delayed one keeps its own delay); a bundle
    stays under BUNDLE_BYTES and is named after its first task. ``size`` 1 packs
    nothing.
    """
    if size <= 1 or len(messages) < 2:
        return list(messages)
    out: list[OutgoingMessage] = []
    chunk: list[OutgoingMessage] = []
    used = 0

    def close() -> None:
        if len(chunk) == 1:
            out.append(chunk[0])
        elif chunk:
            bodies = [bytes(m.body) for m in chunk]
            out.append(OutgoingMessage(join_tasks(bodies), id=f"{chunk[0].id}+{len(chunk) - 1}"))
        chunk.clear()

    for message in messages:
        if message.delay_s > 0 or len(message.body) > BUNDLE_BYTES // 2:
            out.append(message)
            continue
        if chunk and (len(chunk) >= size or used + len(message.body) > BUNDLE_BYTES):
            close()
            used = 0
        chunk.append(message)
        used += len(message.body)
    close()
    return out


def bundle_sends(ops: list[BatchOp], size: int) -> None:
    """Merge a batch's sends to each queue into one, packed into bundles (in place).

    The merged send takes the place of the queue's last send, so in a batch committed
    in order no task message goes out before the state that dispatched it. ``size``
    1 changes nothing.
    """
    if size <= 1:
        return
    merged: dict[str, list[OutgoingMessage]] = {}
    last: dict[str, int] = {}
    for position, op in enumerate(ops):
        if isinstance(op, SendOp):
            merged.setdefault(op.queue, []).extend(op.messages)
            last[op.queue] = position
    kept: list[BatchOp] = []
    for position, op in enumerate(ops):
        if not isinstance(op, SendOp):
            kept.append(op)
        elif last[op.queue] == position:
            kept.append(SendOp(op.queue, bundle(merged[op.queue], size)))
    ops[:] = kept
