"""The storage contract: four small primitives every backend implements.

* **documents** — versioned blobs with compare-and-swap (definitions, runtime state,
  large outputs, history, logs);
* **queues** — at-least-once message queues with visibility timeouts and a
  dead-letter queue;
* **index** — one queryable row per workflow (a projection, never the truth);
* **leases** — named, expiring locks (one coordinator per store).

Every backend passes the one conformance suite in ``tests/conformance``. Backends
translate driver errors into :mod:`dagq.errors` at their boundary.

The values that cross the contract are frozen msgspec structs: every command imports
this module, and a dataclass is compiled from generated source at import (about a
millisecond each); a struct is not.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from dagq.errors import LeaseLost
from dagq.stores.changes import ChangeFeed, batch_topics

if TYPE_CHECKING:
    import asyncio

#: Largest message body any backend accepts. Azure Queue Storage caps a message at
#: 64 KiB *after* base64 encoding, so 48 KiB of raw bytes is the portable limit;
#: every backend enforces it so that code which works on one works on all.
MAX_MESSAGE_BYTES = 48 * 1024

#: A message received more often than this goes to the dead-letter queue.
DEFAULT_MAX_DELIVERIES = 10

Clock = Callable[[], float]


# --- documents --------------------------------------------------------------


class Document(msgspec.Struct, frozen=True):
    """A stored document and the version tag a conditional write must name."""

    data: bytes
    etag: str


class Documents(Protocol):
    """Versioned key → bytes storage with conditional writes."""

    async def get(self, key: str) -> Document | None:
        """Return the document, or None when it does not exist."""
        ...

    async def put(
        self, key: str, data: bytes, *, if_match: str | None = None, if_none_match: bool = False
    ) -> str:
        """Write ``data`` and return the new etag.

        ``if_match``: write only if the current etag equals it (a missing document
        also conflicts). ``if_none_match``: write only if the key does not exist.
        A failed condition raises :class:`~dagq.errors.ConflictError`; a write never
        silently replaces a version it was not told about.
        """
        ...

    async def delete(self, key: str, *, if_match: str | None = None) -> bool:
        """Delete; True if something was deleted. A stale ``if_match`` raises ConflictError."""
        ...

    async def list(
        self, prefix: str, *, start_after: str | None = None, limit: int | None = None
    ) -> list[str]:
        """Keys starting with ``prefix``, sorted, after ``start_after``, at most ``limit``."""
        ...


# --- queues -----------------------------------------------------------------


class OutgoingMessage(msgspec.Struct, frozen=True):
    """A message to send. A given ``id`` deduplicates against the same id still queued."""

    body: bytes
    id: str | None = None
    delay_s: float = 0.0


class Message(msgspec.Struct, frozen=True):
    """A received message. ``receipt`` is needed to delete or extend it."""

    queue: str
    id: str
    body: bytes
    receipt: str
    dequeue_count: int
    enqueued_at: float


class DeadLetter(msgspec.Struct, frozen=True):
    """A message that was moved to a queue's dead-letter queue, with the reason."""

    queue: str
    id: str
    body: bytes
    dequeue_count: int
    reason: str
    dead_at: float
    #: The store's handle for this dead letter (for removing it); unique in the store.
    key: str = ""


class QueueDepth(msgspec.Struct, frozen=True):
    """How much is waiting in a queue."""

    visible: int
    invisible: int
    oldest_age_s: float


