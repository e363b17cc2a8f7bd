"""How long another thread may keep the GIL from the event loop.

The coordinator runs its heavy steps, large decodes and encodes, and its SQLite calls
in threads (:mod:`dagq.offload`, :mod:`dagq.persistence`): pure Python that holds the
GIL until the interpreter asks it to let go, which it does every *switch interval*
(``sys.setswitchinterval``, 5 ms by default). The loop pays that wait not once per
wake-up but once per system call it makes meanwhile: each write to a pool process's
pipe, each ``select``, each call into the store hands the GIL to the busy thread, and
the loop waits a whole interval for it back. A loop iteration that dispatches a few
tasks while a 100,000-task step runs in a thread took 15-25 ms of wall time for about
1 ms of its own CPU.

So while a coordinator or a worker runs, the process's switch interval is at most
:data:`SWITCH_INTERVAL_S` (their ``switch_interval_s`` option; None leaves the
interpreter's alone): the loop waits a fifth as long at each hand-over. The cost is
only paid while two threads want the GIL at once — a forced switch every millisecond
instead of every five, a few microseconds each. A shorter interval an application
set itself is kept; the one from before is restored once the last holder ends.
"""

from __future__ import annotations

import sys

#: The longest stretch another thread holds the GIL while the loop waits for it.
SWITCH_INTERVAL_S = 0.001


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
