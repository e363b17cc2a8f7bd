"""The definition document of a workflow: what was submitted, exactly, and when.

Apart from :mod:`dagq.submission` (which writes it), so readers — ``dagq status``,
the console, the coordinator — decode it without importing the submit path.
"""

import functools
from typing import TYPE_CHECKING, Any

import msgspec

from dagq import keys
from dagq.definition import TaskDef, WorkflowDef
from dagq.errors import DamagedData, WorkflowNotFound
from dagq.keys import check_workflow_id
from dagq.stores.base import Store

if TYPE_CHECKING:
    from dagq.plan import Plan
    from dagq.state import RunState


class Submitted(msgspec.Struct, frozen=True, kw_only=True):
    """The definition document: what was submitted, exactly, and when."""

    workflow_id: str
    definition: WorkflowDef
    params: dict[str, Any]
    created_at: float
    fingerprint: str
    tenant: str = ""
    #: ``key: value`` pairs to find the run by (``GET /v1/workflows?label=k=v``).
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    #: Who submitted it (the audit trail; not part of the fingerprint).
    submitted_by: str = ""


class Created(msgspec.Struct, frozen=True, kw_only=True):
    """A new workflow as its submit has just stored it: what a coordinator of the same
    process would otherwise read back (definition, quarantine record, state)."""

    submitted: Submitted
    plan: "Plan"
    #: The initial state (nobody else holds it), and its etag as written — or "" when
    #: the submit left it unwritten: the coordinator's first commit writes it (the
    #: index row, flagged :data:`FIRST_STATE_HANDED`, was written before).
    state: "RunState"
    etag: str


#: In the ``data`` of a ``pending`` index row: its submit handed the workflow to the
#: coordinator of its process without writing the state (that coordinator's first
#: commit writes it). A rescan that finds no state under such a row writes the
#: initial state itself (the submit returned: the workflow is to run), where the row
#: of a submit cut short before its state is forgotten.
FIRST_STATE_HANDED = "first_state_handed"


def _outline(struct: type[msgspec.Struct], name: str, kind: Any) -> type[msgspec.Struct]:
    """A struct with the fields of ``struct`` (same names, types, defaults, strictness),
    except that field ``name`` is of type ``kind``."""
    fields: list[tuple[str, Any, Any]] = []
    for f in msgspec.structs.fields(struct):
        options: dict[str, Any] = {"default": f.default, "default_factory": f.default_factory}
        default: Any = msgspec.field(**options)
        fields.append((f.name, kind if f.name == name else f.type, default))
    config = struct.__struct_config__
    return msgspec.defstruct(
        f"{struct.__name__}Outline",
        fields,
        kw_only=True,
        forbid_unknown_fields=config.forbid_unknown_fields,
    )


@functools.cache
def _decoders() -> tuple[msgspec.json.Decoder[Any], msgspec.json.Decoder[TaskDef]]:
    """The outline's decoder and a task's: built on first use (resolving the
    definition's types costs a reader of stored documents — ``dagq status`` —
    a millisecond it does not need)."""
    definition_outline = _outline(WorkflowDef, "tasks", list[msgspec.Raw])
    submitted_outline = _outline(Submitted, "definition", definition_outline)
    return msgspec.json.Decoder(submitted_outline), msgspec.json.Decoder(TaskDef)


def decode_submitted(data: bytes) -> Submitted:
    """A definition document, decoded a task at a time.

    msgspec decodes a whole document in one call that holds the GIL: the 7 MB
    definition of a 100,000-task workflow took 150-220 ms, a stall of the event loop
    even when done in another thread. Decoded task by task, the thread lets the loop
    have the GIL in between. Accepts and refuses exactly what
    ``msgspec.json.decode(data, type=Submitted)`` does.
    """
    return decode_outlined(decode_outline(data))


def decode_outline(data: bytes) -> Any:
    """A definition document with its tasks left undecoded (each a ``msgspec.Raw``):
    its workflow id, fingerprint, tenant, labels, submitter and definition name can be
    read from it (``outline.definition.name``) for the cost of a scan of the bytes.
    Refuses what :func:`decode_submitted` refuses, but for the tasks themselves."""
    return _decoders()[0].decode(data)


def decode_outlined(outline: Any) -> Submitted:
    """The whole definition document from a :func:`decode_outline` outline."""
    definition_outline = outline.definition
    task = _decoders()[1]
    tasks = []
    for i, raw in enumerate(definition_outline.tasks):
        try:
            tasks.append(task.decode(raw))
        except msgspec.ValidationError as exc:
            raise msgspec.ValidationError(f"{exc}, in `$.definition.tasks[{i}]`") from None
    definition = WorkflowDef(**_fields_of(definition_outline, tasks=tasks))
    return Submitted(**_fields_of(outline, definition=definition))


def _fields_of(struct: msgspec.Struct, **replaced: Any) -> dict[str, Any]:
    return {name: getattr(struct, name) for name in struct.__struct_fields__} | replaced


async def load_submitted(store: Store, workflow_id: str) -> Submitted | None:
    """The definition document of a workflow, or None if there is no such workflow."""
    doc = await store.documents.get(keys.definition(workflow_id))
    return None if doc is None else decode_document(doc.data, workflow_id)


def decode_document(data: bytes, workflow_id: str) -> Submitted:
    """A definition document as stored (msgspec's errors for a damaged one)."""
    try:
        return msgspec.json.decode(data, type=Submitted)
    except RecursionError:  # stored before values were bounded: never crash a reader
        raise DamagedData(f"the definition of {workflow_id} is nested too deep to decode") from None


async def require_submitted(store: Store, workflow_id: str) -> Submitted:
    """Like :func:`load_submitted`, but an unknown id is an error naming it."""
    found = await load_submitted(store, check_workflow_id(workflow_id))
    if found is None:
        raise WorkflowNotFound(f"no workflow '{workflow_id}' in {store.url}")
    return found
