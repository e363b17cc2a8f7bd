"""Quarantine: a workflow the coordinator cannot advance is set aside, alone.

When the coordinator's work on one workflow fails for a reason retrying cannot fix
(a state document that does not decode, a definition that no longer compiles, a bug
met while applying an event), that workflow and only it is quarantined:

* a *record* is written beside its state, at ``quarantine/{id}`` — never into the state
  document, which may be the very thing that cannot be read — saying why, when and at
  which step;
* its index row shows the status ``quarantined`` with the reason (``list``, ``status``,
  ``doctor``);
* events that arrive for it are *kept* in the record, so the messages that carried
  them beside other workflows' events can be acknowledged (nothing innocent is
  redelivered or dead-lettered because of it);
* every other workflow goes on.

Once the cause is fixed, :func:`release` marks the record released and wakes the
coordinator, which loads the workflow afresh, applies the kept events first, and
deletes the record in the same write as the new state. If it fails again, it is
quarantined again with the new reason and every event still kept.

A record that cannot be decoded hides nothing else: :func:`listing` shows it as
damaged beside the others, and every error about it says what to do. Releasing it
deletes it (the events it kept cannot be read; they are lost either way), and the
coordinator loads the workflow as if it had never been quarantined — quarantining it
again, with a readable record, if it still cannot be advanced.
"""

from __future__ import annotations

import time

import msgspec

from dagq import keys
from dagq.errors import ConflictError, DamagedData, UsageError
from dagq.keys import check_workflow_id
from dagq.messages import Event, SubmitRequested, decode_events, encode_events
from dagq.payloads import cut
from dagq.state import QUARANTINED
from dagq.stores.base import IndexRow, OutgoingMessage, Store

#: How much of an exception's text a reason repeats.
REASON_CHARS = 500
_RELEASE_ATTEMPTS = 8


