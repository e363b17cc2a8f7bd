"""Review26: the span forwarder's bound on waiting spans while its helper is stuck."""

from __future__ import annotations

import os
import signal
import time

import pytest

from dagq.observability import forwarding
from dagq.observability.tracing import Record

pytestmark = pytest.mark.timeout(60)


def _record(n: int) -> Record:
    return ("span", 1, n, None, 1, {"pad": "x" * 200}, [], 0, 1, None)


def test_spans_waiting_for_a_stuck_helper_stay_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The helper stops reading (stopped, starved): the thread sending to it blocks on
    the full pipe. Spans made meanwhile must still be bounded by MAX_PENDING (the
    oldest or newest dropped), not pile up in memory without end."""
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    monkeypatch.setattr(forwarding, "MAX_PENDING", 1000)
    forwarder = forwarding.Forwarder("review26")
    forwarder.start()
    helper = forwarder._helper
    assert helper is not None
    os.kill(helper.pid, signal.SIGSTOP)
    try:
        for n in range(3000):  # more than a pipe holds: the sending thread blocks
            forwarder.put(_record(n))
        time.sleep(0.75)
        for n in range(5000):
            forwarder.put(_record(n))
        assert len(forwarder._pending) <= forwarding.MAX_PENDING
    finally:
        os.kill(helper.pid, signal.SIGKILL)
        helper.wait()
        forwarder._closing = True
        forwarder._wake.set()
