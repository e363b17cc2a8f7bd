"""``dagq submit --wait``: wait for submitted runs to end and say how each ended."""

from __future__ import annotations

import sys
import time

from dagq.cli.inspect import EXIT_FAILED, EXIT_OK, print_json, with_client
from dagq.cli.status import status_line
from dagq.cli.tables import plain_out
from dagq.cli.terminal import out_console
from dagq.client import Client, WorkflowStatus

#: The exit code of ``submit --wait`` when ``--timeout`` passes first (the runs go on).
EXIT_TIMEOUT = 3
#: How often the store is asked while waiting, at most.
POLL_S = 0.5


def wait_for_runs(store_url: str, ids: list[str], *, timeout_s: float | None, as_json: bool) -> int:
    """Wait for every run of ``ids``, printing each final status line (or, with
    ``as_json``, their statuses as JSON). Exit 0 if all completed, 1 if one did not,
    3 if ``timeout_s`` passed first."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s

    async def body(client: Client) -> tuple[list[WorkflowStatus], str | None]:
        found = []
        for workflow_id in ids:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                found.append(await client.wait(workflow_id, timeout_s=left, poll_s=POLL_S))
            except TimeoutError:
                return found, workflow_id
        return found, None

    ended, late = with_client(store_url, body)
    if as_json:
        print_json(ended[0] if len(ids) == 1 and ended else ended)
    else:
        out = out_console()
        plain_out(out, *(status_line(status, time.time(), []) for status in ended))
    if late is not None:
        print(
            f"error: workflow {late} did not end within --timeout {timeout_s or 0:g}s "
            f"(it goes on; see dagq status {late})",
            file=sys.stderr,
        )
        return EXIT_TIMEOUT
    return EXIT_OK if all(s.status == "completed" for s in ended) else EXIT_FAILED
