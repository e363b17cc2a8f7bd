"""Reading and writing runtime states in a store (the formats are in :mod:`dagq.snapshots`).

The header at ``states/{id}`` is the commit point, written under compare-and-swap.
Small workflows keep their task columns inline; large ones write a delta per flush
beside a base snapshot and fold the deltas into a new base from time to time, so the
cost of a flush follows what changed, not the size of the workflow.

Readers never see a half-deleted state: a fold deletes only the parts that neither the
new header nor the one before it names, so a reader that read the previous header
still finds every part it names; a reader slower than two folds finds a part missing,
re-reads the header and follows the new one. A new base is encoded in a thread while
flushes go on writing deltas (the first flush after it is ready stages it), and a
large state is decoded in a thread: big documents never stall the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import msgspec

from dagq import keys, snapshots
from dagq.errors import ConflictError, DagqError, DamagedData, StoreUnavailable
from dagq.plan import Plan
from dagq.state import WORKFLOW_TERMINAL, RunState
from dagq.stores.base import Batch, Document, Store

#: Workflows up to this many tasks keep their task columns in the header itself.
INLINE_TASKS = 2048
#: Fold deltas into a new base after this many (more over a large base, see
#: :func:`delta_limit`), or once they outweigh the base.
MAX_DELTAS = 32
#: Over a large base, one more delta before a fold for every this many bytes of base: a
#: fold encodes the whole state, so its cost spread over the flushes between two folds
#: stays about the same whatever the workflow's size. A million-instance foreach's base
#: (~5 MB) took ~0.25 s of CPU to fold; begun every 32 flushes, a fold was under way
#: for most of the run.
BASE_BYTES_PER_DELTA = 32 * 1024
#: ... up to this many deltas (a reader gets each part: their number stays bounded).
DELTA_LIMIT = 256
#: How often a reader re-reads the header when a part it names vanished meanwhile.
READ_ATTEMPTS = 5
#: States over this many bytes (or over INLINE_TASKS tasks) are decoded in a thread.
OFF_LOOP_BYTES = 256 * 1024


def delta_limit(base_bytes: int) -> int:
    """How many deltas a base of this size takes before a fold begins."""
    return min(DELTA_LIMIT, max(MAX_DELTAS, base_bytes // BASE_BYTES_PER_DELTA))


def most_deltas(base_bytes: int) -> int:
    """While a new base is being encoded deltas go on; at this many the flush folds
    itself."""
    return 2 * delta_limit(base_bytes)


_P = ParamSpec("_P")
_T = TypeVar("_T")


class Folding(msgspec.Struct):
    """A new base being encoded in a thread, from the state as of ``upto`` deltas."""

    key: str
    upto: int
    upto_bytes: int
    data: asyncio.Future[bytes]


class Stored(msgspec.Struct):
    """Where a state lives in the store, as of its last read or write."""

    etag: str
    base: str | None = None
    deltas: list[str] = msgspec.field(default_factory=list)
    base_bytes: int = 0
    delta_bytes: int = 0
    #: A new base on its way (staged by the first flush after it is ready), or None.
    folding: Folding | None = None
    #: Not stored yet: its submit left the first write to the coordinator of its
    #: process (:class:`dagq.submitted.Created`), which writes it without a condition.
    absent: bool = False

    def parts(self) -> set[str]:
        """The parts this version's header names."""
        return {self.base, *self.deltas} if self.base else set(self.deltas)


def is_large(state: RunState) -> bool:
    """Is this state stored in parts (a base and deltas) rather than in its header?"""
    return state.n_tasks + sum(g.n for g in state.groups.values()) > INLINE_TASKS


def stage_created_state(batch: Batch, state: RunState) -> bool:
    """Stage a new small workflow's initial state (create-only) in ``batch``; False,
    and nothing staged, for a large one (:func:`create_state` writes its base first)."""
    if is_large(state):
        return False
    batch.put(keys.state(state.workflow_id), snapshots.encode(state), if_none_match=True)
    return True


async def create_state(store: Store, state: RunState) -> str:
    """Store a new workflow's initial state (create-only); ConflictError if it exists.

    A large workflow starts with a base (encoded in a thread), so no flush ever has
    to encode its whole state on the event loop.
    """
    workflow_id = state.workflow_id
    if not is_large(state):
        data = snapshots.encode(state)
        return await store.documents.put(keys.state(workflow_id), data, if_none_match=True)
    tasks = await asyncio.to_thread(snapshots.encode_tasks, state)  # nobody else has it yet
    base = keys.state_part(workflow_id, f"base-{_token()}")
    await store.documents.put(base, tasks)
    head = snapshots.header(state, base=base, base_bytes=len(tasks))
    try:
        return await store.documents.put(
            keys.state(workflow_id), snapshots.encode_header(head), if_none_match=True
        )
    except ConflictError:
        with contextlib.suppress(DagqError):
            await store.documents.delete(base)
        raise


