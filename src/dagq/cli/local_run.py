"""``dagq run``'s runtime half: submit (or resume) the run, drive it here with a
coordinator and a worker in this process, show its progress and its result.

Imported by :mod:`dagq.cli.run` once the file has loaded and the zygote of the Python
task processes was launched (it boots meanwhile, on another core).
"""

from __future__ import annotations

import asyncio
import shlex
import signal
import time
from collections.abc import Mapping

from rich.console import Console
from rich.markup import escape

from dagq import observability
from dagq.cli import EXIT_FAILED, EXIT_OK
from dagq.cli.display import LiveProgress, print_summary
from dagq.cli.result_line import result_lines
from dagq.cli.tables import plain_out, printable
from dagq.cli.terminal import out_console
from dagq.definition import WorkflowDef
from dagq.local import INTERRUPTED, LocalRunner, Start
from dagq.state import QUARANTINED, WORKFLOW_ACTIVE, WORKFLOW_TERMINAL
from dagq.stores import open_store
from dagq.stores.base import Store
from dagq.submission import Submitted, request_cancel, require_submitted
from dagq.views import load_view

#: The exit code of a run stopped by SIGTERM (the shell convention, 128 + 15).
EXIT_TERMINATED = 128 + signal.SIGTERM


def submitted(store_url: str, workflow_id: str) -> Submitted:
    """The submission of an existing run (``dagq retry --run``)."""
    return asyncio.run(_submitted(store_url, workflow_id))


async def _submitted(store_url: str, workflow_id: str) -> Submitted:
    store = open_store(store_url, create=False)
    try:
        return await require_submitted(store, workflow_id)
    finally:
        await store.close()


def run_here(
    definition: WorkflowDef,
    *,
    overrides: Mapping[str, object],
    workers: int,
    workflow_id: str | None,
    store_url: str,
    import_paths: list[str],
    quiet: bool,
    source: str,
    processor: str | None,
    retry_tasks: list[str] | None = None,
) -> int:
    """Submit (or resume, or retry) the run and drive it here; the exit code."""
    return asyncio.run(
        drive(
            out_console(),
            definition,
            overrides=overrides,
            workers=workers,
            workflow_id=workflow_id,
            store_url=store_url,
            import_paths=import_paths,
            quiet=quiet,
            source=source,
            processor=processor,
            retry_tasks=retry_tasks,
        )
    )


async def drive(
    console: Console,
    definition: WorkflowDef,
    *,
    overrides: Mapping[str, object],
    workers: int,
    workflow_id: str | None,
    store_url: str,
    import_paths: list[str],
    quiet: bool,
    source: str,
    processor: str | None,
    retry_tasks: list[str] | None = None,
) -> int:
    store = observability.instrument(open_store(store_url))
    try:
        runner = LocalRunner(store, workers=workers, import_paths=import_paths, processor=processor)
        if retry_tasks is not None:  # dagq retry --run: the run exists and has ended
            assert workflow_id is not None
            start = await runner.start_retry(
                definition, params=overrides, workflow_id=workflow_id, tasks=retry_tasks
            )
            if not quiet:
                console.print(f"retrying workflow {start.workflow_id} here")
        else:
            start = await runner.start(definition, params=overrides, workflow_id=workflow_id)
            if not quiet:
                _announce(console, start)
        wid = start.workflow_id
        resume = f"dagq run {shlex.quote(source)} --id {wid}"
        if start.quarantined is not None:
            return _quarantined(console, wid, start.quarantined)
        if start.finished is not None:
            return await _summarize(console, store, wid, None, quiet=quiet)
        if not quiet:
            await _note_others(console, store, wid)
        started = time.monotonic()
        # Quiet, stdout carries the result alone: what an interruption says goes to stderr.
        notices = Console(stderr=True, highlight=False, soft_wrap=True) if quiet else console
        interrupts = _Interrupts(store, wid, notices, runner, resume)
        interrupts.install()
        try:
            progress = LiveProgress(console, wid, definition.name)
            async with observability.watching(store, coordinator=runner.coordinator):
                if quiet:
                    status = await runner.drive()
                else:
                    with progress:
                        status = await runner.drive(progress.update)
        finally:
            interrupts.remove()
        if status == QUARANTINED:
            return _quarantined(console, wid, runner.quarantine_reason or "?")
        if interrupts.count:
            notices.print(f"[yellow]cancelled by Ctrl-C; resume it with: {escape(resume)}[/]")
        code = await _summarize(console, store, wid, time.monotonic() - started, quiet=quiet)
        if interrupts.terminated and status not in WORKFLOW_TERMINAL:
            notices.print(
                f"[yellow]stopped by SIGTERM; workflow {wid} is unfinished, resume it with: "
                f"{escape(resume)}[/]"
            )
            return EXIT_TERMINATED
        return code if status != "completed" else EXIT_OK
    finally:
        await store.close()