class Record(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The quarantine document of one workflow."""

    workflow_id: str
    reason: str
    #: The coordinator's step that failed: load, resolve, apply, stage, commit, settle,
    #: sweep, or advance (between them).
    step: str
    at: float
    #: Batches of events kept for the workflow (each as encoded on the queue), oldest
    #: first, and how many events they hold.
    events: list[bytes] = msgspec.field(default_factory=list)
    count: int = 0
    #: Set by :func:`release`: the coordinator may try the workflow again.
    released_at: float | None = None


class QuarantineInfo(msgspec.Struct, frozen=True, kw_only=True):
    """A quarantined workflow as ``dagq quarantine list`` shows it."""

    id: str
    reason: str
    step: str
    since: float
    kept_events: int
    released: bool
    #: The record itself cannot be decoded (``reason`` says what to do).
    damaged: bool = False


def reason_of(step: str, exc: BaseException) -> str:
    """One line saying what failed: the step, the exception type and its (cut) text."""
    text = " ".join(str(exc).split())
    what = f"{step} failed: {type(exc).__name__}"
    return cut(f"{what}: {text}" if text else what, REASON_CHARS)


def encode(record: Record) -> bytes:
    """The stored form of a record."""
    return msgspec.msgpack.encode(record)


def decode(data: bytes, workflow_id: str) -> Record:
    """A record from its stored form; DamagedData, saying what to do, if it is not one."""
    try:
        return msgspec.msgpack.decode(data, type=Record)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise DamagedData(damaged_reason(workflow_id, exc)) from exc


def damaged_reason(workflow_id: str, exc: BaseException) -> str:
    """One line: the record of ``workflow_id`` is damaged, and what to do about it."""
    return (
        f"the quarantine record of {workflow_id} is damaged ({cut(str(exc), 120)}); "
        f"dagq quarantine release {workflow_id} deletes it (the events it kept are lost) "
        f"and the coordinator loads the workflow again, or dagq purge {workflow_id} --force"
    )


async def read(store: Store, workflow_id: str) -> tuple[Record, str] | None:
    """The record of a workflow and its etag, or None if it is not quarantined."""
    doc = await store.documents.get(keys.quarantine(workflow_id))
    if doc is None:
        return None
    return decode(doc.data, workflow_id), doc.etag


def kept_events(record: Record) -> list[Event]:
    """The events kept for a workflow, oldest first."""
    return [event for batch in record.events for event in decode_events(batch)]


def keep(
    existing: Record | None,
    workflow_id: str,
    events: list[Event],
    *,
    step: str,
    reason: str,
    now: float,
) -> Record:
    """The record after quarantining (or keeping more events for) a workflow.

    A live record keeps its first reason and gains the events; a released one that
    failed again (or none) takes the new reason. Kept events are never dropped.
    """
    batches = list(existing.events) if existing is not None else []
    count = existing.count if existing is not None else 0
    if events:
        batches.append(encode_events(events))
        count += len(events)
    if existing is not None and existing.released_at is None:
        return Record(
            workflow_id=workflow_id,
            reason=existing.reason,
            step=existing.step,
            at=existing.at,
            events=batches,
            count=count,
        )
    return Record(
        workflow_id=workflow_id, reason=reason, step=step, at=now, events=batches, count=count
    )


def quarantined_row(
    row: IndexRow | None, workflow_id: str, reason: str, now: float, *, name: str = ""
) -> IndexRow:
    """The index row of a quarantined workflow (its last row, or a minimal one)."""
    if row is None:
        return IndexRow(
            id=workflow_id,
            name=name or "?",
            status=QUARANTINED,
            created_at=now,
            updated_at=now,
            data={"error": f"quarantined: {reason}"},
        )
    data = dict(row.data)
    data["error"] = f"quarantined: {reason}"
    return IndexRow(
        id=row.id,
        name=row.name,
        status=QUARANTINED,
        created_at=row.created_at,
        updated_at=now,
        tenant=row.tenant,
        data=data,
    )


def info(record: Record) -> QuarantineInfo:
    """The public view of a record."""
    return QuarantineInfo(
        id=record.workflow_id,
        reason=record.reason,
        step=record.step,
        since=record.at,
        kept_events=record.count,
        released=record.released_at is not None,
    )


async def listing(store: Store, *, limit: int = 1000) -> list[QuarantineInfo]:
    """Every quarantined workflow (from the index), with its record."""
    found: list[QuarantineInfo] = []
    cursor: str | None = None
    while len(found) < limit:
        page = await store.index.query(status=[QUARANTINED], limit=500, cursor=cursor)
        for row in page.rows:
            try:
                got = await read(store, row.id)
            except DamagedData as exc:  # shown as such; the others are still listed
                found.append(_damaged_info(row, exc))
                continue
            if got is not None:
                found.append(info(got[0]))
        cursor = page.cursor
        if cursor is None:
            break
    return found[:limit]


def _damaged_info(row: IndexRow, exc: DamagedData) -> QuarantineInfo:
    return QuarantineInfo(
        id=row.id,
        reason=str(exc),
        step="?",
        since=row.updated_at,
        kept_events=0,
        released=False,
        damaged=True,
    )


async def release(store: Store, workflow_id: str, *, now: float | None = None) -> QuarantineInfo:
    """Let the coordinator try a quarantined workflow again (after the cause is fixed).

    Marks the record released (deletes it if it is damaged: what it kept cannot be
    read), shows the workflow as running again in the index (the coordinator corrects
    the row once it has loaded the state) and wakes the coordinator. Its kept events
    are applied before anything newer. Safe to repeat. Returns the released record.
    """
    check_workflow_id(workflow_id)
    now = now or time.time()
    for _ in range(_RELEASE_ATTEMPTS):
        doc = await store.documents.get(keys.quarantine(workflow_id))
        if doc is None:
            raise UsageError(f"workflow '{workflow_id}' is not quarantined in {store.url}")
        try:
            record, etag = decode(doc.data, workflow_id), doc.etag
        except DamagedData as exc:
            try:  # the coordinator may be replacing it with a readable one meanwhile
                await store.documents.delete(keys.quarantine(workflow_id), if_match=doc.etag)
            except ConflictError:
                continue
            released = QuarantineInfo(
                id=workflow_id,
                reason=str(exc),
                step="?",
                since=now,
                kept_events=0,
                released=True,
                damaged=True,
            )
            break
        if record.released_at is None:
            record.released_at = now
            try:
                await store.documents.put(
                    keys.quarantine(workflow_id), encode(record), if_match=etag
                )
            except ConflictError:  # the coordinator kept another event meanwhile
                continue
        released = info(record)
        break
    else:
        raise ConflictError(f"the quarantine record of {workflow_id} kept changing; try again")
    row = await store.index.get(workflow_id)
    if row is not None and row.status == QUARANTINED:
        data = {k: v for k, v in row.data.items() if k != "error"}
        await store.index.upsert(
            IndexRow(
                id=row.id,
                name=row.name,
                status="running",
                created_at=row.created_at,
                updated_at=now,
                tenant=row.tenant,
                data=data,
            )
        )
    wake = encode_events([SubmitRequested(workflow_id=workflow_id)])
    await store.queues.send(keys.COMPLETIONS_QUEUE, [OutgoingMessage(wake)])
    return released