async def read_state(
    store: Store, workflow_id: str, plan: Plan, *, header: Document | None = None
) -> tuple[RunState, Stored] | None:
    """The working state and where it lives, or None if the workflow has no state;
    ``header``: its header document, read by the caller a moment ago (not read again).

    A part missing under a header that has since moved on was folded away while this
    read ran: the new header is followed. One missing under the current header is
    damage (:class:`~dagq.errors.DamagedData`).
    """
    seen: str | None = None
    missing = ""
    for _ in range(READ_ATTEMPTS):
        doc = header or await store.documents.get(keys.state(workflow_id))
        header = None
        if doc is None:
            return None
        if doc.etag == seen:
            raise DamagedData(f"the state of {workflow_id} is damaged: {missing} is missing")
        seen = doc.etag
        head = snapshots.decode_header(doc.data)
        if head.inline is not None:
            state = await _assembled(head, head.inline, [], plan, len(doc.data))
            return state, Stored(doc.etag)
        names = [head.base or "", *head.deltas]
        parts = await asyncio.gather(*(store.documents.get(name) for name in names))
        missing = next((n for n, p in zip(names, parts, strict=True) if p is None), "")
        if not missing:
            datas = [p.data for p in parts if p is not None]
            state = await _assembled(head, datas[0], datas[1:], plan, sum(map(len, datas)))
            stored = Stored(
                doc.etag, head.base, list(head.deltas), head.base_bytes, head.delta_bytes
            )
            return state, stored
    raise StoreUnavailable(
        f"the state of {workflow_id} changed {READ_ATTEMPTS} times while being read; try again"
    )


