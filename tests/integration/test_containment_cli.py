"""The coordinator's containment, on real processes and one scratch SQLite store.

* a damaged state document quarantines its workflow alone: the others complete, the
  coordinator stays up (also across a restart), doctor lists it, release after the fix
  finishes it (case 3);
* a lease keeper that dies or hangs stops ``dagq coordinator`` with exit 1 (case 8);
* ``--break-lease`` while the old coordinator still runs loses no completion (case 16);
* two ``dagq run`` on one store both finish; a killed, unreaped holder is taken over
  at once (case 9);
* ``dagq purge --force`` of a running workflow stops its task and the coordinator
  forgets it (case 12).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dagq import keys
from dagq.stores.base import Store
from tests.integration.cli_harness import (
    DagqCli,
    lines,
    pid_alive,
    read_pids,
    wait_for_file,
    wait_until,
)

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[DagqCli]:
    with DagqCli(tmp_path) as cli:
        yield cli


def damage_state(cli: DagqCli, workflow_id: str, data: bytes) -> bytes:
    """Overwrite a workflow's state document; returns what it held."""

    async def swap(store: Store) -> bytes:
        doc = await store.documents.get(keys.state(workflow_id))
        assert doc is not None
        await store.documents.put(keys.state(workflow_id), data)
        return doc.data

    return cli.with_store(swap)


def quarantined(cli: DagqCli, workflow_id: str) -> bool:
    return bool(cli.json("status", workflow_id)["status"] == "quarantined")


def test_a_damaged_state_quarantines_one_workflow_and_the_coordinator_stays_up(
    cli: DagqCli,
) -> None:
    chain = {
        "tasks": [{"name": "a", "cmd": "true"}, {"name": "b", "depends_on": ["a"], "cmd": "true"}]
    }
    cli.submit_here("victim", {"name": "victim", **chain})
    cli.submit_here("healthy", {"name": "healthy", **chain})
    original = damage_state(cli, "victim", b"zthis is not a state document")

    coordinator = cli.start_coordinator()
    cli.start_worker("-q", "default")

    assert cli.wait_for_end("healthy", timeout_s=30) == "completed"
    wait_until(lambda: quarantined(cli, "victim"), timeout_s=20, what="the quarantine")
    assert coordinator.process.poll() is None
    shown = cli.run("status", "victim")
    assert shown.code == 0 and "quarantined" in shown.stdout
    assert "dagq quarantine release victim" in shown.stdout
    doctor = cli.run("doctor")
    assert doctor.code == 1
    assert "workflow victim" in doctor.stdout
    assert "dagq quarantine release victim" in doctor.stdout
    assert [row["id"] for row in cli.json("list", "--status", "quarantined")] == ["victim"]
    [held] = cli.json("quarantine", "list")
    assert held["id"] == "victim" and held["step"] == "load"

    # A restart no longer dies on it: the coordinator comes up and serves the rest.
    assert coordinator.stop(signal.SIGTERM).code == 0
    restarted = cli.start_coordinator()
    cli.submit_here("later", {"name": "later", **chain})
    assert cli.wait_for_end("later", timeout_s=30) == "completed"
    assert restarted.process.poll() is None
    assert "Traceback" not in restarted.stderr()

    # The cause is fixed: released, it runs from its kept events.
    damage_state(cli, "victim", original)
    released = cli.run("quarantine", "release", "victim")
    assert released.code == 0, released.output
    assert cli.wait_for_end("victim", timeout_s=30) == "completed"
    assert cli.json("quarantine", "list") == []


def test_dagq_run_of_a_healthy_workflow_beside_a_damaged_one_completes(cli: DagqCli) -> None:
    cli.submit_here("victim", {"name": "victim", "tasks": [{"name": "a", "cmd": "true"}]})
    damage_state(cli, "victim", b"r\xc1\xc1")
    workflow = cli.workflow("ok.yaml", {"name": "ok", "tasks": [{"name": "a", "cmd": "true"}]})

    ran = cli.run("run", workflow, "--id", "ok", timeout_s=60)

    assert ran.code == 0, ran.output
    assert "Traceback" not in ran.output
    doctor = cli.run("doctor")
    assert "workflow victim" in doctor.stdout and "quarantined" in doctor.stdout


def test_a_coordinator_whose_lease_renewal_hangs_exits_1_before_the_lease_lapses(
    cli: DagqCli,
) -> None:
    cli.env["DAGQ_FAULTS"] = "leases.renew@1+=hang"
    coordinator = cli.start("coordinator", "--lease-ttl", "2")

    stopped = coordinator.wait(30)

    assert stopped.code == 1, stopped.output
    assert "may have expired" in stopped.stderr
    assert "Traceback" not in stopped.output


def test_a_coordinator_whose_lease_keeper_dies_exits_1_naming_it(cli: DagqCli) -> None:
    script = (
        "import sys\n"
        "import dagq.stores.sqlite as sqlite\n"
        "async def renew(self, lease, ttl_s):\n"
        "    raise RuntimeError('a bug in the renewal')\n"
        "sqlite.SqliteLeases.renew = renew\n"
        "from dagq.cli import main\n"
        "sys.argv = ['dagq', *sys.argv[1:]]\n"
        "main()\n"
    )
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            script,
            "coordinator",
            "--store",
            cli.store_url,
            "--lease-ttl",
            "1.5",
        ],
        cwd=cli.workdir,
        env=cli.env,
        capture_output=True,
        timeout=60,
        check=False,
    )

    stderr = done.stderr.decode()
    assert done.returncode == 1, stderr
    assert "coordinator stopped" in stderr
    assert "'lease-keeper' failed: RuntimeError: a bug in the renewal" in stderr


