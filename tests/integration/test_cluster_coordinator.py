"""``dagq coordinator``: one per store (by lease), logs its pace, stops cleanly.

Each test runs real ``dagq coordinator`` processes on one scratch store (a SQLite
file, and again a PostgreSQL schema) and looks at the lease in the store itself.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from dagq.stores.base import Lease, Store
from tests.conftest import postgres_url
from tests.integration.cli_harness import DagqCli, wait_for_file, wait_until

pytestmark = pytest.mark.timeout(30)

PACE_LINE = re.compile(
    r"(?P<events>[\d.]+) events/s, (?P<dispatched>[\d.]+) tasks dispatched/s, "
    r"\d+ active workflow\(s\), \d+ event message\(s\) waiting \(oldest \d+s\)"
)


@pytest.fixture(params=["sqlite", "postgres"])
def cli(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[DagqCli]:
    """The command in a scratch directory, on a sqlite file or a PostgreSQL schema."""
    with DagqCli(tmp_path) as cli:
        if request.param == "postgres":
            cli.store_url = postgres_url(request.getfixturevalue("postgres_cluster"))
        yield cli


def test_second_coordinator_is_refused_naming_the_holder_and_the_lease_age(
    cli: DagqCli,
) -> None:
    first = cli.start_coordinator()

    second = cli.run("coordinator", timeout_s=15)

    assert second.code == 2, second.output
    assert second.stderr.startswith("error: another coordinator serves this store: ")
    assert f":{first.pid}:" in second.stderr  # the holder is host:pid:token
    assert re.search(r"acquired \d+s ago", second.stderr), second.stderr
    assert "--break-lease" in second.stderr
    assert "Traceback" not in second.output
    assert cli.holds_lease(first)


def test_break_lease_takes_the_lease_from_a_running_coordinator(cli: DagqCli) -> None:
    cli.start_coordinator()

    second = cli.start_coordinator("--break-lease")

    assert cli.holds_lease(second)


def test_coordinator_takes_over_the_lease_of_a_killed_holder_on_this_host(cli: DagqCli) -> None:
    first = cli.start_coordinator()
    first.stop(signal.SIGKILL)
    assert cli.lease() is not None  # a killed holder cannot release; the lease lives on

    second = cli.start_coordinator()

    assert cli.holds_lease(second)
    assert "no longer running" in second.stderr()


def test_coordinator_takes_over_an_expired_lease_of_another_host(cli: DagqCli) -> None:
    async def hold(store: Store) -> Lease:
        # Held for as long as the refused coordinator may take to start on a loaded
        # machine (4 s was not always enough: it then took the lease and ran).
        return await store.leases.acquire("coordinator", "elsewhere:4242:feed", 60.0)

    held = cli.with_store(hold)
    refused = cli.run("coordinator", timeout_s=20)
    assert refused.code == 2, refused.output
    assert "elsewhere:4242:feed" in refused.stderr
    # The other host's last renewal is a short one, and it never renews again.
    cli.with_store(lambda store: store.leases.renew(held, 1.0))
    wait_until(lambda: cli.lease() is None, timeout_s=10, what="the lease to expire")

    taker = cli.start_coordinator()

    assert cli.holds_lease(taker)


def test_coordinator_logs_throughput_and_backlog_every_interval(cli: DagqCli) -> None:
    coordinator = cli.start_coordinator("--log-interval", "0.2")
    cli.start_worker("-q", "default")
    cli.submit_here("two", {"name": "two", "tasks": [{"name": "a", "cmd": "true"}]})
    assert cli.wait_for_end("two", timeout_s=10) == "completed"

    def pace() -> list[re.Match[str]]:
        found = list(PACE_LINE.finditer(coordinator.stderr()))
        # The submit's event is counted as its step begins, the task it dispatches once
        # the step's commit is in: a line may fall between the two (a slow commit).
        counted = any(float(m["events"]) > 0 for m in found)
        dispatched = any(float(m["dispatched"]) > 0 for m in found)
        return found if len(found) >= 3 and counted and dispatched else []

    wait_until(pace, timeout_s=20, what="three pace lines, the work counted in them")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_signal_stops_the_coordinator_with_exit_0_and_releases_the_lease(
    cli: DagqCli, sig: signal.Signals
) -> None:
    coordinator = cli.start_coordinator()

    stopped = coordinator.stop(sig)

    assert stopped.code == 0, stopped.output
    assert "lease released" in stopped.stderr
    assert "Traceback" not in stopped.output
    assert cli.lease() is None


def test_a_new_coordinator_finishes_the_workflow_a_stopped_one_left(cli: DagqCli) -> None:
    first = cli.start_coordinator()
    cli.start_worker("-q", "default")
    cli.submit_here(
        "chain",
        {
            "name": "chain",
            "tasks": [
                {"name": "a", "cmd": f"touch a.started; {wait_for_file('a.go')}"},
                {"name": "b", "depends_on": ["a"], "cmd": "touch b.ran"},
            ],
        },
    )
    wait_until((cli.workdir / "a.started").exists, timeout_s=10, what="'a' to start")
    assert first.stop(signal.SIGTERM).code == 0
    (cli.workdir / "a.go").touch()  # 'a' ends while no coordinator runs

    cli.start_coordinator()

    assert cli.wait_for_end("chain", timeout_s=10) == "completed"
    assert (cli.workdir / "b.ran").exists()
