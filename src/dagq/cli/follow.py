"""``dagq logs ID TASK --follow``: an attempt's output as it comes, until it ends.

The worker sends what the task writes every half second (:mod:`dagq.live_logs`);
this prints what is new (:mod:`dagq.log_reading`, as the HTTP API reads it), and
stops when the run's state says the attempt ended — completed (exit 0) or anything
else (exit 1). A task not started yet is waited for. An attempt that ended before
anything was streamed shows its kept log.

What it prints is escaped as ``dagq logs`` escapes it (a control character in a task's
output cannot drive the terminal), a character split between two chunks included.
"""

from __future__ import annotations

import asyncio
import codecs
import sys

from dagq.cli.inspect import EXIT_FAILED, EXIT_OK, with_client
from dagq.cli.tables import printable
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
        out = _Output()
        while not piece.kept:
            out.write(piece.data)
            if piece.complete:
                break
            if piece.ended is None:
                await asyncio.sleep(POLL_S)
            piece = await read(client, number, piece.next_offset)
        out.finish()
        if piece.kept and piece.data:  # it ended before anything was sent live
            print(printable(piece.data.decode("utf-8", "replace")), flush=True)
        ended = piece.ended
        if ended != "completed":
            error = await client.error(workflow_id, task, attempt=number, item=item, undo=undo)
            if error:
                print(f"--- error ---\n{printable(error)}", flush=True)
        print(f"[attempt {number} of '{name}' {ended}]", file=sys.stderr)
        return EXIT_OK if ended == "completed" else EXIT_FAILED

    try:
        return with_client(store_url, body)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


class _Output:
    """stdout for the chunks of one attempt: decoded across chunk boundaries, escaped."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="surrogateescape")
        self.shown = False
        self._last = "\n"

    def write(self, data: bytes) -> None:
        self._print(self._decoder.decode(data))

    def finish(self) -> None:
        """Flush a character cut short; on a terminal, end an unfinished last line so
        that the closing line (on stderr) starts a line of its own."""
        self._print(self._decoder.decode(b"", final=True))
        if self.shown and self._last != "\n" and sys.stdout.isatty():
            self._print("\n")

    def _print(self, text: str) -> None:
        if not text:
            return
        sys.stdout.write(printable(text))
        sys.stdout.flush()
        self.shown, self._last = True, text[-1]
