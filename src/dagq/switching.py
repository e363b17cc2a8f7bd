"""How long another thread may keep the GIL from the event loop: an option.

The coordinator runs its heavy steps, large decodes and encodes, and its SQLite calls
in threads (:mod:`dagq.offload`, :mod:`dagq.persistence`): pure Python that holds the
GIL until the interpreter asks it to let go, which it does every *switch interval*
(``sys.setswitchinterval``, 5 ms by default). The loop pays that wait not once per
wake-up but at each system call it makes meanwhile: a write to a pool process's pipe,
a read of its reply, a ``select`` hand the GIL to the busy thread, and the loop waits
up to an interval for it back (``python -m bench.gil_handover``; sampled during a
100,000-task run's stalls, the loop thread sat mostly in just such calls).

With ``switch_interval_s`` (:class:`~dagq.coordinator.CoordinatorOptions`,
:class:`~dagq.worker.WorkerOptions`) the process's interval is at most that while a
coordinator or a worker runs: the loop waits less at each hand-over, for more forced
switches between threads (up to ~5 % more CPU for the process in a 100,000-task run
at 1 ms). None (the default) leaves the interpreter's interval alone, as no lag gain
showed through a loaded machine's noise (bench/README.md, "Event-loop lag"). A
shorter interval an application set itself is kept; the one from before is restored
once the last holder ends.
"""

from __future__ import annotations

import sys


class _Held:
    """How many holds are under way, and the interval from before the first."""

    depth = 0
    before = 0.005


def check(interval_s: float | None) -> None:
    """Raise ValueError unless ``interval_s`` is a positive number of seconds or None."""
    if interval_s is not None and not interval_s > 0:
        raise ValueError(
            f"switch_interval_s must be a positive number of seconds or None, not {interval_s!r}"
        )


def lower(interval_s: float | None) -> None:
    """From now on the switch interval is at most ``interval_s`` (None: unchanged),
    until the matching :func:`restore`.

    Nestable (a coordinator and a worker in one process): the interval from before the
    first comes back at the last :func:`restore`.
    """
    if interval_s is None:
        return
    if _Held.depth == 0:
        _Held.before = sys.getswitchinterval()
    _Held.depth += 1
    sys.setswitchinterval(min(interval_s, sys.getswitchinterval()))


def restore(interval_s: float | None) -> None:
    """Ends a :func:`lower` of the same ``interval_s``."""
    if interval_s is None or _Held.depth == 0:
        return
    _Held.depth -= 1
    if _Held.depth == 0:
        sys.setswitchinterval(_Held.before)