class Queues(Protocol):
    """At-least-once queues with visibility timeouts and a dead-letter queue."""

    #: True if ``send`` drops a message whose ``id`` is still queued (memory, sqlite);
    #: False where the service cannot (Azure Queue Storage): there a duplicate id is a
    #: second message, and consumers rely on their own idempotence
    #: (docs/architecture.md, invariant 4).
    deduplicates: bool
    #: How many task messages the coordinator packs into one queue message when many go
    #: out at once: 1 where a message is cheap (memory, sqlite); more where every
    #: request is billed and rate-limited (Azure).
    bundle_size: int

    async def send(self, queue: str, messages: Sequence[OutgoingMessage]) -> None:
        """Enqueue messages (each at most MAX_MESSAGE_BYTES, else MessageTooLarge).

        Where ``deduplicates`` is True, a message whose ``id`` equals one still in the
        queue is not added again.
        """
        ...

    async def receive(
        self, queue: str, *, max_messages: int, visibility_timeout_s: float
    ) -> list[Message]:
        """Take up to ``max_messages`` visible messages and hide them for the timeout.

        A message is never handed to two receivers within its visibility timeout.
        One that would be delivered more than the store's ``max_deliveries`` times
        goes to the dead-letter queue instead.
        """
        ...

    async def delete(self, queue: str, receipts: Sequence[str]) -> int:
        """Delete received messages; stale receipts are ignored. Returns how many went."""
        ...

    async def extend(self, queue: str, receipt: str, visibility_timeout_s: float) -> str:
        """Keep a received message hidden for longer; returns the new receipt.

        Raises MessageLost when the receipt is stale (deleted or redelivered).
        """
        ...

    async def dead_letter(self, queue: str, receipt: str, reason: str) -> None:
        """Move a received message to the dead-letter queue (e.g. it cannot be parsed)."""
        ...

    async def dead_letters(self, queue: str | None, *, limit: int = 100) -> list[DeadLetter]:
        """The dead-lettered messages of ``queue`` (None: of every queue), oldest first."""
        ...

    async def dead_letter_of(self, key: str) -> DeadLetter | None:
        """The dead letter with this ``key``, if there is one (an unknown or malformed
        key is None)."""
        ...

    async def remove_dead_letters(self, keys: Sequence[str]) -> int:
        """Remove dead letters by ``key`` (unknown keys are ignored); how many went."""
        ...

    async def depth(self, queue: str) -> QueueDepth:
        """Visible and invisible message counts, and the age of the oldest message."""
        ...

    async def wait(self, queue: str, timeout_s: float) -> None:
        """Return when a message may have arrived in ``queue``, or after ``timeout_s``.

        In one process this wakes as soon as ``send`` is called; across processes it
        wakes where the backend can tell (sqlite: a datagram from the sender's process;
        postgres: NOTIFY) and is otherwise a plain sleep, so callers poll with it.
        """
        ...


def wakes_across_processes(queues: Queues) -> bool:
    """Whether a send from another process wakes ``queues.wait`` in this one (a
    backend's optional ``wakes``; False where it has none). Where it does, a waiter
    needs its poll only for what no send announces (a delayed message coming due), so
    it may poll rarely even right after work."""
    return bool(getattr(queues, "wakes", False))


def takes_handoff(committer: Committer | None) -> bool:
    """Whether a coordinator committing through ``committer`` may take completions
    handed over in its process: the batch is one transaction (``atomic``), or its
    acks are written only once its states are (``acks_after_states``: a failure part
    way leaves states written and the acks not, and the events, posted again by their
    workers, apply as no-ops)."""
    return bool(
        getattr(committer, "atomic", False) or getattr(committer, "acks_after_states", False)
    )


def wrapped_committer(inner: Committer, wrapper: Committer, *, atomic: bool) -> Committer:
    """``wrapper``, which calls ``inner`` with each batch whole (or not at all), made to
    promise what ``inner`` promises: its writes' order (``acks_after_states``) always,
    all or nothing (``atomic``) only when the caller says so (a wrapper that injects
    faults between writes must not claim it)."""
    if getattr(inner, "acks_after_states", False):
        wrapper.acks_after_states = True  # type: ignore[attr-defined]
    if atomic and getattr(inner, "atomic", False):
        wrapper.atomic = True  # type: ignore[attr-defined]
    return wrapper


