"""Keeping a store tidy: purging finished workflows, and checking its health.

``purge`` removes everything a workflow left (index row, state, definition, outputs,
inputs, logs, history, markers). ``diagnose`` looks for what keeps workflows from
finishing and says how to fix each problem.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from dagq import keys, registry
from dagq.errors import DagqError, UsageError
from dagq.keys import check_workflow_id
from dagq.leasing import holder_is_dead_here
from dagq.state import QUARANTINED, WORKFLOW_ACTIVE, WORKFLOW_TERMINAL
from dagq.stores.base import DeadLetter, Store
from dagq.submitted import Submitted

#: How long a workflow may sit un-activated before doctor calls it stuck.
PENDING_STUCK_S = 120.0
#: How long an unfinished workflow may go without a state change before doctor asks.
STALE_S = 3600.0
#: How old the oldest message of a task queue may be before doctor suspects no worker.
QUEUE_WAIT_S = 300.0
#: How many dead letters doctor reads (it counts them per queue).
DEAD_LETTERS_SHOWN = 1000


#: The control document a forced purge left before markers named their run: every
#: attempt of every epoch must stop (workers apply it to messages that name no run).
STOP_EVERYTHING = msgspec.json.encode({"stop_through": 2**62, "tasks": {}})


def stop_everything(run: float) -> bytes:
    """The control document a forced purge leaves: every attempt of every epoch of the
    run submitted at ``run`` must stop (not those of a namesake submitted after it)."""
    return msgspec.json.encode({"stop_through": 2**62, "tasks": {}, "run": run})


async def purge(store: Store, workflow_id: str, *, force: bool = False) -> int:
    """Delete everything of one workflow; refuses an unfinished one unless ``force``.

    Returns how many documents were deleted. Safe to repeat after an interruption.
    Purging an unfinished workflow leaves one small control document that tells
    workers to stop whatever of it still runs; the coordinator forgets the workflow
    when it next meets it, and a new workflow with the same id starts clean.
    """
    check_workflow_id(workflow_id)
    row = await store.index.get(workflow_id)
    docs = store.documents
    state_doc = await docs.get(keys.state(workflow_id))
    if row is None and state_doc is None and await docs.get(keys.definition(workflow_id)) is None:
        raise UsageError(f"no workflow '{workflow_id}' in {store.url}")
    status = row.status if row is not None else None
    unfinished = status in WORKFLOW_ACTIVE or status == QUARANTINED
    if unfinished and not force:
        raise UsageError(
            f"workflow '{workflow_id}' is still {status}; cancel it first, or pass --force"
        )
    if row is not None and unfinished:  # before anything goes: its tasks must learn to stop
        await docs.put(keys.control(workflow_id), stop_everything(row.created_at))
    await store.index.delete(workflow_id)
    deleted = 0
    # The quarantine record before the definition: a submit that creates the definition
    # anew knows the workflow has no record (its coordinator then reads none).
    doomed = [keys.state(workflow_id), keys.quarantine(workflow_id), keys.definition(workflow_id)]
    if not unfinished:
        doomed.append(keys.control(workflow_id))
    for key in doomed:
        deleted += await docs.delete(key)
    for prefix in _prefixes(workflow_id):
        deleted += await _delete_prefix(store, prefix)
    return deleted


async def purge_older_than(store: Store, days: float, *, now: float | None = None) -> list[str]:
    """Purge every finished workflow that ended more than ``days`` ago; their ids."""
    cutoff = (now or time.time()) - days * 86400
    purged: list[str] = []
    cursor: str | None = None
    while True:
        page = await store.index.query(status=sorted(WORKFLOW_TERMINAL), limit=500, cursor=cursor)
        for row in page.rows:
            if row.updated_at < cutoff:
                await purge(store, row.id)
                purged.append(row.id)
        cursor = page.cursor
        if cursor is None:
            return purged


def _prefixes(workflow_id: str) -> Sequence[str]:
    return (
        keys.history_prefix(workflow_id),
        keys.state_parts_prefix(workflow_id),
        f"outputs/{workflow_id}/",
        f"inputs/{workflow_id}/",
        f"logs/{workflow_id}/",
    )


async def _delete_prefix(store: Store, prefix: str) -> int:
    deleted = 0
    while names := await store.documents.list(prefix, limit=1000):
        for name in names:
            deleted += await store.documents.delete(name)
    return deleted


# --- doctor ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing doctor checked: ``ok``, ``warn`` or ``fail``, what it saw, what to do."""

    level: str
    check: str
    detail: str
    fix: str = ""


