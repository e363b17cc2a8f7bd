"""``dagq run``'s runtime half: submit (or resume) the run, drive it here with a
coordinator and a worker in this process, show its progress and its result.

Imported by :mod:`dagq.cli.run` once the file has loaded and the zygote of the Python
task processes was launched (it boots meanwhile, on another core). With ``--quiet``
nothing is drawn and rich is not imported: the display (:class:`dagq.cli.display.RunScreen`)
is imported only to draw, and a new run's display is made a quarter of a second in, once
a task has started (or at the run's end, if sooner): rich's import (~25 ms) delays neither
the first task nor a short run. The lines said before the run (resuming, other unfinished
runs) make it at once.
"""

from __future__ import annotations

import asyncio
import shlex
import signal
import sys
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from dagq import garbage, observability
from dagq.cli import EXIT_FAILED, EXIT_OK
from dagq.cli.result_line import result_lines
from dagq.cli.styled import Styled
from dagq.cli.tables import PlainOut, plain_out, printable
from dagq.definition import WorkflowDef
from dagq.local import INTERRUPTED, LocalRunner, Start
from dagq.state import (
    QUARANTINED,
    WORKFLOW_ACTIVE,
    WORKFLOW_TERMINAL,
    RunState,
    TaskStatus,
)
from dagq.stores import open_store
from dagq.stores.base import Store
from dagq.submission import request_cancel
from dagq.submitted import Submitted, require_submitted
from dagq.views import load_view

if TYPE_CHECKING:
    from dagq.cli.display import LiveProgress, RunScreen
    from dagq.plan import Plan

#: The exit code of a run stopped by SIGTERM (the shell convention, 128 + 15).
EXIT_TERMINATED = 128 + signal.SIGTERM
#: A new run's display is drawn no sooner: a run that ends sooner is only summarized (on a
#: terminal its live view would flash; piped, its line comes with the summary), and rich's
#: import stays off its path.
DISPLAY_DELAY_S = 0.25
#: How long it waits past that for a dispatched first task to start (this process's
#: worker takes it); a run with none on its way is drawn at once.
DISPLAY_MAX_WAIT_S = 5.0


class Printer(Protocol):
    """Where the run's words go: a rich console, or plain lines (``--quiet``)."""

    def print(self, *parts: Any) -> None: ...


class Screen:
    """The display of a run (:class:`dagq.cli.display.RunScreen`), made the first time
    it is needed: importing rich is then the first thing it costs."""

    def __init__(self) -> None:
        self._made: RunScreen | None = None

    @property
    def made(self) -> bool:
        return self._made is not None

    @property
    def screen(self) -> RunScreen:
        if self._made is None:
            from dagq.cli.display import RunScreen  # rich: only to draw

            self._made = RunScreen()
            garbage.settle_late()  # made while the run goes on: rich's objects with the rest
        return self._made

    def print(self, *parts: Any) -> None:
        """Print on the display's console (made now if it was not)."""
        self.screen.console.print(*parts)


