"""Keeping Python's cyclic garbage collector from stalling the event loop.

A collection walks every object of the generations it collects and holds the GIL
while it does, whichever thread triggered it: about half a microsecond an object
here. So what lives long and large is never in its sight, and the bursts that
large steps make are not collected while they are alive:

* A plan holds one task and one spec per task, as structs the collector does not
  track (``gc=False``: :class:`dagq.plan.PlanTask`, :class:`dagq.messages.TaskSpec`);
  a state is a few columns; its unconfirmed dispatches are a set of ints. A
  100,000-task workflow adds a few dozen objects to a full collection, not half a
  million (which took 100-260 ms). Per-task numbers are bytearrays and arrays
  (:func:`dagq.state.counters`), never lists: a collection visits each entry of a
  list it tracks (1.5-2.6 ms of CPU for four 100,000-int lists, at every full
  collection), an array's traversal only its type.
* :func:`young_only` — no automatic *full* collection while a heavy step runs, from
  its apply to its commit, nor while a large definition is decoded and compiled: the
  few hundred thousand objects a fan-out's step holds until its commit would make
  one 50-100 ms. Young collections go on, each over the few thousand objects
  allocated since the one before; what they promote is freed by reference counting
  when the step ends.

* :func:`settle` — once per process, when a coordinator starts: a full collection,
  then ``gc.freeze()`` of what survives it (the modules, classes and functions of
  the interpreter and its libraries, some 25,000 objects), so that later full
  collections walk only what the process allocated since (they took 15-25 ms).
  Bounded: it happens once, right after a collection (no garbage is frozen), and
  only a cycle among those start-up objects that dies later would never be freed.
  Freezing again later (as this module did after each large plan) would take
  everything alive at that moment out of the collector's reach, every time.

* :func:`exiting` — a ``dagq`` command's own process freezes what is alive as it ends,
  so that the interpreter's last collections do not walk every module, class and
  function once more only to leave them to the exit (~25-35 M instructions, 7 % of
  ``dagq status``). Only the finalizers of objects in cycles are not run at the exit.

* :func:`release` — reference counting frees a list's items when the list goes,
  all in the one bytecode that dropped it: 100,000 task messages took 10-20 ms of
  the GIL at once, wherever that happened (on the loop, or in a thread the loop
  then waited for). Large lists a step makes are emptied a chunk at a time instead,
  in a thread, so that the interpreter can switch threads between chunks.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

#: While full collections are held off: a generation-2 threshold never reached.
_NEVER = 2**30
#: How many items :func:`release` frees at a time (some 0.1 ms of the GIL).
RELEASE_CHUNK = 1000


class _Holds:
    """How many holds are under way, and the thresholds from before the first."""

    depth = 0
    thresholds: tuple[int, int, int] = (700, 10, 10)


class _Settled:
    done = False


def settle() -> None:
    """Collect, then freeze the survivors out of the collector's sight; once per process."""
    if _Settled.done:
        return
    _Settled.done = True
    gc.collect()
    gc.freeze()


def settle_late() -> None:
    """Modules imported after :func:`settle` (``dagq run``'s display, made once its run
    is under way): out of the collector's sight as well, else every later full
    collection walks their ~13,000 objects. After a collection of the younger
    generations; cycles already in the oldest are frozen with them (once, bounded)."""
    if not _Settled.done:
        return
    gc.collect(1)
    gc.freeze()


def exiting() -> None:
    """The process ends: what is alive is left to the exit, out of the collector's sight."""
    gc.freeze()


@contextmanager
def young_only(active: bool = True) -> Iterator[None]:
    """No automatic *full* collection inside (when ``active``); young ones go on.

    Young collections walk only what was allocated since the last one, a few
    thousand objects, so they stay short however large the step; a full one would
    walk everything the step holds at the time. Nestable: concurrent holds end when
    the last one does. (Turning collection off altogether, as this did before, let
    everything allocated meanwhile — by the step and by the workers on the loop —
    pile up for one long young collection afterwards: 45-80 ms.)
    """
    if not active:
        yield
        return
    if _Holds.depth == 0:
        _Holds.thresholds = gc.get_threshold()
        young, middle, _ = _Holds.thresholds
        gc.set_threshold(young, middle, _NEVER)
    _Holds.depth += 1
    try:
        yield
    finally:
        _Holds.depth -= 1
        if _Holds.depth == 0:
            gc.set_threshold(*_Holds.thresholds)


def release(*lists: list[Any]) -> None:
    """Empty each list a chunk at a time, freeing what only it held as it goes.

    Each chunk is one bytecode, so the GIL can pass to another thread (the event
    loop's) between chunks; one ``del`` of the whole list would hold it until every
    item was freed. Call it where the freeing may take long: in a thread.
    """
    for items in lists:
        while items:
            del items[-RELEASE_CHUNK:]
