"""A store wrapper that counts every storage operation by primitive and kind.

``counted(store)`` returns a store whose four primitives forward to the original and
tally each call (``documents.put``, ``queues.receive``, ...) and, for batch calls, the
number of items (messages sent, receipts deleted). Used by the benchmark and by stats
lines to report the storage cost per task.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from dagq.stores.base import BatchOp, Committer, Store


class _Counted:
    """Forwards every coroutine method of ``inner``, counting calls as ``prefix.name``."""

    def __init__(self, inner: Any, prefix: str, counts: Counter[str]) -> None:
        self._inner = inner
        self._prefix = prefix
        self._counts = counts

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._inner, name)
        if not callable(attribute) or name == "wait":
            return attribute
        key = f"{self._prefix}.{name}"
        counts = self._counts

        async def counted(*args: Any, **kwargs: Any) -> Any:
            counts[key] += 1
            for value in args[1:2]:  # the batch argument of send / delete
                if isinstance(value, Sequence) and not isinstance(value, str | bytes):
                    counts[f"{key}:items"] += len(value)
            return await attribute(*args, **kwargs)

        return counted


def _counted_committer(committer: Committer, counts: Counter[str]) -> Committer:
    async def commit(ops: Sequence[BatchOp]) -> list[str]:
        counts["batch.commit"] += 1
        counts["batch.commit:items"] += len(ops)
        return await committer(ops)

    return commit


def counted(store: Store) -> tuple[Store, Counter[str]]:
    """A counting view of ``store`` and the live counter it fills.

    A batch committed natively (one transaction) counts as one ``batch.commit``; one
    committed in order counts each operation under its primitive.
    """
    counts: Counter[str] = Counter()
    view = Store(
        url=store.url,
        documents=_Counted(store.documents, "documents", counts),
        queues=_Counted(store.queues, "queues", counts),
        index=_Counted(store.index, "index", counts),
        leases=_Counted(store.leases, "leases", counts),
        closers=[store.close],
        committer=(
            None if store.committer is None else _counted_committer(store.committer, counts)
        ),
        transactions=store.transactions,  # what the backend itself counts (azure)
    )
    return view, counts
