"""``python -m bench.profiled OUT dagq ARGS...``: the ``dagq`` command under cProfile,
timed in CPU seconds of the process (``time.process_time``: on a loaded machine wall
time would mostly measure the wait for a CPU), or of its main thread alone with
``DAGQ_PROFILE_CLOCK=thread`` (``time.thread_time``: other threads' CPU then does not
land in whatever the main thread was waiting in, ``epoll.poll`` most often); the
statistics go to OUT at exit."""

from __future__ import annotations

import cProfile
import os
import sys
import time

from dagq.cli import main


def run() -> None:
    out, _, *args = sys.argv[1:]
    thread = os.environ.get("DAGQ_PROFILE_CLOCK") == "thread"
    clock = time.thread_time if thread else time.process_time
    profile = cProfile.Profile(clock)
    try:
        profile.runcall(main, args=args, prog_name="dagq")
    except SystemExit:
        pass
    finally:
        profile.dump_stats(out)


if __name__ == "__main__":
    run()