class _Progress:
    """The live progress of a run, shown once it has gone on for a while and a task has
    started (or at its end): until then nothing is drawn and rich is not imported."""

    def __init__(self, screen: Screen, workflow_id: str, name: str) -> None:
        self.screen = screen
        self.workflow_id = workflow_id
        self.name = name
        self.created = time.monotonic()
        self.live: LiveProgress | None = None
        #: Tasks done at the first look (a resumed run's earlier ones): the rate shown
        #: counts from there, as if drawn from the start.
        self.first_done: int | None = None

    def update(self, plan: Plan, st: RunState) -> None:
        if self.first_done is None:
            self.first_done = st.n_terminal
        if self.live is None:
            if not self._due(st):
                return
            self.show()
        assert self.live is not None
        self.live.update(plan, st)

    def show(self) -> None:
        """Draw it now (``running NAME as ID``, or the live view on a terminal)."""
        if self.live is None:
            live = self.screen.screen.progress(self.workflow_id, self.name)
            live.started, live.first_done = self.created, self.first_done
            self.live = live.__enter__()

    def close(self, *exc: Any) -> None:
        if self.live is not None:
            self.live.__exit__(*exc)

    def _due(self, st: RunState) -> bool:
        """Whether to draw now: the run has ended (or is being cancelled), or it has
        gone on for a while and a task has started (or none is on its way)."""
        if st.status not in ("pending", "running"):
            return True
        waited = time.monotonic() - self.created
        if waited < DISPLAY_DELAY_S:
            return False
        column = st.task_status  # scanned in C
        if st.n_terminal or st.groups or column.find(TaskStatus.RUNNING) >= 0:
            return True
        # Not begun by the coordinator yet, or a task sent and not started yet.
        coming = st.status == "pending" or column.find(TaskStatus.READY) >= 0
        return not coming or waited >= DISPLAY_DELAY_S + DISPLAY_MAX_WAIT_S


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
    screen = None if quiet else Screen()
    return asyncio.run(
        drive(
            screen,
            definition,
            overrides=overrides,
            workers=workers,
            workflow_id=workflow_id,
            store_url=store_url,
            import_paths=import_paths,
            source=source,
            processor=processor,
            retry_tasks=retry_tasks,
        )
    )


async def drive(
    screen: Screen | None,
    definition: WorkflowDef,
    *,
    overrides: Mapping[str, object],
    workers: int,
    workflow_id: str | None,
    store_url: str,
    import_paths: list[str],
    source: str,
    processor: str | None,
    retry_tasks: list[str] | None = None,
) -> int:
    """Drive the run with its progress drawn on ``screen``, or quietly (None)."""
    quiet = screen is None
    console: Printer = PlainOut(sys.stdout) if screen is None else screen
    store = observability.instrument(open_store(store_url))
    try:
        runner = LocalRunner(store, workers=workers, import_paths=import_paths, processor=processor)
        # The span helper, started with the command, has booted meanwhile (on another
        # core, mostly): the run's first tasks do not share the machine with its start.
        observability.ready()
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
            return await _summarize(console, screen, store, wid, None)
        if not quiet:
            await _note_others(console, store, wid)
        started = time.monotonic()
        # Quiet, stdout carries the result alone: what an interruption says goes to stderr.
        notices: Printer = PlainOut(sys.stderr) if quiet else console
        interrupts = _Interrupts(store, wid, notices, runner, resume)
        interrupts.install()
        try:
            async with observability.watching(store, coordinator=runner.coordinator):
                if screen is None:
                    status = await runner.drive()
                else:
                    progress = _Progress(screen, wid, definition.name)
                    interrupts.before_saying = progress.show
                    status = await _shown(runner, screen, progress)
        finally:
            interrupts.remove()
        if status == QUARANTINED:
            return _quarantined(console, wid, runner.quarantine_reason or "?")
        if interrupts.count:
            notices.print(Styled(f"cancelled by Ctrl-C; resume it with: {resume}", "yellow"))
        code = await _summarize(console, screen, store, wid, time.monotonic() - started)
        if interrupts.terminated and status not in WORKFLOW_TERMINAL:
            notices.print(
                Styled(
                    f"stopped by SIGTERM; workflow {wid} is unfinished, resume it with: {resume}",
                    "yellow",
                )
            )
            return EXIT_TERMINATED
        return code if status != "completed" else EXIT_OK
    finally:
        await store.close()


async def _shown(runner: LocalRunner, screen: Screen, progress: _Progress) -> str:
    """Drive the run with its progress drawn from its first task's start on."""
    if screen.made:  # something was said already: the run's line follows it at once
        progress.show()
    try:
        status = await runner.drive(progress.update)
    except BaseException as exc:
        progress.show()
        progress.close(type(exc), exc, exc.__traceback__)
        raise
    progress.show()
    progress.close(None, None, None)
    return status


