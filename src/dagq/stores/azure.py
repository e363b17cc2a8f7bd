"""The azure backend: documents, dead letters and leases in Blob Storage, queues in
Queue Storage, the index in Table Storage — one container, one table and a few
queues per store prefix.

``open_store("azure://ACCOUNT/PREFIX")`` opens it without touching the network: the
async SDK clients are built, and the container and table created, on first use (see
:mod:`.azure_service`); sign-in is chosen as :mod:`.azure_auth` describes. At that
first use the index's layout marker is read, once (:mod:`.azure_layout`): a store of
another layout is refused. The modules: :mod:`.azure_documents`, :mod:`.azure_queues`
(with :mod:`.azure_messages` and :mod:`.azure_dead_letters`), :mod:`.azure_index`,
:mod:`.azure_leases`.

Batches: Azure has no transactions across blobs, queues and tables, so
:class:`PhasedCommitter` commits a batch in phases, concurrently inside each:

0. conditions that later writes depend on are checked (one HEAD each), so a stale
   one stops the batch before it writes anything the same calls made one by one
   would not have;
1. plain document puts (history, state parts, task inputs: what the state may refer to);
2. conditional puts (the state headers: the commit points);
3. sends (task messages, which may refer to inputs);
4. document deletes, acks and index rows (rows that stay in their partition grouped
   into one entity group transaction per partition, :meth:`.AzureIndex.upsert_many`).

A failure raises (ConflictError for a failed condition) and starts no later phase.
It is not atomic: a crash or a failure inside a phase can leave that phase half done.
dagq copes, as with any non-transactional store: the coordinator falls back to one
workflow at a time and applying an event twice is a no-op; unsent task messages are
re-sent by its sweeps.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from typing import cast

from dagq.errors import ConflictError
from dagq.stores.azure_auth import parse_azure_url, resolve_auth
from dagq.stores.azure_dead_letters import DeadLetterBlobs
from dagq.stores.azure_documents import AzureDocuments
from dagq.stores.azure_index import AzureIndex
from dagq.stores.azure_layout import check_layout
from dagq.stores.azure_leases import AzureLeases
from dagq.stores.azure_queues import AzureQueues
from dagq.stores.azure_service import DEFAULT_CONCURRENCY, AzureService
from dagq.stores.base import (
    DEFAULT_MAX_DELIVERIES,
    AckOp,
    BatchOp,
    Clock,
    DeleteOp,
    IndexRow,
    PutOp,
    SendOp,
    Store,
    UpsertOp,
    commit_in_order,
)
from dagq.stores.changes import ChangeFeed
from dagq.stores.common import Wakeups, check_batch, check_max_deliveries

__all__ = ["PhasedCommitter", "open_azure_store"]

# Sends from any store on the same account and prefix in this process wake its waiters.
_WAKEUPS: dict[tuple[str, str], Wakeups] = {}
_WAKEUPS_LOCK = threading.Lock()


def open_azure_store(
    url: str,
    *,
    clock: Clock = time.time,
    max_deliveries: int = DEFAULT_MAX_DELIVERIES,
    create: bool = True,
    environ: Mapping[str, str] | None = None,
    concurrency: int = DEFAULT_CONCURRENCY,
) -> Store:
    """Open the store an ``azure://ACCOUNT/PREFIX`` URL names (no network until used).

    ``create=False`` refuses, at first use, a prefix whose container does not exist.
    ``environ`` (default ``os.environ``) supplies the sign-in variables.
    """
    check_max_deliveries(max_deliveries)
    target = parse_azure_url(url)
    auth = resolve_auth(target.account, os.environ if environ is None else environ)
    service = AzureService(
        target, auth, create=create, concurrency=concurrency, on_open=check_layout
    )
    with _WAKEUPS_LOCK:
        wakeups = _WAKEUPS.setdefault((auth.endpoints.queue, target.prefix), Wakeups())
    documents = AzureDocuments(service)
    queues = AzureQueues(service, DeadLetterBlobs(service), wakeups, clock, max_deliveries)
    changes = ChangeFeed()  # hears this process only: streams poll (dagq.server.pacing)
    store = Store(
        url=target.url,
        documents=documents,
        queues=queues,
        index=AzureIndex(service, changes),
        changes=changes,
        leases=AzureLeases(service, clock),
        closers=[service.close],
        transactions=service.transactions,
    )
    store.committer = PhasedCommitter(store, documents)
    return store


class PhasedCommitter:
    """Commits a batch in the phases the module docstring lists."""

    #: Acks (phase 4) go only after the states (phase 2) are written: a coordinator
    #: may take completions handed over in its process (:func:`.base.takes_handoff`).
    acks_after_states = True

    def __init__(self, store: Store, documents: AzureDocuments) -> None:
        self._store = store
        self._documents = documents

    def bound_to(self, store: Store) -> PhasedCommitter:
        """The same committer writing through ``store`` (a wrapper of this one's)."""
        return PhasedCommitter(store, self._documents)

    async def __call__(self, ops: Sequence[BatchOp]) -> list[str]:
        check_batch(ops)
        if _writes_twice(ops):  # phases would reorder writes to one key: keep the order
            return await commit_in_order(self._store, ops)
        store = self._store
        puts = [op for op in ops if isinstance(op, PutOp)]
        etags = [""] * len(puts)

        async def put(slot: int, op: PutOp) -> None:
            etags[slot] = await store.documents.put(
                op.key, op.data, if_match=op.if_match, if_none_match=op.if_none_match
            )

        await _phase(
            self._documents.check(op.key, if_match=op.if_match, if_none_match=op.if_none_match)
            for op in _checked_first(ops)
        )
        await _phase(put(slot, op) for slot, op in enumerate(puts) if not _conditional(op))
        await _phase(put(slot, op) for slot, op in enumerate(puts) if _conditional(op))
        await _phase(
            store.queues.send(op.queue, op.messages) for op in ops if isinstance(op, SendOp)
        )
        rows = [op.row for op in ops if isinstance(op, UpsertOp)]
        await _phase(
            [
                *(_finish(store, op) for op in ops if isinstance(op, DeleteOp | AckOp)),
                *_upserts(store, rows),
            ]
        )
        return etags


def _conditional(op: PutOp) -> bool:
    return op.if_match is not None or op.if_none_match


def _checked_first(ops: Sequence[BatchOp]) -> list[PutOp]:
    """Conditional puts followed (in batch order) by another put: the phases would
    write that put no later than them, so their condition is checked beforehand."""
    checked: list[PutOp] = []
    later_put = False
    for op in reversed(ops):
        if isinstance(op, PutOp):
            if _conditional(op) and later_put:
                checked.append(op)
            later_put = True
    return checked


def _writes_twice(ops: Sequence[BatchOp]) -> bool:
    keys = [op.key for op in ops if isinstance(op, PutOp | DeleteOp)]
    rows = [op.row.id for op in ops if isinstance(op, UpsertOp)]
    return len(set(keys)) < len(keys) or len(set(rows)) < len(rows)


def _finish(store: Store, op: DeleteOp | AckOp) -> Awaitable[object]:
    if isinstance(op, DeleteOp):
        return store.documents.delete(op.key)
    return _ack(store, op)


def _upserts(store: Store, rows: list[IndexRow]) -> list[Awaitable[object]]:
    """One row through ``index.upsert``; several through the azure index's
    ``upsert_many``, reached through ``store`` so that a wrapping view (counting, fault
    injection) still sees the call."""
    if len(rows) < 2:
        return [store.index.upsert(row) for row in rows]
    return [cast(AzureIndex, store.index).upsert_many(rows)]


async def _ack(store: Store, op: AckOp) -> None:
    op.deleted.append(await store.queues.delete(op.queue, op.receipts))


async def _phase(calls: Iterable[Awaitable[object]]) -> None:
    """Run one phase's calls concurrently; once all are done, raise the first failure
    (a conflict before anything else)."""
    pending = list(calls)
    if not pending:
        return
    if len(pending) == 1:
        await pending[0]
        return
    results = await asyncio.gather(*pending, return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        raise next((e for e in errors if isinstance(e, ConflictError)), errors[0])
