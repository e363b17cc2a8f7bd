"""Keeping Python's cyclic garbage collector from stalling the event loop.

A collection walks every object of the generations it collects and holds the GIL
while it does, whichever thread triggered it: about half a microsecond an object
here. So what lives long and large is never in its sight, and the bursts that
large steps make are not collected while they are alive:

* A plan holds one task and one spec per task, as structs the collector does not
  track (``gc=False``: :class:`dagq.plan.PlanTask`, :class:`dagq.messages.TaskSpec`);
  a state is a few columns; its unconfirmed dispatches are a set of ints. A
  100,000-task workflow adds a few dozen objects to a full collection, not half a
  million (which took 100-260 ms).
* :func:`paused` — no automatic collection while a heavy step runs, from its apply to
  its commit, nor while a large definition is decoded and compiled: a few hundred
  thousand objects that live until the step ends would otherwise be walked by young
  collections again and again and promoted, and would bring on full ones. They are
  freed by reference counting when the step ends, so the first collection after a
  pause finds little (only what the step left alive, which must stay small).

No ``gc.freeze()``: it would move *every* object alive at that moment out of the
collector's reach for good, so cyclic garbage alive then (or becoming garbage later)
would never be collected.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


class _Pauses:
    """How many pauses are under way, and whether collection was on before the first."""

    depth = 0
    was_enabled = False


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
