"""Reading and writing runtime states in a store (the formats are in :mod:`dagq.snapshots`).

The header at ``states/{id}`` is the commit point, written under compare-and-swap.
Small workflows keep their task columns inline; large ones write a delta per flush
beside a base snapshot and fold the deltas into a new base from time to time, so the
cost of a flush follows what changed, not the size of the workflow.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from dataclasses import dataclass, field

from dagq import keys, snapshots
from dagq.errors import DagqError, StoreError
from dagq.plan import Plan
from dagq.state import RunState
from dagq.stores.base import Batch, Store

#: Workflows up to this many tasks keep their task columns in the header itself.
INLINE_TASKS = 2048
#: Fold deltas into a new base after this many, or once they outweigh the base.
MAX_DELTAS = 32


@dataclass(slots=True)
class Stored:
    """Where a state lives in the store, as of its last read or write."""

    etag: str
    base: str | None = None
    deltas: list[str] = field(default_factory=list)
    base_bytes: int = 0
    delta_bytes: int = 0


async def create_state(store: Store, state: RunState) -> str:
    """Store a new workflow's initial state (create-only); ConflictError if it exists."""
    data = snapshots.encode(state)
    return await store.documents.put(keys.state(state.workflow_id), data, if_none_match=True)


async def read_state(store: Store, workflow_id: str, plan: Plan) -> tuple[RunState, Stored] | None:
    """The working state and where it lives, or None if the workflow has no state."""
    doc = await store.documents.get(keys.state(workflow_id))
    if doc is None:
        return None
    head = snapshots.decode_header(doc.data)
    state = snapshots.empty_state(head)
    if head.inline is not None:
        snapshots.load_tasks(state, head.inline)
    else:
        names = [head.base or "", *head.deltas]
        parts = await asyncio.gather(*(store.documents.get(name) for name in names))
        for name, part in zip(names, parts, strict=True):
            if part is None:
                raise StoreError(f"the state of {workflow_id} is damaged: {name} is missing")
        snapshots.load_tasks(state, parts[0].data)  # type: ignore[union-attr]
        for part in parts[1:]:
            snapshots.apply_delta(state, part.data)  # type: ignore[union-attr]
    state.rebuild(plan)
    stored = Stored(doc.etag, head.base, list(head.deltas), head.base_bytes, head.delta_bytes)
    return state, stored


@dataclass(slots=True)
class Staged:
    """A state write staged in a batch: where it will live, once the batch commits."""

    stored: Stored
    slot: int
    previous_base: str | None


def stage_state(batch: Batch, state: RunState, stored: Stored) -> Staged:
    """Stage the writes of ``state`` over the version ``stored`` names (header last)."""
    workflow_id = state.workflow_id
    if state.n_tasks + sum(g.n for g in state.groups.values()) <= INLINE_TASKS:
        head = snapshots.header(state, inline=snapshots.encode_tasks(state))
        written = Stored("")
    elif _compact(stored):
        data = snapshots.encode_tasks(state)
        base = keys.state_part(workflow_id, f"base-{_token()}")
        batch.put(base, data)
        head = snapshots.header(state, base=base, base_bytes=len(data))
        written = Stored("", base, [], len(data), 0)
    else:
        deltas = list(stored.deltas)
        size = stored.delta_bytes
        if state.changed or state.changed_groups or state.changed_items:
            data = snapshots.encode_delta(
                state, state.changed, state.changed_groups, state.changed_items
            )
            deltas.append(keys.state_part(workflow_id, f"delta-{len(deltas) + 1:04d}-{_token()}"))
            batch.put(deltas[-1], data)
            size += len(data)
        head = snapshots.header(
            state, base=stored.base, deltas=deltas, base_bytes=stored.base_bytes, delta_bytes=size
        )
        written = Stored("", stored.base, deltas, stored.base_bytes, size)
    slot = batch.put(keys.state(workflow_id), snapshots.encode_header(head), if_match=stored.etag)
    return Staged(written, slot, stored.base)


async def settle(store: Store, state: RunState, staged: Staged, etags: list[str]) -> Stored:
    """After the batch committed: the new version, and old parts cleaned up."""
    staged.stored.etag = etags[staged.slot]
    state.changed.clear()
    state.changed_groups.clear()
    state.changed_items.clear()
    if staged.stored.base != staged.previous_base:
        keep = {staged.stored.base} if staged.stored.base else set()
        await _forget(store, state.workflow_id, keep=keep)
    return staged.stored


async def write_state(store: Store, state: RunState, stored: Stored) -> Stored:
    """Write ``state`` over the version ``stored`` names; ConflictError if it moved on."""
    batch = store.batch()
    staged = stage_state(batch, state, stored)
    return await settle(store, state, staged, await batch.commit())


def _compact(stored: Stored) -> bool:
    return (
        stored.base is None
        or len(stored.deltas) >= MAX_DELTAS
        or stored.delta_bytes > stored.base_bytes
    )


def _token() -> str:
    return os.urandom(4).hex()


async def _forget(store: Store, workflow_id: str, *, keep: set[str]) -> None:
    """Delete parts no header refers to (superseded, or left by a lost race); best effort."""
    with contextlib.suppress(DagqError):
        for name in await store.documents.list(keys.state_parts_prefix(workflow_id)):
            if name not in keep:
                await store.documents.delete(name)
