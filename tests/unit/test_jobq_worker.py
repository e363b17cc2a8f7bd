"""The worker side of ai4s-jobq tasks: commands run with bash, ai4s-jobq's environment
contract, what a failed or sloppy attempt leaves under ai4s-jobq semantics, custom
processors, the ``dagq.jobq`` script helpers (``is_cancelled`` included) and
``bg_dirsync_to``."""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from dagq import keys, reporting
from dagq import worker as worker_module
from dagq.messages import TaskFinished, TaskMessage, TaskSpec, encode_task
from dagq.runners import Outcome, TaskContext
from dagq.runners.python import run_python
from dagq.runners.shell import run_shell
from dagq.stores.base import OutgoingMessage, Store
from dagq.stores.memory import open_memory_store
from dagq.worker import Worker, WorkerOptions
from tests.helpers import finished

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]
CTX = TaskContext(
    workflow_id="wf",
    task="train",
    attempt=2,
    idempotency_key="wf/train",
    inputs={"featurize": {"path": "/tmp/f", "rows": 5}, "skipped": None, "text": "hi"},
    task_id="wf/train/2",
)


async def shell(cmd: str, tmp_path: Path, *, ctx: TaskContext = CTX, **spec: Any) -> Outcome:
    task = TaskSpec(kind="shell", cmd=cmd, **spec)
    return await asyncio.wait_for(run_shell(task, ctx, work_dir=str(tmp_path)), 30)


def python_script(tmp_path: Path, name: str, body: str) -> str:
    """A command running ``body`` (dedented) with this interpreter, dagq importable."""
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return f"PYTHONPATH={ROOT / 'src'} {sys.executable} {path}"


# --- bash and the environment contract ---------------------------------------------


async def test_commands_run_with_bash_so_its_syntax_works(tmp_path: Path) -> None:
    cmd = 'if [[ 2 -gt 1 ]]; then echo "[$(echo {1..3} | tr " " ,)]" > "$DAGQ_OUTPUT"; fi'
    outcome = await shell(cmd, tmp_path)
    assert (outcome.ok, outcome.output) == (True, [1, 2, 3]), outcome.error


async def test_a_shell_task_gets_ai4s_jobqs_environment_contract(tmp_path: Path) -> None:
    cmd = python_script(
        tmp_path,
        "env.py",
        """
        import json, os
        e = os.environ
        out = e["JOBQ_OUTPUT_FILE"]
        seen = {k: v for k, v in e.items() if k.startswith("JOBQ_")}
        seen["output_file_size"] = os.path.getsize(out)  # created, empty, before the start
        seen["refs"] = json.load(open(e["JOBQ_WORKFLOW_UPSTREAM_REFS"]))
        seen["unbuffered"] = e["PYTHONUNBUFFERED"]
        seen["same_file"] = out == e["DAGQ_OUTPUT"]
        json.dump(seen, open(out, "w"))
        """,
    )
    outcome = await shell(cmd, tmp_path)
    assert outcome.ok, outcome.error
    seen = outcome.output
    assert {k: seen[k] for k in ("JOBQ_WORKFLOW_ID", "JOBQ_WORKFLOW_TASK")} == {
        "JOBQ_WORKFLOW_ID": "wf",
        "JOBQ_WORKFLOW_TASK": "train",
    }
    assert (seen["JOBQ_WORKFLOW_ATTEMPT"], seen["JOBQ_TASK_ID"]) == ("2", "wf/train/2")
    assert seen["output_file_size"] == 0 and seen["same_file"]
    assert seen["unbuffered"] == "1"
    # Each parent's output as JSON text (what ai4s-jobq's helpers json.loads), or null.
    assert seen["refs"] == {
        "featurize": '{"path": "/tmp/f", "rows": 5}',
        "skipped": None,
        "text": '"hi"',
    }


async def test_a_tasks_env_may_turn_unbuffered_output_off(tmp_path: Path) -> None:
    outcome = await shell(
        'echo "\\"$PYTHONUNBUFFERED\\"" > "$DAGQ_OUTPUT"', tmp_path, env={"PYTHONUNBUFFERED": "0"}
    )
    assert outcome.output == "0"


# --- what an attempt leaves, per rule set -------------------------------------------


async def test_under_jobq_semantics_a_failed_attempt_keeps_what_it_wrote(tmp_path: Path) -> None:
    cmd = 'echo \'{"partial": 1}\' > "$JOBQ_OUTPUT_FILE"; echo oops >&2; exit 3'
    jobq = await shell(cmd, tmp_path, jobq=True)
    assert (jobq.ok, jobq.output, jobq.output_json) == (False, {"partial": 1}, b'{"partial":1}')
    assert jobq.error == "exit code 3; stderr: oops"
    dagq = await shell(cmd, tmp_path)
    assert (dagq.ok, dagq.output, dagq.error) == (False, None, "exit code 3; stderr: oops")


