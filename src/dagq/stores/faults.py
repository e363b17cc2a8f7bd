"""Fault injection: fail, delay, hang or kill the process at the N-th storage call.

For crash-safety tests with real processes. A plan is a comma-separated list of
``OPERATION@N=ACTION`` (also read from the ``DAGQ_FAULTS`` environment variable by
:func:`dagq.stores.open_store`)::

    DAGQ_FAULTS="batch.commit@3=kill-after,queues.receive@2=fail,documents.put@1=delay:0.5"

``OPERATION`` is a storage operation as counted by :mod:`.counting`
(``documents.put``, ``queues.send``, ``queues.delete``, ``index.upsert``,
``batch.commit``, ...); ``N`` counts its calls in this process from 1. Actions:

* ``fail`` — the call raises StoreUnavailable (nothing is written);
* ``crash`` — the call raises RuntimeError, an error no store should ever raise (as
  a bug would; nothing is written);
* ``delay:S`` — the call waits S seconds, then runs;
* ``delay-after:S`` — the call runs, then its answer takes S seconds to come back (a
  slow network: the store has acted, the caller does not know yet);
* ``hang`` — the call never returns (until cancelled);
* ``kill`` — the process dies by SIGKILL before the call (nothing is written);
* ``kill-after`` — the call runs, then the process dies by SIGKILL (it is written,
  and whatever was to follow it is not).

``N+`` (as in ``queues.receive@3+=fail``) applies the action to call N and every
later one; ``N-M`` to calls N through M — an outage that ends.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from dagq.errors import StoreUnavailable, ValidationError
from dagq.stores import FAULTS_ENV
from dagq.stores.base import Store
from dagq.stores.intercepting import intercepted

log = logging.getLogger("dagq.faults")

_RULE = re.compile(
    r"(?P<operation>[a-z]+\.[a-z_]+)@(?P<call>[1-9][0-9]*)"
    r"(?:(?P<onwards>\+)|-(?P<last>[1-9][0-9]*))?="
    r"(?P<action>fail|crash|hang|kill|kill-after"
    r"|(?:delay|delay-after):(?P<seconds>[0-9]+(\.[0-9]+)?))"
)


@dataclass(frozen=True, slots=True)
class Fault:
    """One rule: do ``action`` at call ``call`` of ``operation`` (through call ``last``,
    or every later one if ``onwards``)."""

    operation: str
    call: int
    action: str
    onwards: bool = False
    seconds: float = 0.0
    last: int | None = None

    def applies(self, operation: str, call: int) -> bool:
        """Does this rule fire on call ``call`` of ``operation``?"""
        if operation != self.operation or call < self.call:
            return False
        return self.onwards or call <= (self.last or self.call)


def parse_faults(text: str) -> list[Fault]:
    """The rules of a plan; a malformed rule is a ValidationError naming it."""
    faults = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        match = _RULE.fullmatch(part)
        if match is None:
            raise ValidationError(
                f"{FAULTS_ENV}: {part!r} is not OPERATION@N=ACTION (e.g. batch.commit@3=kill; "
                "actions: fail, crash, hang, kill, kill-after, delay:SECONDS, "
                "delay-after:SECONDS; N+ for every call from N, N-M for calls N to M)"
            )
        action = match["action"]
        last = int(match["last"]) if match["last"] else None
        if last is not None and last < int(match["call"]):
            raise ValidationError(f"{FAULTS_ENV}: {part!r}: the range ends before it starts")
        faults.append(
            Fault(
                operation=match["operation"],
                call=int(match["call"]),
                action=action.partition(":")[0],
                onwards=bool(match["onwards"]),
                seconds=float(match["seconds"] or 0.0),
                last=last,
            )
        )
    return faults


def with_faults(store: Store, faults: list[Fault]) -> Store:
    """A view of ``store`` that injects ``faults``."""
    calls: Counter[str] = Counter()

    async def inject(
        operation: str, args: tuple[Any, ...], call: Callable[[], Awaitable[Any]]
    ) -> Any:
        calls[operation] += 1
        n = calls[operation]
        fired = [f for f in faults if f.applies(operation, n)]
        for fault in fired:
            log.warning("injected fault: %s call %d: %s", operation, n, fault.action)
            if fault.action == "fail":
                raise StoreUnavailable(f"injected fault: {operation} call {n} failed")
            if fault.action == "crash":
                raise RuntimeError(f"injected fault: {operation} call {n} crashed")
            if fault.action == "delay":
                await asyncio.sleep(fault.seconds)
            elif fault.action == "hang":
                await asyncio.Event().wait()
            elif fault.action == "kill":
                _die()
        result = await call()
        for fault in fired:
            if fault.action == "delay-after":
                await asyncio.sleep(fault.seconds)
        if any(f.action == "kill-after" for f in fired):
            _die()
        return result

    return intercepted(store, inject)


def _die() -> None:
    logging.shutdown()
    os.kill(os.getpid(), signal.SIGKILL)