def test_break_lease_while_the_old_coordinator_runs_loses_no_completion(cli: DagqCli) -> None:
    # Both coordinators poll the completion queue for a while: the old one learns of
    # the takeover only at its next renewal (20s away) or, now, at its first fenced
    # write. The chains' 'b' tasks end one by one, each while both poll idly, so
    # either may take each completion; one the other had sent ('b' after 'a') used to
    # be dropped as stale and acknowledged, leaving its chain 'running' for ever.
    chains = [f"c{n}" for n in range(6)]
    old = cli.start_coordinator("--lease-ttl", "60")
    cli.start_worker("-q", "default", "-c", "8")
    for n, name in enumerate(chains):
        cli.submit_here(
            name,
            {
                "name": name,
                "tasks": [
                    {"name": "a", "cmd": f"touch {name}.started; {wait_for_file('go')}"},
                    {"name": "b", "depends_on": ["a"], "cmd": f"sleep {1 + 1.2 * n:.1f}"},
                    {"name": "c", "depends_on": ["b"], "cmd": "true"},
                ],
            },
        )
    wait_until(
        lambda: all((cli.workdir / f"{n}.started").exists() for n in chains),
        timeout_s=30,
        what="every chain's first task to start",
    )

    new = cli.start_coordinator("--break-lease")
    (cli.workdir / "go").touch()

    for name in chains:
        assert cli.wait_for_end(name, timeout_s=60) == "completed"
        assert set(cli.statuses(name).values()) == {"completed"}
    ended = old.wait(30)  # it stopped at its first fenced write, never silently
    assert ended.code == 1, ended.output
    assert "lease" in ended.stderr
    assert new.process.poll() is None


def test_two_dagq_run_on_one_store_both_finish(cli: DagqCli) -> None:
    first_file = cli.workflow(
        "first.yaml",
        {"name": "first", "tasks": [{"name": "a", "cmd": wait_for_file("first.go", timeout_s=40)}]},
    )
    second_file = cli.workflow(
        "second.yaml",
        {
            "name": "second",
            "tasks": [
                {"name": "a", "cmd": "touch second.a"},
                {"name": "b", "depends_on": ["a"], "cmd": wait_for_file("second.go", timeout_s=40)},
            ],
        },
    )
    first = cli.start("run", first_file, "--id", "first", "--quiet")
    wait_until(lambda: cli.holds_lease(first), timeout_s=20, what="the first run to coordinate")
    second = cli.start("run", second_file, "--id", "second", "--quiet")
    wait_until((cli.workdir / "second.a").exists, timeout_s=20, what="the second run's first task")

    (cli.workdir / "first.go").touch()
    assert first.wait(30).code == 0  # its coordinator leaves; the second must take over
    (cli.workdir / "second.go").touch()

    finished = second.wait(40)
    assert finished.code == 0, finished.output
    assert cli.workflow_status("second") == "completed"


def test_dagq_run_takes_over_at_once_from_a_killed_run_not_yet_reaped(cli: DagqCli) -> None:
    held = cli.workflow(
        "held.yaml",
        {"name": "held", "tasks": [{"name": "a", "cmd": wait_for_file("never", timeout_s=20)}]},
    )
    quick = cli.workflow("quick.yaml", {"name": "quick", "tasks": [{"name": "a", "cmd": "true"}]})
    first = cli.start("run", held, "--id", "held", "--quiet")
    wait_until(lambda: cli.holds_lease(first), timeout_s=20, what="the first run to coordinate")
    os.kill(first.pid, signal.SIGKILL)  # not waited for: a zombie until the test reaps it
    wait_until(lambda: not pid_alive(first.pid), timeout_s=10, what="the kill")

    second = cli.run("run", quick, "--id", "quick", timeout_s=60)

    assert second.code == 0, second.output
    assert "no longer running" in second.output  # taken over, not waited out


def test_purge_force_of_a_running_workflow_stops_its_task_and_is_forgotten(
    cli: DagqCli,
) -> None:
    coordinator = cli.start_coordinator("--log-interval", "0.2")
    cli.start_worker("-q", "default")
    cli.submit_here(
        "doomed", {"name": "doomed", "tasks": [{"name": "a", "cmd": "echo $$ >> a.pid; sleep 60"}]}
    )
    wait_until(lambda: read_pids(cli.workdir / "a.pid"), timeout_s=20, what="the task to start")
    [pid] = read_pids(cli.workdir / "a.pid")

    purged = cli.run("purge", "doomed", "--force")

    assert purged.code == 0, purged.output
    wait_until(lambda: not pid_alive(pid), timeout_s=20, what="the task's process to be stopped")
    pace = re.compile(r"(\d+) active workflow\(s\)")

    def idle_lines() -> list[str]:
        found = [m.group(1) for m in pace.finditer(coordinator.stderr())]
        tail = found[-5:]
        return tail if len(tail) == 5 and set(tail) == {"0"} else []

    wait_until(idle_lines, timeout_s=20, what="the coordinator to count no active workflow")
    log = coordinator.stderr()
    assert "dropping" not in log
    assert log.count("forgetting workflow doomed") <= 1
    assert lines(cli.workdir / "a.pid") == [str(pid)]  # it never ran again
