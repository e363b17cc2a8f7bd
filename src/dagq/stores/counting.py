"""A store wrapper that counts every storage operation by primitive and kind.

``counted(store)`` returns a store whose four primitives forward to the original and
tally each call (``documents.put``, ``queues.receive``, ...) and, for batch calls, the
number of items (messages sent, receipts deleted, operations committed). Used by the
benchmark and by stats lines to report the storage cost per task.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from dagq.stores.base import Store
from dagq.stores.intercepting import intercepted


def counted(store: Store) -> tuple[Store, Counter[str]]:
    """A counting view of ``store`` and the live counter it fills.

    A batch committed natively (one transaction) counts as one ``batch.commit``; one
    committed in order counts each operation under its primitive.
    """
    counts: Counter[str] = Counter()

    async def count(
        operation: str, args: tuple[Any, ...], call: Callable[[], Awaitable[Any]]
    ) -> Any:
        counts[operation] += 1
        items = args[0] if operation == "batch.commit" else (args[1] if len(args) > 1 else None)
        if isinstance(items, Sequence) and not isinstance(items, str | bytes):
            counts[f"{operation}:items"] += len(items)
        return await call()

    # A batch counts once: its writes inside are not counted again. Counting calls each
    # commit whole: a committer that is all or nothing stays so (submits in one batch,
    # the hand-off).
    return intercepted(store, count, rebind=False, whole=True), counts