async def diagnose(store: Store, *, now: float | None = None) -> list[Finding]:
    """Check the store, the coordinator, the queues and the workflows."""
    now = now or time.time()
    findings: list[Finding] = []
    try:
        await store.documents.get("doctor/probe")
    except DagqError as exc:
        return [
            Finding(
                "fail",
                "store",
                f"{store.url} cannot be reached: {exc}",
                "check the --store URL / DAGQ_STORE and the credentials",
            )
        ]
    findings.append(Finding("ok", "store", f"{store.url} is reachable"))
    active = await _active_rows(store)
    findings.append(await _coordinator(store, now, needed=bool(active)))
    workers = await registry.live_workers(store.documents, now=now)
    findings += await _queues(store, active, now, workers)
    findings += _workflows(active, now)
    findings += await _compensation_failures(store)
    findings += await _quarantined(store)
    return findings


async def _quarantined(store: Store) -> list[Finding]:
    """Runs the coordinator set aside: nothing advances them until a person acts."""
    page = await store.index.query(status=[QUARANTINED], limit=100)
    return [
        Finding(
            "fail",
            f"workflow {row.id}",
            str(row.data.get("error") or "quarantined"),
            f"see it: dagq status {row.id}; once the cause is fixed: dagq quarantine release "
            f"{row.id} (its kept events are applied then); or drop it: "
            f"dagq purge --force {row.id}",
        )
        for row in page.rows
    ]


async def _compensation_failures(store: Store) -> list[Finding]:
    """Runs whose undo gave up: side effects may be half undone — a person must look."""
    page = await store.index.query(status=["compensation_failed"], limit=100)
    return [
        Finding(
            "fail",
            f"workflow {row.id}",
            "compensation_failed: an undo exhausted its retries",
            f"see which: dagq tasks {row.id}; fix the side effects by hand, then purge it",
        )
        for row in page.rows
    ]


async def _coordinator(store: Store, now: float, *, needed: bool) -> Finding:
    lease = await store.leases.get(keys.COORDINATOR_LEASE)
    # A holder killed on this host cannot release its lease; it is as good as none.
    dead = lease is not None and holder_is_dead_here(lease.owner)
    if (lease is None or dead) and not needed:
        return Finding("ok", "coordinator", "none running (no unfinished workflow needs one)")
    if lease is None or dead:
        detail = "no coordinator holds the lease, so nothing advances"
        if lease is not None:
            detail = (
                f"the lease is held by {lease.owner}, a process that is no longer running, "
                "so nothing advances"
            )
        return Finding(
            "fail",
            "coordinator",
            detail,
            "start one: dagq coordinator (dagq run starts its own)",
        )
    return Finding(
        "ok",
        "coordinator",
        f"held by {lease.owner} for {now - lease.acquired_at:.0f}s, "
        f"renewed until {lease.expires_at - now:.0f}s from now",
    )


async def _active_rows(store: Store) -> list[tuple[str, str, float, float, list[str]]]:
    """(id, status, created_at, updated_at, queues) of every unfinished workflow."""
    rows = []
    cursor: str | None = None
    while True:
        page = await store.index.query(status=sorted(WORKFLOW_ACTIVE), limit=500, cursor=cursor)
        for row in page.rows:
            doc = await store.documents.get(keys.definition(row.id))
            queues: list[str] = []
            if doc is not None:
                try:
                    submitted = msgspec.json.decode(doc.data, type=Submitted)
                except msgspec.MsgspecError:  # damaged: the coordinator quarantines it
                    rows.append((row.id, row.status, row.created_at, row.updated_at, queues))
                    continue
                definition = submitted.definition
                defaults = definition.defaults.queue if definition.defaults else None
                queues = sorted(
                    {t.queue or defaults or definition.default_queue for t in definition.tasks}
                )
            rows.append((row.id, row.status, row.created_at, row.updated_at, queues))
        cursor = page.cursor
        if cursor is None:
            return rows


async def _queues(
    store: Store,
    active: list[tuple[str, str, float, float, list[str]]],
    now: float,
    workers: list[registry.WorkerRecord],
) -> list[Finding]:
    buried = await _buried(store)
    names = _queue_names(active, buried)
    findings = []
    for name in names:
        depth = await store.queues.depth(name)
        dead = buried.get(name, [])
        label = "completion queue" if name == keys.COMPLETIONS_QUEUE else f"queue '{name}'"
        detail = (
            f"{depth.visible} waiting, {depth.invisible} in flight, "
            f"oldest {depth.oldest_age_s:.0f}s"
        )
        if dead:
            findings.append(
                Finding(
                    "warn",
                    label,
                    f"{len(dead)} dead-lettered message(s), the last because "
                    f"{dead[-1].reason!r}; {detail}",
                    f"see them: dagq dlq list --queue {name}; after fixing the cause, "
                    "dagq dlq replay KEY (or --all), or dagq dlq purge",
                )
            )
        elif name != keys.COMPLETIONS_QUEUE and (depth.visible or depth.invisible):
            findings.append(
                _served(
                    store,
                    name,
                    detail,
                    oldest_s=depth.oldest_age_s,
                    active=active,
                    workers=workers,
                )
            )
        elif depth.visible and depth.oldest_age_s > QUEUE_WAIT_S:
            fix = (
                "is a coordinator running? dagq coordinator"
                if name == keys.COMPLETIONS_QUEUE
                else f"is a worker serving it? dagq worker -q {name}"
            )
            findings.append(Finding("warn", label, detail, fix))
        else:
            findings.append(Finding("ok", label, detail))
    return findings


