"""Where things live in a store: document keys and queue names, in one place."""

from __future__ import annotations

import re

from dagq.errors import ValidationError
from dagq.payloads import NAME_ECHO_CHARS, echo

#: The coordinator's inbox: task events from workers and commands from clients.
COMPLETIONS_QUEUE = "_completions"
#: The lease that makes one coordinator the only writer of runtime state.
COORDINATOR_LEASE = "coordinator"
#: Where workers keep their records (:mod:`dagq.registry`).
WORKERS_PREFIX = "workers/"


def definition(workflow_id: str) -> str:
    """The immutable definition (and params) submitted for a workflow."""
    return f"definitions/{check_workflow_id(workflow_id)}"


def state(workflow_id: str) -> str:
    """The runtime-state document: the single source of truth of a run."""
    return f"states/{check_workflow_id(workflow_id)}"


def state_parts_prefix(workflow_id: str) -> str:
    """The base snapshot and deltas of a large workflow's state."""
    return f"state-parts/{check_workflow_id(workflow_id)}/"


def state_part(workflow_id: str, name: str) -> str:
    """One base snapshot or delta of a large workflow's state."""
    return f"{state_parts_prefix(workflow_id)}{name}"


def history_prefix(workflow_id: str) -> str:
    """All history chunks of a workflow, in order."""
    return f"history/{check_workflow_id(workflow_id)}/"


def history(workflow_id: str, seq: int) -> str:
    """One chunk of the append-only history, written once per state flush."""
    return f"{history_prefix(workflow_id)}{seq:010d}"


def output(workflow_id: str, task: int, attempt: int) -> str:
    """A task output too large to travel inline."""
    return f"outputs/{check_workflow_id(workflow_id)}/{task:07d}-{attempt}"


def inputs(workflow_id: str, task: int, attempt: int) -> str:
    """The upstream outputs of one attempt, when too many to fit in its message."""
    return f"inputs/{check_workflow_id(workflow_id)}/{task:07d}-{attempt}"


def log(workflow_id: str, task: int, attempt: int, *, item: int = -1, undo: bool = False) -> str:
    """The bounded stdout/stderr tail of one attempt (of a task, of one instance of a
    foreach task, or of a task's undo)."""
    return f"logs/{check_workflow_id(workflow_id)}/{task:07d}-{attempt}{_variant(item, undo)}"


def error(workflow_id: str, task: int, attempt: int, *, item: int = -1, undo: bool = False) -> str:
    """The whole error text of one attempt, when too long for events and states (those
    carry it cut). Beside the logs, so a purge removes it with them."""
    return f"{log(workflow_id, task, attempt, item=item, undo=undo)}-error"


def spec(workflow_id: str, task: int, *, undo: bool = False) -> str:
    """A task's spec (or its undo's), when too large for its task messages. Every
    attempt and instance shares it: params are fixed for the life of a workflow."""
    return f"inputs/{check_workflow_id(workflow_id)}/{task:07d}{_variant(-1, undo)}-spec"


def task_body(
    workflow_id: str, task: int, attempt: int, *, item: int = -1, undo: bool = False
) -> str:
    """A whole task message, when even without its spec it is too large to send."""
    return f"{inputs(workflow_id, task, attempt)}{_variant(item, undo)}-message"


def signal_data(workflow_id: str, name: str, digest: str) -> str:
    """Signal data too large for the signal event, named by its content's digest."""
    return f"inputs/{check_workflow_id(workflow_id)}/signal-{name}-{digest}"


def retry_tasks(workflow_id: str, digest: str) -> str:
    """The task names of a retry request too long for its event."""
    return f"inputs/{check_workflow_id(workflow_id)}/retry-{digest}"


def _variant(item: int, undo: bool) -> str:
    return (f"-i{item}" if item >= 0 else "") + ("-undo" if undo else "")


def foreach_items(workflow_id: str, task: int) -> str:
    """The list a foreach task fans out over, when too large to keep in its state."""
    return f"foreach/{check_workflow_id(workflow_id)}/{task:07d}-items"


