"""The benchmark's tree sampler splits a process tree's CPU by thread and by part."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

from bench.process_cpu import TreeSampler

#: Spins its main thread for 0.3 s of CPU, then starts a child that spins as long.
_TREE = textwrap.dedent(
    """
    import subprocess, sys, time
    def spin(seconds):
        while time.thread_time() < seconds:
            pass
    spin(0.3)
    print(time.time(), flush=True)
    subprocess.run([sys.executable, "-c", "import time\\nwhile time.thread_time() < 0.3: pass"])
    """
)


def test_the_cpu_of_a_tree_is_found_by_part_and_in_a_window() -> None:
    with (
        subprocess.Popen([sys.executable, "-c", _TREE], stdout=subprocess.PIPE, text=True) as tree,
        TreeSampler(tree.pid, interval_s=0.01) as sampler,
    ):
        out, _ = tree.communicate(timeout=60)
    child_started = float(out)
    total = sampler.by_part(sampler.total())
    assert total["main thread"] >= 0.25
    assert total["pool processes"] >= 0.2  # its last reading may be up to 10 ms early
    before_child = sampler.by_part(sampler.spent_in(0.0, child_started))
    assert before_child.get("pool processes", 0.0) == 0.0
    after = sampler.by_part(sampler.spent_in(child_started, time.time()))
    assert after["pool processes"] >= 0.2
    assert after["main thread"] <= total["main thread"] - 0.2
    assert sampler.cpu_s > 0.0


#: Forks a child that spins a while before it execs into a span helper's command line
#: (as Popen forks, then execs), spinning again; the parent waits for it.
_FORKS_A_HELPER = textwrap.dedent(
    """
    import os, sys, time
    pid = os.fork()
    if pid == 0:
        while time.thread_time() < 0.1:
            pass
        code = "import time\\nwhile time.thread_time() < 0.2: pass"
        name = ".".join(["dagq", "observability", "exporting"])  # not in this command line
        os.execv(sys.executable, [sys.executable, "-c", code, name])
    os.waitpid(pid, 0)
    """
)


def test_a_child_seen_before_it_execs_is_told_apart_once_it_has() -> None:
    """A span helper is forked by the traced process, then execs: seen in between, it
    shows its parent's command line, and was taken for a pool process for good (a CI
    run's `dagq run` had no span helper in its parts)."""
    with (
        subprocess.Popen([sys.executable, "-c", _FORKS_A_HELPER]) as tree,
        TreeSampler(tree.pid, interval_s=0.01) as sampler,
    ):
        tree.wait(timeout=60)
    total = sampler.by_part(sampler.total())
    assert total.get("span helper", 0.0) >= 0.1
    assert "pool processes" not in total
