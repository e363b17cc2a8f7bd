"""``dagq logs ID TASK --follow``: an attempt's output as it comes, until it ends.

The worker sends what the task writes every half second (:mod:`dagq.live_logs`);
this prints what is new (:mod:`dagq.log_reading`), and stops when the run's state
says the attempt ended — completed (exit 0) or anything else (exit 1). A task not
started yet is waited for. An attempt that ended before anything was streamed shows
its kept log.
"""

from __future__ import annotations

import asyncio
import sys

from dagq.cli.inspect import EXIT_FAILED, EXIT_OK, with_client
from dagq.client import Client
from dagq.keys import attempt_name
from dagq.log_reading import LogSlice, read_log

#: How often the store is asked for new output and for the attempt's state.
POLL_S = 0.3
EXIT_INTERRUPTED = 130


def run_follow(
    store_url: str,
    workflow_id: str,
    task: str,
    *,
    attempt: int | None,
    item: int = -1,
    undo: bool = False,
) -> int:
    """Print the attempt's output as it comes; its exit code once it ended."""
    name = attempt_name(task, item=item, undo=undo)

    async def read(client: Client, number: int | None, offset: int) -> LogSlice:
        return await read_log(
            client, workflow_id, task, attempt=number, offset=offset, item=item, undo=undo
        )

    async def body(client: Client) -> int:
        piece = await read(client, attempt, 0)
        while piece.attempt == 0 and piece.ended is None:  # not started yet
            await asyncio.sleep(POLL_S)
            piece = await read(client, attempt, 0)
        if piece.attempt == 0:
            print(f"'{name}' ran no attempt: it is {piece.ended}", file=sys.stderr)
            return EXIT_OK if piece.ended == "completed" else EXIT_FAILED
        number = piece.attempt
        print(f"[following attempt {number} of '{name}']", file=sys.stderr, flush=True)
        while True:
            sys.stdout.buffer.write(piece.data)
            sys.stdout.buffer.flush()
            if piece.complete:
                break
            if piece.ended is None:
                await asyncio.sleep(POLL_S)
            piece = await read(client, number, piece.next_offset)
        if piece.data and not piece.data.endswith(b"\n"):
            print(flush=True)
        ended = piece.ended
        if ended != "completed":
            error = await client.error(workflow_id, task, attempt=number, item=item, undo=undo)
            if error:
                print(f"--- error ---\n{error}", flush=True)
        print(f"[attempt {number} of '{name}' {ended}]", file=sys.stderr)
        return EXIT_OK if ended == "completed" else EXIT_FAILED

    try:
        return with_client(store_url, body)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