def foreach_output(workflow_id: str, task: int, attempt: int) -> str:
    """The assembled outputs of a foreach task's instances, when too large to inline."""
    return f"outputs/{check_workflow_id(workflow_id)}/{task:07d}-{attempt}-foreach"


def control(workflow_id: str) -> str:
    """Present while workers must stop a workflow's tasks (cancellation)."""
    return f"control/{check_workflow_id(workflow_id)}"


def attempt_name(task_name: str, *, item: int = -1, undo: bool = False) -> str:
    """What an attempt runs: a task, one instance of a foreach task (``name[3]``) or a
    task's compensation (``name#undo``).

    '#', '[' and ']' never appear in a task name (``validation.NAME_PATTERN``), so two
    different things never share a name: a task called ``charge/undo`` is not the undo
    of ``charge``, nor ``x[0]`` the first instance of ``x``.
    """
    name = task_name if item < 0 else f"{task_name}[{item}]"
    return f"{name}#undo" if undo else name


_ATTEMPT_NAME = re.compile(r"(?P<task>[^\[\]#]+)(?:\[(?P<item>[0-9]{1,9})\])?(?P<undo>#undo)?")


def split_attempt_name(name: str) -> tuple[str, int, bool]:
    """The inverse of :func:`attempt_name`: ``square[2]`` is ``("square", 2, False)``,
    ``charge#undo`` is ``("charge", -1, True)``; any other text is a plain task name."""
    found = _ATTEMPT_NAME.fullmatch(name)
    if found is None:
        return name, -1, False
    item = found["item"]
    return found["task"], -1 if item is None else int(item), found["undo"] is not None


def of_task(attempt_name: str, task_name: str) -> bool:
    """Is ``attempt_name`` the task's own, one of its instances' or its undo's?"""
    return split_attempt_name(attempt_name)[0] == task_name


def idempotency_key(workflow_id: str, task_name: str, *, item: int = -1, undo: bool = False) -> str:
    """The key a task's side effects can be deduplicated by: the same for every attempt."""
    return f"{workflow_id}/{attempt_name(task_name, item=item, undo=undo)}"


def worker(worker_id: str) -> str:
    """A worker's record: who it is, what it serves and runs, when it was last seen."""
    return f"{WORKERS_PREFIX}{worker_id}"


def live_log_prefix(
    workflow_id: str, task: int, attempt: int, *, item: int = -1, undo: bool = False
) -> str:
    """The chunks of an attempt's output sent while it runs (``dagq logs --follow``)."""
    return f"{log(workflow_id, task, attempt, item=item, undo=undo)}-live/"


def quarantine(workflow_id: str) -> str:
    """Why the coordinator set a workflow aside, and the events it kept for it."""
    return f"quarantine/{check_workflow_id(workflow_id)}"


def message_id(workflow_id: str, task_name: str, attempt: int) -> str:
    """The deterministic id of an attempt's task message (docs/architecture.md, invariant 7).

    ``task_name`` is an :func:`attempt_name`. The id reads back unambiguously: the
    workflow id has no '/', and the attempt is the part after the last one.
    """
    return f"{workflow_id}/{task_name}/{attempt}"


#: Access tokens of ``dagq server`` (:mod:`dagq.tokens`): reserved, never a workflow's.
TOKENS_PREFIX = "access/tokens/"


def token(token_id: str) -> str:
    """The record of one access token (its hash, never the secret)."""
    return f"{TOKENS_PREFIX}{token_id}"


def check_workflow_id(workflow_id: str) -> str:
    """Refuse ids that could escape storage paths or confuse listings.

    Here, not in :mod:`dagq.validation`: every store makes keys, and validation imports
    the expression language, which ``dagq list`` and ``dagq status`` do not need."""
    if not isinstance(workflow_id, str) or not WORKFLOW_ID_PATTERN.match(workflow_id):
        raise ValidationError(
            f"workflow id {_quoted(workflow_id)} is not valid: use 1-128 letters, digits, "
            "'-', '_' or '.', starting with a letter or digit"
        )
    return workflow_id


def _quoted(value: object) -> str:
    return repr(echo(value)) if isinstance(value, str) else repr(value)[:NAME_ECHO_CHARS]


WORKFLOW_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}\Z")