async def _buried(store: Store) -> dict[str, list[DeadLetter]]:
    """The dead letters (the first DEAD_LETTERS_SHOWN), by queue."""
    buried: dict[str, list[DeadLetter]] = {}
    for letter in await store.queues.dead_letters(None, limit=DEAD_LETTERS_SHOWN):
        buried.setdefault(letter.queue, []).append(letter)
    return buried


def _queue_names(
    active: list[tuple[str, str, float, float, list[str]]],
    buried: dict[str, list[DeadLetter]],
    workers: Sequence[registry.WorkerRecord] = (),
) -> list[str]:
    """The queues worth a look: those of unfinished workflows, the completion queue,
    those with dead letters, and those a live worker serves."""
    return sorted(
        {q for *_, queues in active for q in queues}
        | {keys.COMPLETIONS_QUEUE}
        | set(buried)
        | {q for w in workers for q in w.queues}
    )


@dataclass(frozen=True, slots=True)
class QueueOverview:
    """One queue as an operator sees it: how many wait, the oldest's age, the live
    workers serving it, its dead letters (counted up to DEAD_LETTERS_SHOWN)."""

    queue: str
    depth: int
    in_flight: int
    oldest_age_s: float
    workers: int
    dead_letters: int


async def queue_overview(store: Store, *, now: float | None = None) -> list[QueueOverview]:
    """The queues doctor looks at (and those live workers serve), each with its depth."""
    now = now or time.time()
    active = await _active_rows(store)
    workers = await registry.live_workers(store.documents, now=now)
    buried = await _buried(store)
    found = []
    for name in _queue_names(active, buried, workers):
        depth = await store.queues.depth(name)
        found.append(
            QueueOverview(
                queue=name,
                depth=depth.visible,
                in_flight=depth.invisible,
                oldest_age_s=round(depth.oldest_age_s, 3),
                workers=sum(w.serves(name) for w in workers),
                dead_letters=len(buried.get(name, ())),
            )
        )
    return found


def _served(
    store: Store,
    queue: str,
    detail: str,
    *,
    oldest_s: float,
    active: list[tuple[str, str, float, float, list[str]]],
    workers: list[registry.WorkerRecord],
) -> Finding:
    """A queue with tasks in it: is a live worker serving it (for its workflows)?"""
    label = f"queue '{queue}'"
    users: list[str | None] = [w for w, *_, queues in active if queue in queues] or [None]
    serving = [w for w in workers if any(w.serves(queue, u) for u in users)]
    if not serving:
        return Finding(
            "warn",
            label,
            f"no live worker serves it; {detail}",
            f"start one: dagq worker --queue {queue} --store {store.url}",
        )
    slots = sum(w.concurrency for w in serving)
    busy = sum(w.running for w in serving)
    detail += f"; {len(serving)} worker(s) serve it, {busy}/{slots} slot(s) busy"
    if oldest_s > QUEUE_WAIT_S:
        return Finding(
            "warn",
            label,
            detail,
            f"its workers are busy; more would help: dagq worker --queue {queue} "
            f"--store {store.url}",
        )
    return Finding("ok", label, detail)


def _workflows(active: list[tuple[str, str, float, float, list[str]]], now: float) -> list[Finding]:
    findings = []
    for workflow_id, status, created, updated, _ in active:
        if status == "pending" and now - created > PENDING_STUCK_S:
            findings.append(
                Finding(
                    "warn",
                    f"workflow {workflow_id}",
                    f"submitted {now - created:.0f}s ago and not started",
                    "is a coordinator running? dagq coordinator",
                )
            )
        elif now - updated > STALE_S:
            findings.append(
                Finding(
                    "warn",
                    f"workflow {workflow_id}",
                    f"{status}, no change for {(now - updated) / 60:.0f} min",
                    f"look at its tasks: dagq tasks {workflow_id}; "
                    f"cancel it: dagq cancel {workflow_id}",
                )
            )
    if not findings:
        findings.append(Finding("ok", "workflows", f"{len(active)} unfinished, none stuck"))
    return findings
