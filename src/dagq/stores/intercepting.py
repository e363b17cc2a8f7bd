"""A store wrapper that runs every storage operation through a hook.

``intercepted(store, hook)`` returns a store whose four primitives forward to the
original, each call going through ``hook(operation, args, call)`` — ``operation`` is
``documents.put``, ``queues.receive``, ..., or ``batch.commit`` for a natively
committed batch; ``call()`` performs it. Counting (:mod:`.counting`) and fault
injection (:mod:`.faults`) are hooks. ``queues.wait`` (a local sleep) is not hooked.
A native committer that writes through the primitives (``bound_to``, as Azure's
phased one does) is re-bound to the view, so its writes are hooked one by one too.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from dagq.stores.base import BatchOp, Committer, Store, wrapped_committer

#: ``hook(operation, args, call)``: perform ``call()`` (or not) and return its result.
Hook = Callable[[str, tuple[Any, ...], Callable[[], Awaitable[Any]]], Awaitable[Any]]


class _Intercepted:
    """Forwards every method of ``inner``; coroutine calls go through the hook."""

    def __init__(self, inner: Any, prefix: str, hook: Hook) -> None:
        self._inner = inner
        self._prefix = prefix
        self._hook = hook

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._inner, name)
        if not callable(attribute) or name == "wait":
            return attribute
        operation = f"{self._prefix}.{name}"
        hook = self._hook

        async def intercepted(*args: Any, **kwargs: Any) -> Any:
            return await hook(operation, args, lambda: attribute(*args, **kwargs))

        return intercepted


def _intercepted_committer(committer: Committer, hook: Hook, *, whole: bool) -> Committer:
    async def commit(ops: Sequence[BatchOp]) -> list[str]:
        result: list[str] = await hook("batch.commit", (ops,), lambda: committer(ops))
        return result

    # Hooked or not, the inner committer writes in the same order; it is all or nothing
    # only for a hook that calls it whole (one may inject faults between a submit's writes).
    return wrapped_committer(committer, commit, atomic=whole)


def intercepted(store: Store, hook: Hook, *, rebind: bool = True, whole: bool = False) -> Store:
    """A view of ``store`` whose every operation goes through ``hook``.

    A batch committed natively (one transaction) is one ``batch.commit``; one committed
    in order is each operation under its primitive. With ``rebind``, a native committer
    that writes through the primitives has those writes hooked too. With ``whole`` (the
    hook calls each commit whole, or not at all), an all-or-nothing committer stays one.
    """
    view = Store(
        url=store.url,
        documents=_Intercepted(store.documents, "documents", hook),
        queues=_Intercepted(store.queues, "queues", hook),
        index=_Intercepted(store.index, "index", hook),
        leases=_Intercepted(store.leases, "leases", hook),
        closers=[store.close],
        transactions=store.transactions,  # what the backend itself counts (azure)
        changes=store.changes,
    )
    committer = store.committer
    if committer is not None:
        bound_to = getattr(committer, "bound_to", None) if rebind else None
        view.committer = _intercepted_committer(
            committer if bound_to is None else bound_to(view), hook, whole=whole
        )
    return view
