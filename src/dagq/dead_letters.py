"""Dead letters, for people: what each one is, and putting it back after a fix.

A message goes to its queue's dead letters when it was delivered too many times (a
task that keeps killing its worker, a completion the coordinator keeps failing to
apply) or cannot be parsed — never silently dropped. ``dagq dlq`` lists them, shows
one, replays it (sends it back to its queue, then removes the dead letter, so a crash
in between leaves a duplicate, never a loss) or purges it.

A replayed task message runs again; if the coordinator has given up on that attempt
since (it timed out and was retried), its completion is ignored as stale — use
``dagq retry`` for a workflow that already failed.

Replaying or purging is recorded in the history of every run the dead letter
concerned (``dead_letter_replayed`` / ``dead_letter_purged``, with who did it), through
the coordinator like a cancel. A message that cannot be parsed names no run: that one
is only logged, saying so.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import msgspec

from dagq import keys, payloads
from dagq.errors import UsageError
from dagq.messages import (
    DeadLetterHandled,
    Event,
    TaskFinished,
    TaskStarted,
    decode_events,
    decode_tasks,
    encode_events,
)
from dagq.stores.base import DeadLetter, OutgoingMessage, Store

log = logging.getLogger("dagq.dead_letters")

#: The most dead letters one `--all` replays or purges.
ALL_LIMIT = 100_000


class DeadLetterInfo(msgspec.Struct, frozen=True, kw_only=True):
    """A dead letter as shown: where it was, why, and what it carried."""

    key: str
    queue: str
    message_id: str
    deliveries: int
    reason: str
    dead_at: float
    #: "task", "events" or "unreadable".
    kind: str
    #: One line: the workflows and tasks it concerns.
    summary: str
    size: int


def describe(dead: DeadLetter) -> DeadLetterInfo:
    """What a dead letter is, decoded as far as it can be."""
    kind, summary = _what(dead.body)
    return DeadLetterInfo(
        key=dead.key,
        queue=dead.queue,
        message_id=dead.id,
        deliveries=dead.dequeue_count,
        reason=dead.reason,
        dead_at=dead.dead_at,
        kind=kind,
        summary=summary,
        size=len(dead.body),
    )


def body_of(dead: DeadLetter) -> Any:
    """The message's content as JSON-ready data (unreadable bytes as text, replaced)."""
    try:
        return [msgspec.to_builtins(t) for t in decode_tasks(dead.body)]
    except (msgspec.DecodeError, msgspec.ValidationError):
        pass
    try:
        return [msgspec.to_builtins(e) for e in decode_events(dead.body)]
    except (msgspec.DecodeError, msgspec.ValidationError):
        return dead.body.decode("utf-8", errors="replace")


def _what(body: bytes) -> tuple[str, str]:
    try:
        tasks = decode_tasks(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        pass
    else:
        names = ", ".join(
            f"{t.workflow_id}/{_task_name(t.name, t.item_index)}#{t.attempt}" for t in tasks
        )
        return "task", names
    try:
        events = decode_events(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return "unreadable", body[:60].decode("utf-8", errors="replace")
    finished = sum(isinstance(e, TaskFinished) for e in events)
    started = sum(isinstance(e, TaskStarted) for e in events)
    workflows = sorted({e.workflow_id for e in events})
    shown = ", ".join(workflows[:3]) + (
        f" and {len(workflows) - 3} more" if len(workflows) > 3 else ""
    )
    return "events", f"{len(events)} event(s) ({finished} finished, {started} started) of {shown}"


def _task_name(name: str, index: int) -> str:
    return name if index < 0 else f"{name}[{index}]"


async def find(store: Store, keys: Sequence[str]) -> list[DeadLetter]:
    """The dead letters with these keys, in the order given; an unknown key is an error."""
    wanted = list(dict.fromkeys(keys))
    found = [await store.queues.dead_letter_of(key) for key in wanted]
    missing = [k for k, d in zip(wanted, found, strict=True) if d is None]
    if missing:
        raise UsageError(
            f"no dead letter with key {', '.join(repr(k) for k in missing)} (see: dagq dlq list)"
        )
    return [d for d in found if d is not None]


async def replay(store: Store, dead: Sequence[DeadLetter], actor: str = "") -> int:
    """Send each dead letter back to its queue (as new), then remove it, and record it
    in the runs it concerns (``actor``: who did it); how many."""
    for letter in dead:
        await store.queues.send(letter.queue, [OutgoingMessage(letter.body, id=letter.id)])
        await store.queues.remove_dead_letters([letter.key])
        await record(store, letter, "replayed", actor)
    return len(dead)


async def purge(store: Store, dead: Sequence[DeadLetter], actor: str = "") -> int:
    """Remove dead letters for good, and record it in the runs they concerned; how
    many went."""
    count = await store.queues.remove_dead_letters([d.key for d in dead])
    for letter in dead:
        await record(store, letter, "purged", actor)
    return count


def concerns(dead: DeadLetter) -> dict[str, str]:
    """The runs a dead letter concerns, each with what of it the message carried
    (empty for a message that cannot be parsed)."""
    try:
        tasks = decode_tasks(dead.body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        pass
    else:
        carried: dict[str, list[str]] = {}
        for t in tasks:
            name = f"{_task_name(t.name, t.item_index)}#{t.attempt}"
            carried.setdefault(t.workflow_id, []).append(name)
        return {w: f"task {', '.join(names)}" for w, names in carried.items()}
    try:
        events = decode_events(dead.body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return {}
    counts: dict[str, int] = {}
    for e in events:
        counts[e.workflow_id] = counts.get(e.workflow_id, 0) + 1
    return {w: f"{n} event(s) to the coordinator" for w, n in counts.items()}


async def record(store: Store, dead: DeadLetter, action: str, actor: str) -> None:
    """Record ``action`` ("replayed", "purged") on ``dead`` in the history of each run
    it concerns; a message naming no run (unparseable) is logged instead."""
    runs = concerns(dead)
    if not runs:
        log.warning(
            "%s %s dead letter %s of queue %s: its message cannot be parsed, so it names "
            "no workflow and is recorded in no run's events",
            actor or "someone",
            action,
            dead.key,
            dead.queue,
        )
        return
    events: list[Event] = [
        DeadLetterHandled(
            workflow_id=workflow_id,
            action=action,
            key=dead.key,
            detail=payloads.cut(detail, 500),
            request_id=f"dead-letter-{action}-{dead.key}",
            actor=payloads.cut(actor, 200),
        )
        for workflow_id, detail in runs.items()
    ]
    await store.queues.send(keys.COMPLETIONS_QUEUE, [OutgoingMessage(encode_events(events))])
    log.info("%s %s dead letter %s (%s)", actor or "someone", action, dead.key, ", ".join(runs))
