"""``dagq logs ID TASK --follow``: an attempt's output as it comes, until it ends.

The worker sends what the task writes every half second (:mod:`dagq.live_logs`);
this prints each new chunk, and stops when the run's state says the attempt ended
— completed (exit 0) or anything else (exit 1). A task not started yet is waited
for. An attempt that ended before anything was streamed shows its kept log.

What it prints is escaped as ``dagq logs`` escapes it (a control character in a task's
output cannot drive the terminal), a character split between two chunks included.
"""

from __future__ import annotations

import asyncio
import codecs
import sys

from dagq.cli.inspect import EXIT_FAILED, EXIT_OK, with_client
from dagq.cli.tables import printable
from dagq.client import AttemptState, Client
from dagq.keys import attempt_name

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

    async def state(client: Client, number: int | None) -> AttemptState:
        return await client.attempt_state(workflow_id, task, attempt=number, item=item, undo=undo)

    async def body(client: Client) -> int:
        current = await state(client, attempt)
        while current.attempt == 0 and current.ended is None:  # not started yet
            await asyncio.sleep(POLL_S)
            current = await state(client, attempt)
        if current.attempt == 0:
            print(f"'{name}' ran no attempt: it is {current.ended}", file=sys.stderr)
            return EXIT_OK if current.ended == "completed" else EXIT_FAILED
        number = current.attempt
        print(f"[following attempt {number} of '{name}']", file=sys.stderr, flush=True)
        out = _Output()
        after = None
        while True:
            ended = current.ended  # read before the chunks: every chunk of it is out
            for key, data in await client.live_output(current.live_prefix, after=after):
                out.write(data)
                after = key
            if ended is not None:
                break
            await asyncio.sleep(POLL_S)
            current = await state(client, number)
        out.finish()
        if not out.shown:  # it ended before anything was sent live: what was kept
            text = await client.logs(workflow_id, task, attempt=number, item=item, undo=undo)
            if text:
                print(printable(text), flush=True)
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