def _announce(console: Printer, start: Start) -> None:
    """Say what this run does with an id that existed already."""
    wid = start.workflow_id
    if start.quarantined is not None:
        return
    if start.finished is not None:
        console.print(f"workflow {wid} already finished; its result:")
        if start.not_reopened is not None:
            console.print(Styled(f"it was interrupted, but {start.not_reopened}", "yellow"))
    elif start.reopened:
        console.print(
            f"resuming workflow {wid} (interrupted by Ctrl-C): its cancelled tasks run again"
        )
    elif not start.created:
        console.print(f"resuming workflow {wid}")


def _quarantined(console: Printer, workflow_id: str, reason: str) -> int:
    head = (f"workflow {workflow_id} is quarantined:", "bold red")
    console.print(Styled.assemble(head, " ", printable(reason)))
    console.print(
        Styled(
            f"once the cause is fixed: dagq quarantine release {workflow_id} (its kept events "
            f"are applied then); to drop it: dagq purge --force {workflow_id}"
        )
    )
    return EXIT_FAILED


async def _note_others(console: Printer, store: Store, workflow_id: str) -> None:
    """This process coordinates the whole store: say so if other runs will advance too."""
    page = await store.index.query(status=sorted(WORKFLOW_ACTIVE), limit=100)
    others = [row.id for row in page.rows if row.id != workflow_id]
    if others:
        shown = ", ".join(others[:3]) + (" …" if len(others) > 3 else "")
        console.print(
            Styled(
                f"note: {len(others)} other unfinished workflow(s) in this store will "
                f"advance too: {shown} (their tasks run in their own `dagq run --id` or in "
                "`dagq worker`s)",
                "yellow",
            )
        )


async def _summarize(
    console: Printer,
    screen: Screen | None,
    store: Store,
    workflow_id: str,
    elapsed: float | None,
) -> int:
    """The task table and the verdict; quiet, the result in a line (or two)."""
    view = await load_view(store, workflow_id)
    if screen is None:
        assert isinstance(console, PlainOut)  # quiet: plain lines
        plain_out(console, *result_lines(view, elapsed))
    else:
        screen.screen.summary(view, elapsed)
    return EXIT_OK if view.status == "completed" else EXIT_FAILED


class _Interrupts:
    """First Ctrl-C cancels the run cleanly; a second one quits at once (resumable).

    SIGTERM stops this process gracefully without cancelling the workflow: running
    tasks get a grace period, then their process groups are killed and their
    messages handed back, so the same ``--id`` resumes at once.
    """

    def __init__(
        self, store: Store, workflow_id: str, console: Printer, runner: LocalRunner, resume: str
    ) -> None:
        self.store = store
        self.workflow_id = workflow_id
        self.console = console
        self.runner = runner
        self.stop = runner.stop
        self.resume = resume
        self.count = 0
        self.terminated = False
        #: Shows the run's display first (its line comes before any notice).
        self.before_saying: Callable[[], None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def _say(self, line: Styled) -> None:
        if self.before_saying is not None:
            self.before_saying()
        self.console.print(line)

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
            self._say(Styled("SIGTERM: stopping; running tasks get a few seconds…", "yellow"))
        self.stop.set()

    def _on_interrupt(self) -> None:
        self.count += 1
        if self.count > 1:
            self._say(
                Styled(
                    f"stopped at once; workflow {self.workflow_id} is safe on disk: resume "
                    f"it with: {self.resume}",
                    "red",
                )
            )
            raise SystemExit(130)
        self.runner.resume_interrupted = False  # this run ends cancelled, as asked
        task = asyncio.ensure_future(request_cancel(self.store, self.workflow_id, INTERRUPTED))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        # Said once the request is on disk: a second Ctrl-C after it cannot lose it.
        task.add_done_callback(self._cancelling)

    def _cancelling(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        failed = task.exception()
        if failed is None:
            self._say(Styled("cancelling… (Ctrl-C again to quit at once)", "yellow"))
        else:
            self._say(Styled(f"the run could not be cancelled: {failed}", "red"))