async def off_loop(size: int, work: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
    """``work(*args, **kwargs)`` — in a thread when its input (``size`` bytes) is large,
    so decoding a big document never stalls the event loop."""
    if size <= OFF_LOOP_BYTES:
        return work(*args, **kwargs)
    return await asyncio.to_thread(work, *args, **kwargs)


async def _assembled(
    head: snapshots.Header, base: bytes, deltas: list[bytes], plan: Plan, size: int
) -> RunState:
    """The state a header, its base and deltas make; a large one is decoded in a thread."""
    if head.n_tasks <= INLINE_TASKS and size <= OFF_LOOP_BYTES:
        return _assemble(head, base, deltas, plan)
    return await asyncio.to_thread(_assemble, head, base, deltas, plan)


def _assemble(head: snapshots.Header, base: bytes, deltas: list[bytes], plan: Plan) -> RunState:
    state = snapshots.empty_state(head)
    snapshots.load_tasks(state, base)
    for delta in deltas:
        snapshots.apply_delta(state, delta, recount=False)
    if deltas:  # once, not at each delta: a recount walks every instance of a group
        for group in state.groups.values():
            group.recount()
    state.rebuild(plan)
    return state


class Staged(msgspec.Struct):
    """A state write staged in a batch: where it will live, once the batch commits."""

    stored: Stored
    slot: int
    previous: Stored


def stage_state(batch: Batch, state: RunState, stored: Stored) -> Staged:
    """Stage the writes of ``state`` over the version ``stored`` names (header last)."""
    workflow_id = state.workflow_id
    if not is_large(state):
        # Rewritten whole at every flush: compressed only once the run has ended (it is
        # read, not rewritten, from then on). While it runs, zlib cost more than the
        # bytes it saved: ~0.45 ms of CPU a flush for a 1,000-task run's 41 KB of
        # columns (to 12 KB), some 40 us a task when each flush ends a dozen tasks.
        ended = state.status in WORKFLOW_TERMINAL
        head = snapshots.header(state, inline=snapshots.encode_tasks(state, compress=ended))
        written = Stored("")
    elif stored.base is None or len(stored.deltas) >= most_deltas(stored.base_bytes):
        # No base yet (a state stored inline grew), or folding lags far behind: fold here.
        data = snapshots.encode_tasks(state)
        base = keys.state_part(workflow_id, f"base-{_token()}")
        batch.put(base, data)
        head = snapshots.header(state, base=base, base_bytes=len(data))
        written = Stored("", base, [], len(data), 0)
    else:
        written = _with_folded(batch, stored)
        if state.changed or state.changed_groups or state.changed_items:
            data = snapshots.encode_delta(
                state, state.changed, state.changed_groups, state.changed_items
            )
            n = len(written.deltas) + 1
            written.deltas.append(keys.state_part(workflow_id, f"delta-{n:04d}-{_token()}"))
            batch.put(written.deltas[-1], data)
            written.delta_bytes += len(data)
        head = snapshots.header(
            state,
            base=written.base,
            deltas=written.deltas,
            base_bytes=written.base_bytes,
            delta_bytes=written.delta_bytes,
        )
    header = snapshots.encode_header(head)
    # A state nobody has stored yet is written without a condition: its only other
    # writer is a repeated submit of the same id, creating the same initial state, and
    # a create-only write would cost the phased committer a HEAD before its batch.
    condition = None if stored.absent else stored.etag
    slot = batch.put(keys.state(workflow_id), header, if_match=condition)
    return Staged(written, slot, stored)


def initial_state(workflow_id: str, plan: Plan, created_at: float) -> RunState:
    """The state a workflow starts with (what its submit stores), ready to use."""
    state = RunState(workflow_id, len(plan.tasks), created_at)
    state.rebuild(plan)
    return state


def _with_folded(batch: Batch, stored: Stored) -> Stored:
    """Where the next version lives: over a new base if one is ready (staged here)."""
    folding = stored.folding
    if folding is None or not folding.data.done():
        return Stored(
            "", stored.base, list(stored.deltas), stored.base_bytes, stored.delta_bytes, folding
        )
    if folding.data.cancelled() or folding.data.exception() is not None:
        return Stored("", stored.base, list(stored.deltas), stored.base_bytes, stored.delta_bytes)
    data = folding.data.result()
    batch.put(folding.key, data)
    deltas = stored.deltas[folding.upto :]
    return Stored("", folding.key, deltas, len(data), stored.delta_bytes - folding.upto_bytes)


async def settle(store: Store, state: RunState, staged: Staged, etags: list[str]) -> Stored:
    """After the batch committed: the new version; old parts cleaned up, a fold begun."""
    written = staged.stored
    written.etag = etags[staged.slot]
    state.changed.clear()
    state.changed_groups.clear()
    state.changed_items.clear()
    previous = staged.previous
    if written.base != previous.base:
        # Readers may still follow the previous header: keep what it names too.
        await _forget(store, state.workflow_id, keep=written.parts() | previous.parts())
    if written.base is not None and written.folding is None and _compact(written):
        written.folding = await _fold(state, written)
    return written


async def write_state(store: Store, state: RunState, stored: Stored) -> Stored:
    """Write ``state`` over the version ``stored`` names; ConflictError if it moved on."""
    batch = store.batch()
    staged = stage_state(batch, state, stored)
    return await settle(store, state, staged, await batch.commit())


def _compact(stored: Stored) -> bool:
    return (
        len(stored.deltas) >= delta_limit(stored.base_bytes)
        or stored.delta_bytes > stored.base_bytes
    )


async def _fold(state: RunState, written: Stored) -> Folding:
    """Begin encoding a new base, in a thread, from ``state`` as just committed.

    The copy is taken in a thread too (100,000 tasks' columns take tens of
    milliseconds); the caller changes the state only once this returns."""
    # The state moves on once this returns; the copy does not.
    columns = await asyncio.to_thread(snapshots.copy_tasks, state)
    data = asyncio.get_running_loop().run_in_executor(None, snapshots.encode_copy, columns)
    data.add_done_callback(_retrieve)
    key = keys.state_part(state.workflow_id, f"base-{_token()}")
    return Folding(key, len(written.deltas), written.delta_bytes, data)


def _retrieve(future: asyncio.Future[bytes]) -> None:
    """A fold that failed is simply begun again later; its error is not news."""
    if not future.cancelled():
        future.exception()


def _token() -> str:
    return os.urandom(4).hex()


async def _forget(store: Store, workflow_id: str, *, keep: set[str]) -> None:
    """Delete parts no kept header refers to (older folds, left by a lost race), in one
    batch; best effort."""
    with contextlib.suppress(DagqError):
        names = await store.documents.list(keys.state_parts_prefix(workflow_id))
        batch = store.batch()
        for name in names:
            if name not in keep:
                batch.delete(name)
        await batch.commit()
