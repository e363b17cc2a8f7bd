"""Turning a state machine's dispatch decision into a task message.

Upstream outputs ride in the message while they are small; above the inline limit
they travel as one ``inputs`` document, and outputs that were already stored by
reference are passed by their key, so no message ever exceeds the queue limit.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from dagq import keys
from dagq.machine import Dispatch
from dagq.messages import INPUTS_INLINE_LIMIT, TaskMessage, encode_task
from dagq.plan import Plan
from dagq.state import RunState, TaskStatus
from dagq.stores.base import OutgoingMessage


@dataclass(frozen=True, slots=True)
class Outgoing:
    """A task message ready to send, and the inputs document it needs stored first."""

    queue: str
    message: OutgoingMessage
    inputs_doc: tuple[str, bytes] | None = None


def task_message(plan: Plan, state: RunState, dispatch: Dispatch) -> Outgoing:
    """Build the message for one dispatched attempt."""
    task = plan.tasks[dispatch.task]
    workflow_id = state.workflow_id
    inputs = {}
    refs = {}
    for p in task.parents:
        if state.task_status[p] != TaskStatus.COMPLETED:
            continue
        name = plan.tasks[p].name
        ref = state.output_refs.get(p)
        if ref is not None:
            refs[name] = ref
        else:
            inputs[name] = state.outputs.get(p)
    inputs_doc = None
    inputs_ref = None
    if inputs:
        encoded = msgspec.json.encode(inputs)
        if len(encoded) > INPUTS_INLINE_LIMIT:
            inputs_ref = keys.inputs(workflow_id, dispatch.task, dispatch.attempt)
            inputs_doc = (inputs_ref, encoded)
            inputs = {}
    message = TaskMessage(
        workflow_id=workflow_id,
        task=dispatch.task,
        name=task.name,
        attempt=dispatch.attempt,
        spec=task.spec,
        inputs=inputs,
        input_refs=refs,
        inputs_ref=inputs_ref,
        idempotency_key=f"{workflow_id}/{task.name}",
    )
    body = encode_task(message)
    return Outgoing(
        queue=task.queue,
        message=OutgoingMessage(
            body=body,
            id=keys.message_id(workflow_id, task.name, dispatch.attempt),
            delay_s=max(dispatch.delay_s, 0.0),
        ),
        inputs_doc=inputs_doc,
    )