async def get_many(documents: Documents, keys: Sequence[str]) -> list[Document | None]:
    """The documents at ``keys``, in their order (None where there is none): in one
    request where the backend reads several at once (its optional ``get_many``, with
    the same answer), else read side by side."""
    many = getattr(documents, "get_many", None)
    if many is not None:
        found: list[Document | None] = await many(keys)
        return found
    import asyncio  # here: every command imports this module, not all of them need it

    return list(await asyncio.gather(*(documents.get(key) for key in keys)))


def report_linger(queues: Queues) -> float:
    """How long a worker's completion may wait for those of its other running tasks,
    to go out in the same commit (a backend's optional ``report_linger_s``; 0 where
    it has none: there a commit costs little)."""
    return float(getattr(queues, "report_linger_s", 0.0))


# --- index ------------------------------------------------------------------


class IndexRow(msgspec.Struct, frozen=True, kw_only=True):
    """One workflow as listed: a projection of its runtime state."""

    id: str
    name: str
    status: str
    created_at: float
    updated_at: float
    tenant: str = ""
    data: dict[str, Any] = msgspec.field(default_factory=dict)


class IndexPage(msgspec.Struct, frozen=True):
    """A page of index rows, newest first, and the cursor for the next page (or None)."""

    rows: list[IndexRow]
    cursor: str | None = None


class Index(Protocol):
    """Rows for listing workflows and for sweeps."""

    async def upsert(self, row: IndexRow) -> None:
        """Insert or replace the row with ``row.id``."""
        ...

    async def get(self, workflow_id: str) -> IndexRow | None:
        """The row, or None."""
        ...

    async def query(
        self,
        *,
        status: Sequence[str] | None = None,
        name: str | None = None,
        tenant: str | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> IndexPage:
        """Rows matching every given filter, newest ``created_at`` first."""
        ...

    async def changed(self, after: float, *, limit: int = 100) -> list[IndexRow]:
        """Rows written with ``updated_at`` later than ``after``, oldest change first
        (then by id), at most ``limit``: what changed since a moment, for a stream."""
        ...

    async def count(
        self,
        *,
        name: str | None = None,
        tenant: str | None = None,
        labels: Mapping[str, str] | None = None,
        created_after: float | None = None,
        created_before: float | None = None,
    ) -> dict[str, int]:
        """How many rows of each status match every given filter (statuses with none
        are left out): ``created_after <= created_at < created_before``, and each of
        ``labels`` equal in the row's ``data["labels"]``. Counted where the rows are
        (a GROUP BY, a projection), not by listing them."""
        ...

    async def delete(self, workflow_id: str) -> bool:
        """Remove the row; True if it existed."""
        ...


# --- leases -----------------------------------------------------------------


class Lease(msgspec.Struct, frozen=True):
    """A held lease. ``token`` changes at every acquisition."""

    name: str
    owner: str
    token: str
    acquired_at: float
    expires_at: float


class Leases(Protocol):
    """Named, expiring locks."""

    async def acquire(self, name: str, owner: str, ttl_s: float, *, force: bool = False) -> Lease:
        """Take the lease if free or expired (or always, with ``force``); else LeaseHeld."""
        ...

    async def renew(self, lease: Lease, ttl_s: float) -> Lease:
        """Extend a lease we hold; LeaseLost if it expired and was taken, or was broken."""
        ...

    async def release(self, lease: Lease) -> None:
        """Give the lease up (no-op if we no longer hold it)."""
        ...

    async def get(self, name: str) -> Lease | None:
        """The current holder, if the lease is held and unexpired."""
        ...


# --- batches of writes -------------------------------------------------------


class PutOp(msgspec.Struct, frozen=True):
    """``documents.put`` inside a batch."""

    key: str
    data: bytes
    if_match: str | None = None
    if_none_match: bool = False


class DeleteOp(msgspec.Struct, frozen=True):
    """``documents.delete`` (unconditional) inside a batch."""

    key: str


class SendOp(msgspec.Struct, frozen=True):
    """``queues.send`` inside a batch."""

    queue: str
    messages: Sequence[OutgoingMessage]


class AckOp(msgspec.Struct, frozen=True):
    """``queues.delete`` inside a batch.

    The commit appends to ``deleted`` how many of ``receipts`` it deleted: a store
    ignores a stale receipt, so fewer means a message was no longer held (its task
    may run again), which the caller must not ignore. ``deleted`` is an outcome, not
    part of the operation: equality and hash leave it out.
    """

    queue: str
    receipts: Sequence[str]
    deleted: list[int] = msgspec.field(default_factory=list)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, AckOp)
        return (self.queue, self.receipts) == (other.queue, other.receipts)

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __hash__(self) -> int:
        return hash((self.queue, self.receipts))