async def test_under_jobq_semantics_invalid_output_json_completes_with_a_warning(
    tmp_path: Path,
) -> None:
    cmd = 'echo "not json" > "$JOBQ_OUTPUT_FILE"'
    jobq = await shell(cmd, tmp_path, jobq=True)
    assert (jobq.ok, jobq.output) == (True, None)
    assert jobq.warning is not None
    assert jobq.warning.startswith("the task wrote invalid JSON to $JOBQ_OUTPUT_FILE: ")
    assert jobq.warning.endswith("; the task completed with no output")
    dagq = await shell(cmd, tmp_path)  # dagq semantics: as before, a failure
    assert (dagq.ok, dagq.retryable, dagq.warning) == (False, False, None)
    assert dagq.error is not None and "invalid JSON to $DAGQ_OUTPUT" in dagq.error


async def test_under_jobq_semantics_a_failed_attempts_bad_output_is_dropped_saying_so(
    tmp_path: Path,
) -> None:
    outcome = await shell('echo "{" > "$JOBQ_OUTPUT_FILE"; exit 1', tmp_path, jobq=True)
    assert (outcome.ok, outcome.output, outcome.error) == (False, None, "exit code 1")
    assert outcome.warning is not None and outcome.warning.startswith("its output was not kept")


async def test_the_bounds_still_hold_under_jobq_semantics(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from dagq.runners import shell as shell_runner

    monkeypatch.setattr(shell_runner, "MAX_OUTPUT_BYTES", 100)
    outcome = await shell('printf "[%0200d]" 0 > "$JOBQ_OUTPUT_FILE"', tmp_path, jobq=True)
    assert (outcome.ok, outcome.retryable) == (False, False)
    assert outcome.error is not None and "over the limit of 100" in outcome.error


async def test_a_failed_attempts_output_and_warning_reach_the_completion_event() -> None:
    store = open_memory_store()
    spec = TaskSpec(kind="shell", cmd="x", jobq=True)
    task = TaskMessage(workflow_id="wf", task=0, name="t", attempt=1, spec=spec)
    small = Outcome(ok=False, error="exit code 1", output={"a": 1}, warning="careful")
    event = await reporting.finished(
        store.documents, task, small, started=0.0, clock=time.time, worker="w"
    )
    assert (event.ok, event.output, event.error, event.warning) == (
        False,
        {"a": 1},
        "exit code 1",
        "careful",
    )
    big = "x" * 100_000
    large = Outcome(ok=False, error="exit code 1", output=big, output_json=json.dumps(big).encode())
    event = await reporting.finished(
        store.documents, task, large, started=0.0, clock=time.time, worker="w"
    )
    assert (event.ok, event.output, event.output_ref) == (False, None, keys.output("wf", 0, 1))
    stored = await store.documents.get(keys.output("wf", 0, 1))
    assert stored is not None and json.loads(stored.data) == big


# --- script helpers -----------------------------------------------------------------


async def test_shell_scripts_read_parents_and_set_outputs_with_dagqs_helpers(
    tmp_path: Path,
) -> None:
    cmd = python_script(
        tmp_path,
        "helpers.py",
        """
        from dagq.jobq import get_upstream_output, get_upstream_outputs, is_cancelled, set_output
        try:
            get_upstream_output("nope")
        except KeyError as exc:
            missing = str(exc)
        set_output("first")
        set_output({
            "featurize": get_upstream_output("featurize"),
            "skipped": get_upstream_output("skipped"),
            "all": get_upstream_outputs(),
            "missing": missing,
            "cancelled": is_cancelled(),
        })
        """,
    )
    outcome = await shell(cmd, tmp_path)
    assert outcome.ok, outcome.error
    assert outcome.output == {
        "featurize": {"path": "/tmp/f", "rows": 5},
        "skipped": None,
        "all": {"featurize": {"path": "/tmp/f", "rows": 5}, "text": "hi"},
        "missing": "\"'nope' is not a direct upstream of 'train'\"",
        "cancelled": False,
    }


def test_the_helpers_say_when_they_run_outside_a_task(monkeypatch: pytest.MonkeyPatch) -> None:
    from dagq import jobq

    for name in ("JOBQ_WORKFLOW_UPSTREAM_REFS", "JOBQ_OUTPUT_FILE", "DAGQ_OUTPUT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("DAGQ_CANCEL_FILE", raising=False)
    with pytest.raises(ValueError, match="not running inside a dagq task"):
        jobq.get_upstream_output("a")
    with pytest.raises(RuntimeError, match="JOBQ_OUTPUT_FILE is not set"):
        jobq.set_output(1)
    with pytest.raises(RuntimeError, match="not running inside a dagq task"):
        jobq.is_cancelled()


@pytest.mark.parametrize("isolation", ["process", "thread"])
async def test_python_tasks_use_the_same_helpers(isolation: str) -> None:
    ctx = TaskContext(
        workflow_id="wf",
        task="t",
        attempt=1,
        idempotency_key="k",
        inputs={"a": {"n": 1}, "b": None},
    )
    spec = TaskSpec(kind="python", call="tests.sample_tasks:jobq_helpers", timeout_s=20)
    returned = TaskSpec(kind="python", call="tests.sample_tasks:returns_despite_set_output")
    pool = None
    if isolation == "process":
        from dagq.runners.pool import TaskPool

        pool = TaskPool(1)
    try:
        outcome = await run_python(spec, ctx, None, pool=pool)
        other = await run_python(returned, ctx, None, pool=pool)
    finally:
        if pool is not None:
            await pool.close()
    assert outcome.ok, outcome.error
    assert outcome.output == {
        "a": {"n": 1},
        "all": {"a": {"n": 1}},
        "missing": "\"'not-a-parent' is not a direct upstream of 't'\"",
        "cancelled": False,
        "task": "t",
    }
    assert other.output == "returned"  # a value the function returns wins


# --- a worker with hand-built messages ----------------------------------------------


async def served(
    tasks: list[TaskMessage], *, timeout_s: float = 30, **options: Any
) -> list[TaskFinished]:
    """Queue ``tasks`` on a memory store, run a worker until each has reported."""
    store = open_memory_store()
    await store.queues.send(
        "jobs", [OutgoingMessage(encode_task(t), id=f"{t.name}/{t.attempt}") for t in tasks]
    )
    stop = asyncio.Event()
    defaults: dict[str, Any] = {"queues": ("jobs",), "concurrency": 4, "poll_interval_s": 0.05}
    worker = Worker(store, WorkerOptions(**{**defaults, **options}))
    serving = asyncio.create_task(worker.run(stop))
    try:
        events = await asyncio.wait_for(finished(store, len(tasks)), timeout_s)
    finally:
        stop.set()
        await serving
    return sorted(events, key=lambda e: e.task)


def processor_task(i: int, kwargs: Any, **spec: Any) -> TaskMessage:
    return TaskMessage(
        workflow_id="wf",
        task=i,
        name=f"t{i}",
        attempt=1,
        spec=TaskSpec(kind="processor", args=kwargs, jobq=True, **spec),
    )


@pytest.mark.parametrize("isolation", ["process", "thread"])
async def test_a_workers_processor_runs_kwargs_tasks_and_its_return_is_the_output(
    isolation: str,
) -> None:
    events = await served(
        [
            processor_task(0, {"model": "schnet", "epochs": 5}),
            processor_task(1, None),
            processor_task(2, {"fail": "flaky"}),
        ],
        processor="tests.sample_tasks:processor",
        isolation=isolation,
    )
    assert [e.ok for e in events] == [True, True, True]
    assert events[0].output == {
        "kwargs": {"model": "schnet", "epochs": 5},
        "task": "t0",
        "task_id": "wf/t0/1",
    }
    assert events[1].output["kwargs"] == {}


async def test_a_processor_may_be_async_and_its_exceptions_fail_the_attempt() -> None:
    events = await served(
        [processor_task(0, {"n": 1})], processor="tests.sample_tasks:async_processor"
    )
    assert events[0].output == {"async": True, "n": 1}
    events = await served(
        [processor_task(0, {"fail": "flaky"}), processor_task(1, {"fail": "never"})],
        processor="tests.sample_tasks:failing_processor",
    )
    assert (events[0].ok, events[0].retryable, events[0].error) == (
        False,
        True,
        "ValueError: flaky",
    )
    assert (events[1].ok, events[1].retryable) == (False, False)


async def test_a_processor_task_on_a_worker_without_one_fails_at_once_saying_how_to_fix_it() -> (
    None
):
    started = time.monotonic()
    events = await served([processor_task(0, {"url": "http://x"})])
    assert time.monotonic() - started < 10
    event = events[0]
    assert (event.ok, event.retryable) == (False, False)
    assert event.error is not None
    assert "needs a worker started with a processor" in event.error
    assert "dagq worker -q jobs --processor module:function" in event.error


# --- is_cancelled -------------------------------------------------------------------


def shell_task(i: int, cmd: str, **spec: Any) -> TaskMessage:
    return TaskMessage(
        workflow_id="wf",
        task=i,
        name=f"t{i}",
        attempt=1,
        spec=TaskSpec(kind="shell", cmd=cmd, **spec),
    )


async def cancel_when(store: Store, path: Path) -> None:
    """Stop workflow 'wf' (as a cancel does: its control document) once ``path`` exists."""
    while not path.exists():
        await asyncio.sleep(0.02)
    await store.documents.put(keys.control("wf"), msgspec.json.encode({"stop_through": 10}))


async def test_a_task_watching_is_cancelled_sees_it_and_may_end_on_its_own(
    tmp_path: Path,
) -> None:
    ready = tmp_path / "ready"
    cmd = python_script(
        tmp_path,
        "watch.py",
        f"""
        import pathlib, time
        from dagq.jobq import is_cancelled, set_output
        is_cancelled()
        pathlib.Path({str(ready)!r}).touch()
        deadline = time.monotonic() + 20
        while not is_cancelled() and time.monotonic() < deadline:
            time.sleep(0.02)
        set_output("saw it" if is_cancelled() else "never saw it")
        """,
    )
    store = open_memory_store()
    await store.queues.send("jobs", [OutgoingMessage(encode_task(shell_task(0, cmd)), id="a")])
    stop = asyncio.Event()
    worker = Worker(
        store,
        WorkerOptions(queues=("jobs",), poll_interval_s=0.05, cancel_check_s=0.05),
    )
    serving = asyncio.create_task(worker.run(stop))
    try:
        await asyncio.wait_for(cancel_when(store, ready), 20)
        started = time.monotonic()
        (event,) = await asyncio.wait_for(finished(store, 1), 20)
    finally:
        stop.set()
        await serving
    assert (event.ok, event.output) == (True, "saw it")
    assert time.monotonic() - started < worker.options.cancel_notice_s


async def test_a_task_not_watching_is_stopped_at_once(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    store = open_memory_store()
    await store.queues.send(
        "jobs",
        [OutgoingMessage(encode_task(shell_task(0, f"touch {ready}; sleep 30")), id="a")],
    )
    stop = asyncio.Event()
    worker = Worker(
        store, WorkerOptions(queues=("jobs",), poll_interval_s=0.05, cancel_check_s=0.05)
    )
    serving = asyncio.create_task(worker.run(stop))
    try:
        await asyncio.wait_for(cancel_when(store, ready), 20)  # once it runs
        started = time.monotonic()
        (event,) = await asyncio.wait_for(finished(store, 1), 20)
    finally:
        stop.set()
        await serving
    assert event.error == "stopped: the workflow was cancelled or has ended"
    assert time.monotonic() - started < 5


async def test_a_python_task_watching_is_cancelled_sees_it_too(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    store = open_memory_store()
    task = TaskMessage(
        workflow_id="wf",
        task=0,
        name="t0",
        attempt=1,
        spec=TaskSpec(
            kind="python", call="tests.sample_tasks:watch_cancel", args={"ready": str(ready)}
        ),
    )
    await store.queues.send("jobs", [OutgoingMessage(encode_task(task), id="a")])
    stop = asyncio.Event()
    worker = Worker(
        store, WorkerOptions(queues=("jobs",), poll_interval_s=0.05, cancel_check_s=0.05)
    )
    serving = asyncio.create_task(worker.run(stop))
    try:
        await asyncio.wait_for(cancel_when(store, ready), 20)  # once it watches
        (event,) = await asyncio.wait_for(finished(store, 1), 20)
    finally:
        stop.set()
        await serving
    assert (event.ok, event.output) == (True, "noticed")


async def test_the_cancel_files_of_ended_attempts_are_swept_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each attempt that asks is_cancelled leaves a marker; they are not looked for one
    by one as attempts end (two system calls a task) but swept every few attempts, so
    they never pile up."""
    monkeypatch.setattr(worker_module, "_SWEEP_EVERY", 5)
    tasks = [
        TaskMessage(
            workflow_id="wf",
            task=i,
            name=f"t{i}",
            attempt=1,
            spec=TaskSpec(kind="python", call="tests.sample_tasks:looks_cancelled"),
        )
        for i in range(23)
    ]
    store = open_memory_store()
    await store.queues.send(
        "jobs", [OutgoingMessage(encode_task(t), id=f"{t.name}/1") for t in tasks]
    )
    stop = asyncio.Event()
    worker = Worker(
        store,
        WorkerOptions(
            queues=("jobs",), concurrency=2, poll_interval_s=0.05, work_dir=str(tmp_path)
        ),
    )
    serving = asyncio.create_task(worker.run(stop))
    try:
        events = await asyncio.wait_for(finished(store, len(tasks)), 30)
        (scratch,) = tmp_path.glob("dagq-worker-*")
        left = sorted(p.name for p in scratch.iterdir())
    finally:
        stop.set()
        await serving
    assert [(e.ok, e.output) for e in events] == [(True, False)] * len(tasks)
    # Swept after the 5th, 10th, 15th and 20th attempts: the last few are left.
    assert 0 < len(left) <= 5, left
    assert all(name.endswith(".cancel.watched") for name in left), left
    assert not list(tmp_path.glob("dagq-worker-*"))  # and all of it once the worker stops


# --- bg_dirsync_to ------------------------------------------------------------------


def wait_for(path: Path) -> str:
    return f"for i in $(seq 200); do [ -f {path} ] && break; sleep 0.05; done"


async def test_dirsync_copies_the_tasks_directory_while_it_runs_and_at_the_end(
    tmp_path: Path,
) -> None:
    target = tmp_path / "target"
    cmd = (
        'echo one > "$AMLT_DIRSYNC_DIR/first.txt"; '
        f"{wait_for(target / 'first.txt')}; "
        f'[ -f {target / "first.txt"} ] && echo copied > "$AMLT_DIRSYNC_DIR/seen"; '
        'mkdir -p "$AMLT_DIRSYNC_DIR/sub" && echo two > "$AMLT_DIRSYNC_DIR/sub/last.txt"'
    )
    outcome = await shell(cmd, tmp_path, dirsync_to=str(target), env={"AMLT_DIRSYNC_FREQ": "0.1"})
    assert outcome.ok, outcome.error
    assert (target / "first.txt").read_text() == "one\n"
    assert (target / "seen").read_text() == "copied\n"  # copied while it ran
    assert (target / "sub" / "last.txt").read_text() == "two\n"  # and once at the end


async def test_dirsync_copies_the_working_directory_when_the_task_names_one(
    tmp_path: Path,
) -> None:
    work, target = tmp_path / "work", tmp_path / "target"
    work.mkdir()
    (target / "old.txt").parent.mkdir()
    (target / "old.txt").write_text("kept")
    cmd = 'echo "\\"$AMLT_DIRSYNC_DIR\\"" > "$DAGQ_OUTPUT"; echo result > result.txt'
    outcome = await shell(cmd, tmp_path, cwd=str(work), dirsync_to=str(target))
    assert outcome.output == str(work)
    assert (target / "result.txt").read_text() == "result\n"
    assert (target / "old.txt").read_text() == "kept"  # nothing deleted at the target


async def test_a_dirsync_failure_is_a_warning_in_the_log_not_a_failure(tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    outcome = await shell(
        'echo x > "$AMLT_DIRSYNC_DIR/x"', tmp_path, dirsync_to=str(blocked / "target")
    )
    assert outcome.ok, outcome.error
    assert b"--- warnings ---" in outcome.log and b"bg_dirsync_to" in outcome.log


async def test_dirsync_copies_to_an_azure_blob_prefix(
    azurite: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from azure.storage.blob import ContainerClient

    from dagq.stores.azure_auth import AZURITE_KEY, resolve_auth
    from tests.conftest import azure_prefix

    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING", raising=False)
    container = azure_prefix()
    cmd = 'mkdir -p "$AMLT_DIRSYNC_DIR/ckpt" && echo 7 > "$AMLT_DIRSYNC_DIR/ckpt/step.txt"'
    outcome = await shell(
        cmd, tmp_path, dirsync_to=f"azure://devstoreaccount1/{container}/runs/first"
    )
    assert outcome.ok, outcome.error
    assert b"--- warnings ---" not in outcome.log, outcome.log
    endpoint = resolve_auth("devstoreaccount1", {}).endpoints.blob
    client = ContainerClient(
        endpoint,
        container,
        credential={"account_name": "devstoreaccount1", "account_key": AZURITE_KEY},
    )
    with client:
        names = [b.name for b in client.list_blobs()]
        data = client.download_blob("runs/first/ckpt/step.txt").readall()
        client.delete_container()
    assert (names, data) == (["runs/first/ckpt/step.txt"], b"7\n")


async def test_a_malformed_azure_target_is_a_warning(tmp_path: Path) -> None:
    outcome = await shell("true", tmp_path, dirsync_to="azure://devstoreaccount1")
    assert outcome.ok
    assert b"write azure://ACCOUNT/CONTAINER" in outcome.log
