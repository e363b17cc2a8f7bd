"""Keeping Python's cyclic garbage collector from stalling the event loop.

A full collection walks every object the collector tracks and holds the GIL while it
does, whichever thread triggered it: with a 100,000-task plan in memory (half a
million objects) each one took 100-260 ms, and the step of a large fan-out, which
allocates a few hundred thousand short-lived objects, triggered several. Two
measures, both for large workflows only:

* :func:`freeze` — once a large plan is built, everything alive moves to the
  collector's permanent generation (``gc.freeze``), so full collections stop walking
  it. Objects there are still freed by reference counting as usual; only a cycle
  among them would wait for :func:`gc.unfreeze`. Plans are acyclic.
* :func:`paused` — no automatic collection while a heavy step runs, from its apply
  to its commit, when its objects are garbage again (freed by reference counting).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


class _Pauses:
    """How many pauses are under way, and whether collection was on before the first."""

    depth = 0
    was_enabled = False


def freeze() -> None:
    """Move every object alive now out of the collector's sight (without walking them:
    a collection first would be the very pause this avoids)."""
    gc.freeze()


@contextmanager
def paused(active: bool = True) -> Iterator[None]:
    """No automatic collection inside (when ``active``); nestable, and concurrent
    pauses end when the last one does."""
    if not active:
        yield
        return
    if _Pauses.depth == 0:
        _Pauses.was_enabled = gc.isenabled()
        gc.disable()
    _Pauses.depth += 1
    try:
        yield
    finally:
        _Pauses.depth -= 1
        if _Pauses.depth == 0 and _Pauses.was_enabled:
            gc.enable()