class UpsertOp(msgspec.Struct, frozen=True):
    """``index.upsert`` inside a batch."""

    row: IndexRow


class FenceOp(msgspec.Struct, frozen=True):
    """Commit the batch only while lease ``name`` is held with ``token``; else LeaseLost.

    A store with transactions checks it inside the commit (sqlite), so a holder that
    lost its lease can never write; elsewhere it is checked before the writes.
    """

    name: str
    token: str


BatchOp = PutOp | DeleteOp | SendOp | AckOp | UpsertOp | FenceOp
#: Commits a list of operations; returns the etags of the puts, in order.
Committer = Callable[[Sequence[BatchOp]], Awaitable[list[str]]]


class Batch:
    """Writes to commit together.

    A backend with transactions (sqlite) commits them all or none, in one round trip;
    without a committer they run one after another in order and stop at the first
    failure, which is exactly what the same calls made one by one would do. A backend
    without transactions may commit in phases, with concurrency inside each (azure:
    plain document puts, then conditional puts, then sends, then deletes, acks and
    index rows), never starting a later phase after a failure and never writing, for a
    condition already stale when the commit starts, more than the calls made one by one
    would have (azure: as far as this process knows — a version another process
    replaced since this one last saw it fails only at its own put). Either way a failed
    conditional put raises ConflictError from :meth:`commit`.
    """

    def __init__(self, store: Store) -> None:
        self._store = store
        self.ops: list[BatchOp] = []

    def put(
        self, key: str, data: bytes, *, if_match: str | None = None, if_none_match: bool = False
    ) -> int:
        """Stage a document write; returns the position of its etag in commit()'s result."""
        self.ops.append(PutOp(key, data, if_match, if_none_match))
        return sum(isinstance(op, PutOp) for op in self.ops) - 1

    def delete(self, key: str) -> None:
        """Stage a document delete."""
        self.ops.append(DeleteOp(key))

    def send(self, queue: str, messages: Sequence[OutgoingMessage]) -> SendOp | None:
        """Stage messages to send (the operation, or None if there are none)."""
        if not messages:
            return None
        op = SendOp(queue, list(messages))
        self.ops.append(op)
        return op

    def ack(self, queue: str, receipts: Sequence[str]) -> AckOp | None:
        """Stage the delete of received messages; after the commit, the operation
        tells how many went (``deleted``)."""
        if not receipts:
            return None
        op = AckOp(queue, list(receipts))
        self.ops.append(op)
        return op

    def upsert(self, row: IndexRow) -> None:
        """Stage an index row."""
        self.ops.append(UpsertOp(row))

    def fence(self, lease: Lease) -> None:
        """Commit only while ``lease`` is still held (see :class:`FenceOp`)."""
        self.ops.insert(0, FenceOp(lease.name, lease.token))

    async def commit(self) -> list[str]:
        """Apply the staged writes; the etags of the puts, in order."""
        ops, self.ops = self.ops, []
        if not ops:
            return []
        if self._store.committer is not None:
            etags = await self._store.committer(ops)
        else:
            etags = await commit_in_order(self._store, ops)
        written = [op.key for op in ops if isinstance(op, PutOp | DeleteOp)]
        upserts = sum(isinstance(op, UpsertOp) for op in ops)
        if written or upserts:
            self._store.changes.notify(batch_topics(written, upserts))
        return etags