def _announce(console: Console, start: Start) -> None:
    """Say what this run does with an id that existed already."""
    wid = start.workflow_id
    if start.quarantined is not None:
        return
    if start.finished is not None:
        console.print(f"workflow {wid} already finished; its result:")
        if start.not_reopened is not None:
            console.print(f"[yellow]it was interrupted, but {escape(start.not_reopened)}[/]")
    elif start.reopened:
        console.print(
            f"resuming workflow {wid} (interrupted by Ctrl-C): its cancelled tasks run again"
        )
    elif not start.created:
        console.print(f"resuming workflow {wid}")


def _quarantined(console: Console, workflow_id: str, reason: str) -> int:
    shown = escape(printable(reason))
    console.print(f"[bold red]workflow {workflow_id} is quarantined:[/] {shown}")
    console.print(
        f"once the cause is fixed: dagq quarantine release {workflow_id} (its kept events "
        f"are applied then); to drop it: dagq purge --force {workflow_id}",
        highlight=False,
    )
    return EXIT_FAILED


async def _note_others(console: Console, store: Store, workflow_id: str) -> None:
    """This process coordinates the whole store: say so if other runs will advance too."""
    page = await store.index.query(status=sorted(WORKFLOW_ACTIVE), limit=100)
    others = [row.id for row in page.rows if row.id != workflow_id]
    if others:
        shown = ", ".join(others[:3]) + (" …" if len(others) > 3 else "")
        console.print(
            f"[yellow]note: {len(others)} other unfinished workflow(s) in this store will "
            f"advance too: {shown} (their tasks run in their own `dagq run --id` or in "
            "`dagq worker`s)[/]"
        )


async def _summarize(
    console: Console, store: Store, workflow_id: str, elapsed: float | None, *, quiet: bool
) -> int:
    """The task table and the verdict; with ``quiet``, the result in a line (or two)."""
    view = await load_view(store, workflow_id)
    if quiet:
        plain_out(console, *result_lines(view, elapsed))
    else:
        print_summary(console, view, elapsed_s=elapsed)
    return EXIT_OK if view.status == "completed" else EXIT_FAILED


class _Interrupts:
    """First Ctrl-C cancels the run cleanly; a second one quits at once (resumable).

    SIGTERM stops this process gracefully without cancelling the workflow: running
    tasks get a grace period, then their process groups are killed and their
    messages handed back, so the same ``--id`` resumes at once.
    """

    def __init__(
        self, store: Store, workflow_id: str, console: Console, runner: LocalRunner, resume: str
    ) -> None:
        self.store = store
        self.workflow_id = workflow_id
        self.console = console
        self.runner = runner
        self.stop = runner.stop
        self.resume = resume
        self.count = 0
        self.terminated = False
        self._tasks: set[asyncio.Task[None]] = set()

    def install(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGINT, self._on_interrupt)
        loop.add_signal_handler(signal.SIGTERM, self._on_terminate)

    def remove(self) -> None:
        loop = asyncio.get_running_loop()
        loop.remove_signal_handler(signal.SIGINT)
        loop.remove_signal_handler(signal.SIGTERM)

    def _on_terminate(self) -> None:
        if not self.terminated:
            self.terminated = True
            self.console.print("[yellow]SIGTERM: stopping; running tasks get a few seconds…[/]")
        self.stop.set()

    def _on_interrupt(self) -> None:
        self.count += 1
        if self.count > 1:
            self.console.print(
                f"[red]stopped at once; workflow {self.workflow_id} is safe on disk: resume "
                f"it with: {escape(self.resume)}[/]"
            )
            raise SystemExit(130)
        self.console.print("[yellow]cancelling… (Ctrl-C again to quit at once)[/]")
        self.runner.resume_interrupted = False  # this run ends cancelled, as asked
        task = asyncio.ensure_future(request_cancel(self.store, self.workflow_id, INTERRUPTED))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
