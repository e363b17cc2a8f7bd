"""Submitting a workflow: the client's side of the loop, safe to repeat after a crash.

Order of writes, each idempotent: definition (create-only: a new id costs no read) →
index row (``pending``, so a sweep can always find the workflow before it starts) →
runtime state (create-only; the commit point) → a ``submit`` event to wake the
coordinator. Where a batch commits all or nothing (SQLite), a new workflow's four
writes are one transaction instead. Where the coordinator runs in this process and
takes hand-overs (Azure, a ``Client`` with an in-process runner), a new small
workflow is handed to it after its row, flagged ``FIRST_STATE_HANDED`` (then the
commit point): its first commit writes the state, the first dispatches applied (one
write, not two), and a rescan writes the initial state of such a row that has none
(the process died first). Submitting the same id and
definition again completes whatever a crashed submit left undone and returns the
existing workflow; the same id with a different definition is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import getpass
import hashlib
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import msgspec

from dagq import keys, payloads, state
from dagq.compiled import plan_of
from dagq.definition import WorkflowDef
from dagq.errors import (
    ConflictError,
    PayloadTooLarge,
    UsageError,
    ValidationError,
    WorkflowExists,
)
from dagq.messages import (
    CancelRequested,
    RetryRequested,
    SignalSent,
    SubmitRequested,
    encode_events,
)
from dagq.observability import spans
from dagq.payloads import echo
from dagq.persistence import create_state, is_large, stage_created_state
from dagq.plan import Plan, resolve_params
from dagq.stores.base import IndexRow, OutgoingMessage, Store
from dagq.submitted import (
    FIRST_STATE_HANDED,
    Created,
    Submitted,
    load_submitted,
    require_submitted,
)
from dagq.validation import check_values, check_workflow_id

log = logging.getLogger("dagq.submission")
#: Wake-up messages posted because a hand-over was declined, until sent.
_POSTING: set[asyncio.Task[None]] = set()


@dataclass(frozen=True, slots=True)
class SubmitResult:
    """The id of the workflow, and whether this call created it."""

    workflow_id: str
    created: bool
    plan: Plan
    fingerprint: str


def fingerprint(definition: WorkflowDef, params: Mapping[str, Any]) -> str:
    """A hash of the definition and params, to tell a repeat from a different workflow."""
    canonical = msgspec.json.encode({"definition": definition, "params": params}, order="sorted")
    return hashlib.sha256(canonical).hexdigest()[:32]


def new_workflow_id(name: str) -> str:
    """A readable, unique id: ``<name>-<UTC time>-<random>``."""
    stem = "".join(c if c.isalnum() or c in "-_." else "-" for c in name)[:60].strip("-.") or "wf"
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    return f"{stem}-{stamp}-{os.urandom(3).hex()}"


async def submit(
    store: Store,
    definition: WorkflowDef,
    *,
    params: Mapping[str, Any] | None = None,
    workflow_id: str | None = None,
    tenant: str = "",
    labels: Mapping[str, str] | None = None,
    actor: str = "",
    clock: Any = time.time,
    compiled: Callable[[str, Plan], None] | None = None,
) -> SubmitResult:
    """Store a workflow and wake the coordinator; repeat-safe for the same id (the
    first submission's labels stay). ``actor`` (who submits) is recorded with its
    ``submitted`` event. ``compiled(fingerprint, plan)`` is called with the plan before
    anything is stored: a coordinator in this process is given it (``remember_plan``)
    before it can load the workflow, and never compiles a second copy.

    A new workflow's trace begins here: its ``submit`` span (:mod:`dagq.observability`).
    """
    labels = check_labels(labels or {})
    began = clock()
    resolved = resolve_params(definition, params or {})
    check_bounds(definition, resolved)
    if workflow_id is None:  # an empty id is refused like any other invalid one
        workflow_id = new_workflow_id(definition.name)
    workflow_id = check_workflow_id(workflow_id)
    now = clock()
    submitted = Submitted(
        workflow_id=workflow_id,
        definition=definition,
        params=resolved,
        created_at=now,
        fingerprint=fingerprint(definition, resolved),
        tenant=tenant,
        labels=labels,
        submitted_by=payloads.cut(actor, 200),
    )
    document = msgspec.json.encode(submitted)
    if len(document) > payloads.MAX_DEFINITION_BYTES:
        raise PayloadTooLarge(
            f"the definition of '{echo(definition.name)}' with its params is {len(document)} "
            f"bytes as JSON, over the limit of {payloads.MAX_DEFINITION_BYTES} bytes"
        )
    # Bounded first: it renders every task. Kept for the coordinator and the readers.
    plan = plan_of(definition, resolved, submitted.fingerprint)
    if compiled is not None:
        compiled(submitted.fingerprint, plan)
    initial = state.RunState(workflow_id, len(plan.tasks), submitted.created_at)
    if await _submitted_at_once(store, submitted, document, plan, initial):
        spans.submitted(workflow_id, definition.name, began, clock())
        return SubmitResult(workflow_id, True, plan, submitted.fingerprint)
    # Else the definition first, create-only: a new id (the usual case) costs no read.
    # Then the index row, then the state: a submit cut short anywhere completes when
    # repeated.
    try:
        await store.documents.put(keys.definition(workflow_id), document, if_none_match=True)
        created = True
    except ConflictError:  # submitted before (or by a concurrent submit of the same id)
        existing = await load_submitted(store, workflow_id)
        if existing is None:  # purged meanwhile: as new
            return await submit(
                store,
                definition,
                params=params,
                workflow_id=workflow_id,
                tenant=tenant,
                labels=labels,
                actor=actor,
                clock=clock,
                compiled=compiled,
            )
        if existing.fingerprint != submitted.fingerprint:
            raise WorkflowExists(
                f"workflow '{workflow_id}' exists already with a different definition or "
                "params; choose another id"
            ) from None
        submitted, created = existing, False
        initial = state.RunState(workflow_id, len(plan.tasks), submitted.created_at)
    # A new small workflow whose coordinator runs in this process: that coordinator's
    # first commit writes its state (with the first dispatches), not this submit too.
    handing = created and store.handoff is not None and not is_large(initial)
    if created:  # no row: a purge deletes it before the definition
        await _create_row(store, _pending_row(submitted, plan, handing=handing))
    elif await store.index.get(workflow_id) is None:
        await store.index.upsert(_pending_row(submitted, plan))
    unwritten = Created(submitted=submitted, plan=plan, state=initial, etag="")
    if handing and _handed_over(store, workflow_id, unwritten, unwritten=True):
        spans.submitted(workflow_id, definition.name, began, clock())
        return SubmitResult(workflow_id, True, plan, submitted.fingerprint)
    etag = ""
    with contextlib.suppress(ConflictError):  # stored by an earlier (perhaps crashed) submit
        etag = await create_state(store, initial)
    fresh = created and etag and not is_large(initial)  # its header is all of it
    stored = Created(submitted=submitted, plan=plan, state=initial, etag=etag) if fresh else None
    if not _handed_over(store, workflow_id, stored):
        await store.queues.send(keys.COMPLETIONS_QUEUE, [_submit_event(workflow_id)])
    if created:
        spans.submitted(workflow_id, definition.name, began, clock())
    return SubmitResult(workflow_id, created, plan, submitted.fingerprint)


async def _submitted_at_once(
    store: Store, submitted: Submitted, document: bytes, plan: Plan, initial: state.RunState
) -> bool:
    """A new workflow's index row, definition, state and event in one batch, where the
    store commits a batch all or nothing (sqlite): one transaction instead of four, and
    the order of the writes cannot matter. Where a coordinator of this process takes
    hand-overs, the event is handed to it after the commit instead (no message to
    send, receive and delete), with the workflow as stored: it starts it reading
    nothing back, and the index row stays ``pending`` until the run ends or
    ``index_interval_s`` has passed (as on every other store, :func:`_handed_over`).
    False when it cannot be done so (another store, a large state) or a concurrent
    submit of the same id got there first (a conflict: nothing was written); the
    writes one by one then sort it out."""
    if not getattr(store.committer, "atomic", False):
        return False
    workflow_id = submitted.workflow_id
    batch = store.batch()
    batch.upsert(_pending_row(submitted, plan))
    batch.put(keys.definition(workflow_id), document, if_none_match=True)
    if not stage_created_state(batch, initial):
        return False
    # A coordinator in this process is handed the wake-up after the commit, with the
    # workflow as stored (nothing to read back); else the event goes in the batch.
    handing = store.handoff is not None
    if not handing:
        batch.send(keys.COMPLETIONS_QUEUE, [_submit_event(workflow_id)])
    try:
        etags = await batch.commit()
    except ConflictError:
        return False
    stored = Created(submitted=submitted, plan=plan, state=initial, etag=etags[-1])
    if handing and not _handed_over(store, workflow_id, stored):  # it stopped meanwhile
        await store.queues.send(keys.COMPLETIONS_QUEUE, [_submit_event(workflow_id)])
    return True


async def _create_row(store: Store, row: IndexRow) -> None:
    """The row of a workflow that has none: written without looking where it is, on
    a backend that would otherwise (Azure's ``create``); else upserted."""
    create = getattr(store.index, "create", None)
    await (store.index.upsert if create is None else create)(row)


def _handed_over(
    store: Store, workflow_id: str, stored: Created | None = None, *, unwritten: bool = False
) -> bool:
    """Give a stored workflow's wake-up to the coordinator of this process, if one
    takes hand-overs (its next commit starts it), instead of a message on the
    completion queue (a send, a receive and a delete). Declined later (that commit
    failed, the coordinator stopped), the message is posted then; lost with the
    process, a coordinator's rescan of the index finds the workflow pending.

    ``stored``: the new workflow as just written, given to that coordinator with the
    wake-up, so that it starts the workflow without reading back its definition,
    quarantine record (a new one has none: a purge deletes it before the definition)
    and state. Its writes are still conditional on that state's etag.

    ``unwritten``: the state in ``stored`` is not written yet; the coordinator's first
    commit writes it, or, declined, the state is written here before the message."""
    handoff = store.handoff
    if handoff is None:
        return False
    if stored is not None and not handoff.preload(stored) and unwritten:
        return False
    taken = handoff.deliver([SubmitRequested(workflow_id=workflow_id)], {})
    if taken is None:
        return False
    first = stored.state if stored is not None and unwritten else None
    # The coordinator works on that very object: a step that failed may have changed
    # it (dispatched its first tasks, named documents it did not write). Declined, the
    # state written here is the initial one, afresh.
    state = (
        None if first is None else type(first)(first.workflow_id, first.n_tasks, first.created_at)
    )

    def settled(future: asyncio.Future[Any]) -> None:
        if future.cancelled() or future.exception() is not None or future.result() is None:
            task = asyncio.ensure_future(_post(store, workflow_id, state))
            _POSTING.add(task)
            task.add_done_callback(_POSTING.discard)

    taken.add_done_callback(settled)
    return True


async def _post(store: Store, workflow_id: str, unwritten: state.RunState | None) -> None:
    try:
        if unwritten is not None:  # the declined commit may have written it, or not
            with contextlib.suppress(ConflictError):
                await create_state(store, unwritten)
        await store.queues.send(keys.COMPLETIONS_QUEUE, [_submit_event(workflow_id)])
    except Exception as exc:  # the rescan finds it pending
        log.warning("the wake-up of %s was not posted (%s): a rescan starts it", workflow_id, exc)


def _submit_event(workflow_id: str) -> OutgoingMessage:
    return OutgoingMessage(encode_events([SubmitRequested(workflow_id=workflow_id)]))


def local_actor(via: str) -> str:
    """Who acts from this machine, for the audit trail: ``VIA:USER`` (the OS user)."""
    return f"{via}:{_os_user()}"


@functools.cache
def _os_user() -> str:
    """The OS user of this process, looked up once (the password database each time
    cost more than the rest of a small workflow's submit)."""
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no name for this uid (a container's user)
        return f"uid{os.getuid()}"


def check_bounds(definition: WorkflowDef, params: Mapping[str, Any]) -> None:
    """Refuse a definition or params over their hard bounds (:mod:`dagq.payloads`),
    naming the value and the bound: before anything renders or stores them."""
    check_values(definition)
    total = 0
    for name, value in params.items():
        total += len(payloads.encode_json(value, f"param '{echo(name)}'"))
    if total > payloads.MAX_PARAMS_BYTES:
        raise PayloadTooLarge(
            f"the params of '{echo(definition.name)}' total {total} bytes as JSON, over the "
            f"limit of {payloads.MAX_PARAMS_BYTES} bytes; pass large data in a file instead"
        )


def _pending_row(submitted: Submitted, plan: Plan, *, handing: bool = False) -> IndexRow:
    return IndexRow(
        id=submitted.workflow_id,
        name=submitted.definition.name,
        status="pending",
        created_at=submitted.created_at,
        updated_at=submitted.created_at,
        tenant=submitted.tenant,
        data={
            "total": len(plan.tasks),
            "counts": {"pending": len(plan.tasks)},
            **({"labels": submitted.labels} if submitted.labels else {}),
            **({FIRST_STATE_HANDED: True} if handing else {}),
        },
    )


#: Bounds of a run's labels.
MAX_LABELS = 32
MAX_LABEL_KEY = 63
MAX_LABEL_VALUE = 200


def check_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """The labels, or ValidationError naming the one at fault."""
    if len(labels) > MAX_LABELS:
        raise ValidationError(f"a run has at most {MAX_LABELS} labels, not {len(labels)}")
    for key, value in labels.items():
        if not isinstance(key, str) or not 0 < len(key) <= MAX_LABEL_KEY or "=" in key:
            raise ValidationError(
                f"label key {str(key)[:80]!r} must be 1-{MAX_LABEL_KEY} characters, without '='"
            )
        if not isinstance(value, str) or len(value) > MAX_LABEL_VALUE:
            raise ValidationError(
                f"label {key!r}: its value must be text of at most {MAX_LABEL_VALUE} characters"
            )
    return dict(labels)


def new_request_id() -> str:
    """A fresh id for a cancel, retry or signal request (random, 16 hex digits)."""
    return os.urandom(8).hex()


async def request_cancel(
    store: Store,
    workflow_id: str,
    reason: str = "cancelled by request",
    *,
    request_id: str | None = None,
    actor: str = "",
) -> None:
    """Ask the coordinator to cancel a workflow (durably queued; applied once);
    ``actor``, who asks, is recorded in its history.

    Sending again with the same ``request_id`` (after a timeout, say) acts once, like
    every copy of the request the queue delivers twice; without one, a fresh id.
    """
    await require_submitted(store, workflow_id)
    request_id = request_id or new_request_id()
    event = CancelRequested(
        workflow_id=workflow_id,
        reason=payloads.cut(reason),
        request_id=request_id,
        actor=payloads.cut(actor, 200),
    )
    await store.queues.send(keys.COMPLETIONS_QUEUE, [OutgoingMessage(encode_events([event]))])


async def request_signal(
    store: Store,
    workflow_id: str,
    name: str,
    data: Any = None,
    *,
    request_id: str | None = None,
    actor: str = "",
) -> None:
    """Send a signal to a workflow; kept until a task waits for it (request ids: see
    :func:`request_cancel`).

    Refused when no task of the workflow waits for that signal, or when the data is
    over its bounds (see :mod:`dagq.payloads`). Each wait takes one signal, in the
    order they were sent.
    """
    encoded = check_signal_data(name, data)
    submitted = await require_submitted(store, workflow_id)
    signals = {t.wait_for.signal for t in submitted.definition.tasks if t.wait_for}
    if name not in signals:
        listed = ", ".join(sorted(signals)) if signals else "none: no task has wait_for"
        raise UsageError(
            f"no task of workflow '{workflow_id}' waits for signal '{echo(name)}' "
            f"(it waits for: {listed})"
        )
    request_id = request_id or new_request_id()
    event = await _signal_event(store, workflow_id, name, data, encoded, request_id=request_id)
    event = msgspec.structs.replace(event, actor=payloads.cut(actor, 200))
    await store.queues.send(keys.COMPLETIONS_QUEUE, [OutgoingMessage(encode_events([event]))])


def check_signal_data(name: str, data: Any) -> bytes:
    """Signal data as JSON, within the hard bounds (PayloadTooLarge naming it if not)."""
    return payloads.encode_json(
        data, f"the data of signal '{echo(name)}'", max_bytes=payloads.MAX_SIGNAL_BYTES
    )


async def _signal_event(
    store: Store, workflow_id: str, name: str, data: Any, encoded: bytes, *, request_id: str
) -> SignalSent:
    """The signal event; data above the inline limit is stored first and referenced."""
    if len(encoded) <= payloads.REQUEST_INLINE_BYTES:
        return SignalSent(workflow_id=workflow_id, name=name, data=data, request_id=request_id)
    key = keys.signal_data(workflow_id, name, hashlib.sha256(encoded).hexdigest()[:16])
    await store.documents.put(key, encoded)
    return SignalSent(workflow_id=workflow_id, name=name, data_ref=key, request_id=request_id)


async def request_retry(
    store: Store,
    workflow_id: str,
    tasks: list[str] | None = None,
    *,
    request_id: str | None = None,
    actor: str = "",
) -> None:
    """Ask the coordinator to re-run failed, upstream_failed and cancelled tasks
    (request ids and ``actor``: see :func:`request_cancel`)."""
    submitted = await require_submitted(store, workflow_id)
    names = {t.name for t in submitted.definition.tasks}
    unknown = [t for t in tasks or [] if t not in names]
    if unknown:
        shown = ", ".join(repr(echo(t)) for t in unknown[:10])
        raise UsageError(f"workflow '{workflow_id}' has no task named {shown}")
    request_id = request_id or new_request_id()
    wanted = list(dict.fromkeys(tasks or []))
    encoded = msgspec.json.encode(wanted)
    if len(encoded) <= payloads.REQUEST_INLINE_BYTES:
        event = RetryRequested(workflow_id=workflow_id, tasks=wanted, request_id=request_id)
    else:  # thousands of names: they travel as a document
        key = keys.retry_tasks(workflow_id, hashlib.sha256(encoded).hexdigest()[:16])
        await store.documents.put(key, encoded)
        event = RetryRequested(workflow_id=workflow_id, tasks_ref=key, request_id=request_id)
    event = msgspec.structs.replace(event, actor=payloads.cut(actor, 200))
    await store.queues.send(keys.COMPLETIONS_QUEUE, [OutgoingMessage(encode_events([event]))])