async def commit_in_order(store: Store, ops: Sequence[BatchOp]) -> list[str]:
    """Apply batch operations one by one through the primitives."""
    etags: list[str] = []
    for op in ops:
        if isinstance(op, FenceOp):
            held = await store.leases.get(op.name)
            if held is None or held.token != op.token:
                raise LeaseLost(f"lease {op.name!r} is no longer held; nothing was written")
        elif isinstance(op, PutOp):
            etag = await store.documents.put(
                op.key, op.data, if_match=op.if_match, if_none_match=op.if_none_match
            )
            etags.append(etag)
        elif isinstance(op, DeleteOp):
            await store.documents.delete(op.key)
        elif isinstance(op, SendOp):
            await store.queues.send(op.queue, op.messages)
        elif isinstance(op, AckOp):
            op.deleted.append(await store.queues.delete(op.queue, op.receipts))
        else:
            await store.index.upsert(op.row)
    return etags


# --- the bundle -------------------------------------------------------------


class Handoff(Protocol):
    """A coordinator in the worker's own process, taking completions without a queue.

    ``deliver`` takes a worker's events and the task messages they report on (receipts
    by queue); the coordinator applies the events and deletes those messages in the
    commit that writes the states (one transaction: docs/architecture.md, "Hand-off").
    The future says how that ended: the acks, their ``deleted`` filled in, once
    committed; None if it was not (nothing of it was written: post them instead).
    ``deliver`` itself returns None when it takes nothing (no longer coordinating).
    """

    def deliver(
        self, events: list[Any], acks: dict[str, list[str]]
    ) -> asyncio.Future[list[AckOp] | None] | None: ...

    def preload(self, created: Any) -> bool:
        """Keep what a submit in this process has just stored of a new workflow (a
        :class:`dagq.submitted.Created`), so that loading it reads nothing back; False
        when it was not kept (no longer coordinating)."""

    def status_of(self, workflow_id: str) -> str | None:
        """The status of the working copy of a run this coordinator holds (every status
        change of a run is its own while it coordinates); None when it holds none, or
        is no longer coordinating. May be ahead of the store by one commit."""

    def ended_run(self, workflow_id: str) -> tuple[str, Any, Any] | None:
        """A run this coordinator holds that has ended, its end committed (the index row
        with its final status written after the state): its name, plan and working
        copy (a :class:`dagq.state.RunState`, to be read at once, not kept); None
        otherwise — a waiter reads the store then."""


class Store(msgspec.Struct, eq=False):
    """A backend: the four primitives under one URL."""

    url: str
    documents: Documents
    queues: Queues
    index: Index
    leases: Leases
    closers: list[Callable[[], Any]] = msgspec.field(default_factory=list)
    #: Commits a :class:`Batch` natively (e.g. in one transaction); None: in order.
    committer: Committer | None = None
    #: Storage transactions made so far, by kind (``blob.put``, ``queue.receive``, ...),
    #: for backends billed per transaction; None where nothing is counted.
    transactions: Counter[str] | None = None
    #: Wakes readers waiting for a part of the store to change (server streams).
    changes: ChangeFeed = msgspec.field(default_factory=ChangeFeed)
    #: The coordinator of this process while it holds the lease on a store whose
    #: committer takes hand-overs (:func:`takes_handoff`): workers here hand it their
    #: completions (:class:`Handoff`); None: post them.
    handoff: Handoff | None = None

    def batch(self) -> Batch:
        """A new, empty batch of writes for this store."""
        return Batch(self)

    async def close(self) -> None:
        """Release connections and threads; the store is unusable afterwards."""
        for close in reversed(self.closers):
            result = close()
            if hasattr(result, "__await__"):
                await result
        self.closers.clear()
