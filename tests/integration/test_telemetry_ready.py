"""A ``dagq coordinator`` and a ``dagq worker`` tracing by their OTEL_* environment say
they are ready (take the lease, register) only once their span helper is up — its
imports done — so that start-up is not paid during their first work; and a helper that
cannot come up, or a collector nobody listens on, never keeps them from starting.

The helper's start is held at will here: a ``sitecustomize`` module on the processes'
``PYTHONPATH`` makes the span helper (``python -m dagq.observability.exporting``, and it
alone) wait for a file before it starts, or end at once."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dagq.registry import live_workers
from tests.integration.cli_harness import DagqCli, Started, wait_until
from tests.integration.test_observability_cluster import _free_port

pytestmark = pytest.mark.timeout(90)

_GATE = """
import os, sys, time
if "dagq.observability.exporting" in sys.orig_argv:  # the span helper, nothing else
    here = os.path.dirname(os.path.abspath(__file__))
    if os.path.exists(os.path.join(here, "fail")):
        os._exit(3)
    open(os.path.join(here, f"held-{os.getpid()}"), "w").close()
    while not os.path.exists(os.path.join(here, "open")):
        time.sleep(0.01)
"""

#: How long the helpers are held: a process that did not wait for its helper takes its
#: lease or registers well within it (in a fraction of a second).
HOLD_S = 2.0


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[DagqCli]:
    gate = tmp_path / "gate"
    gate.mkdir()
    (gate / "sitecustomize.py").write_text(_GATE)
    with DagqCli(tmp_path) as harness:
        harness.env["PYTHONPATH"] = str(gate)
        # Nothing listens there: nothing may wait for it.
        harness.env["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{_free_port()}"
        yield harness


def _registered(cli: DagqCli) -> int:
    return len(cli.with_store(lambda store: live_workers(store.documents, now=time.time())))


def _alive(*processes: Started) -> None:
    for started in processes:
        assert started.process.poll() is None, started.stderr()


def test_a_coordinator_and_a_worker_are_ready_only_once_their_span_helpers_are_up(
    cli: DagqCli,
) -> None:
    gate = cli.workdir / "gate"
    coordinator = cli.start("coordinator", "--metrics-port", str(_free_port()))
    worker = cli.start("worker", "--metrics-port", str(_free_port()))
    wait_until(
        lambda: len(list(gate.glob("held-*"))) == 2 or None,
        timeout_s=30,
        what="both span helpers to be held at their start",
    )
    held_until = time.monotonic() + HOLD_S
    while time.monotonic() < held_until:
        _alive(coordinator, worker)
        assert cli.lease() is None, "the coordinator took its lease before its helper was up"
        assert _registered(cli) == 0, "the worker registered before its helper was up"
        assert " serving " not in worker.stderr()
        time.sleep(0.05)
    (gate / "open").touch()
    wait_until(lambda: cli.holds_lease(coordinator), timeout_s=30, what="the lease")
    wait_until(lambda: _registered(cli) == 1, timeout_s=30, what="the worker's registration")
    _alive(coordinator, worker)
    for started in (coordinator, worker):
        assert started.stop().code == 0
        assert "span exporter is not up" not in started.stderr()


def test_a_span_helper_that_cannot_start_keeps_nothing_from_starting(cli: DagqCli) -> None:
    (cli.workdir / "gate" / "fail").touch()
    coordinator = cli.start_coordinator()
    worker = cli.start_worker()
    wait_until(lambda: _registered(cli) == 1, timeout_s=30, what="the worker's registration")
    for started in (coordinator, worker):
        assert "span exporter is not up (it ended" in started.stderr()
        assert started.stop().code == 0
