"""``python -m bench.profiled OUT dagq ARGS...``: the ``dagq`` command under cProfile,
timed in CPU seconds of the process (``time.process_time``: on a loaded machine wall
time would mostly measure the wait for a CPU); the statistics go to OUT at exit."""

from __future__ import annotations

import cProfile
import sys
import time

from dagq.cli import main


def run() -> None:
    out, _, *args = sys.argv[1:]
    profile = cProfile.Profile(time.process_time)
    try:
        profile.runcall(main, args=args, prog_name="dagq")
    except SystemExit:
        pass
    finally:
        profile.dump_stats(out)


if __name__ == "__main__":
    run()
