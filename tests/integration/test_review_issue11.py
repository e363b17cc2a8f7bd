"""Bugs found by the independent review of issue 11 (failure containment).

Each test runs the real ``dagq`` command as a user would, on a scratch SQLite store.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

DAGQ = str(Path(sys.executable).with_name("dagq"))

pytestmark = pytest.mark.timeout(180)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DAGQ_STORE", "DAGQ_FAULTS")}
    env["COLUMNS"] = "200"
    return env


def dagq(
    *args: str, cwd: Path, timeout: float = 60, limit_as: int | None = None
) -> tuple[int | None, str, str]:
    """Run ``dagq ARGS``; the exit code (None if it had to be killed), stdout, stderr."""

    command = [DAGQ, *args]
    if limit_as is not None:  # the address-space bound, set by the shell before exec
        command = ["sh", "-c", f'ulimit -v {limit_as // 1024}; exec "$@"', "sh", *command]
    proc = subprocess.Popen(
        command,
        cwd=cwd,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, err = proc.communicate()
        return None, out, err


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


def task_rows(workflow_id: str, store: str, cwd: Path) -> dict[str, dict[str, Any]]:
    """``dagq tasks ID --json``, by task name."""
    code, out, err = dagq("tasks", workflow_id, "--json", "--store", store, cwd=cwd)
    assert code == 0, err
    return {row["name"]: row for row in json.loads(out)}


def test_dagq_output_made_a_fifo_does_not_hang_dagq_run(tmp_path: Path) -> None:
    wf = write(
        tmp_path / "fifo.yaml",
        """\
        name: fifo
        tasks:
          - name: fifo
            cmd: "rm -f $DAGQ_OUTPUT; mkfifo $DAGQ_OUTPUT"
            timeout_s: 3
            num_retries: 0
          - name: other
            cmd: "sleep 1"
        """,
    )
    store = f"sqlite:///{tmp_path}/dagq.db"
    code, _, err = dagq("run", str(wf), "--store", store, "--id", "f1", cwd=tmp_path, timeout=30)
    assert code == 1, f"dagq run did not end within 30 s (code {code}); stderr: {err[-500:]}"
    rows = task_rows("f1", store, tmp_path)
    assert rows["fifo"]["status"] == "failed"
    assert rows["fifo"]["error"] == "$DAGQ_OUTPUT is not a regular file (a FIFO)"
    assert rows["other"]["status"] == "completed"


@pytest.mark.parametrize(
    ("cmd", "error"),
    [
        (
            "truncate -s 1G $DAGQ_OUTPUT",
            "$DAGQ_OUTPUT is 1073741824 bytes, over the limit of 67108864 bytes (64 MiB) "
            "for a task's output",
        ),
        (
            "ln -sf /dev/zero $DAGQ_OUTPUT",
            "$DAGQ_OUTPUT is not a regular file (a character device)",
        ),
    ],
)
def test_a_huge_dagq_output_fails_its_task_with_a_bound_not_memory_error(
    tmp_path: Path, cmd: str, error: str
) -> None:
    wf = write(
        tmp_path / "huge.yaml",
        f"""\
        name: huge
        tasks:
          - name: huge
            cmd: "{cmd}"
            num_retries: 0
          - name: other
            cmd: "true"
        """,
    )
    store = f"sqlite:///{tmp_path}/dagq.db"
    code, out, err = dagq(
        "run",
        str(wf),
        "--store",
        store,
        "--id",
        "h1",
        cwd=tmp_path,
        timeout=90,
        limit_as=1_800_000_000,
    )
    assert code == 1, err[-500:]
    assert "MemoryError" not in out + err, "the output's size should be refused by a bound"
    rows = task_rows("h1", store, tmp_path)
    assert (rows["huge"]["status"], rows["huge"]["attempt"]) == ("failed", 1)
    assert rows["huge"]["error"] == error
    assert rows["other"]["status"] == "completed"


def test_a_python_output_over_the_bound_fails_its_task_in_one_line(tmp_path: Path) -> None:
    write(tmp_path / "big_mod.py", "def big():\n    return 'x' * (64 * 1024 * 1024)\n")
    wf = write(
        tmp_path / "big.yaml",
        """\
        name: big
        tasks:
          - {name: big, call: "big_mod:big", num_retries: 2}
          - {name: other, cmd: "true"}
        """,
    )
    store = f"sqlite:///{tmp_path}/dagq.db"
    code, _, err = dagq("run", str(wf), "--store", store, "--id", "b1", cwd=tmp_path, timeout=90)
    assert code == 1, err[-500:]
    rows = task_rows("b1", store, tmp_path)
    assert (rows["big"]["status"], rows["big"]["attempt"]) == ("failed", 1)  # never retried
    assert rows["big"]["error"] == (
        "the output (as JSON) is 67108866 bytes, over the limit of 67108864 bytes (64 MiB) "
        "for a task's output"
    )
    assert rows["other"]["status"] == "completed"


def test_two_dagq_runs_from_different_directories_both_finish(tmp_path: Path) -> None:
    procs = []
    store = f"sqlite:///{tmp_path}/dagq.db"
    for name in ("alpha", "beta"):
        home = tmp_path / name
        home.mkdir()
        write(
            home / f"{name}_mod.py",
            "import time\ndef work(item):\n    time.sleep(0.2)\n    return item\n",
        )
        write(
            home / "wf.yaml",
            f"""\
            name: {name}
            tasks:
              - name: w
                foreach: "[1,2,3,4,5,6,7,8,9,10,11,12]"
                call: {name}_mod:work
                num_retries: 0
            """,
        )
    for name in ("alpha", "beta"):
        procs.append(
            subprocess.Popen(
                [DAGQ, "run", "wf.yaml", "--store", store, "--id", name, "--quiet"],
                cwd=tmp_path / name,
                env=_env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
        time.sleep(0.3)
    outputs = [p.communicate(timeout=90)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-600:] for o in outputs)


def test_a_damaged_history_chunk_gives_one_line_not_a_traceback(tmp_path: Path) -> None:
    # a chain long enough that its history outgrows the state's tail into documents
    chain = "".join(
        f'  - {{name: t{i}, cmd: "true"{f", depends_on: [t{i - 1}]" if i else ""}}}\n'
        for i in range(24)
    )
    wf = tmp_path / "ok.yaml"
    wf.write_text(f"name: ok\ntasks:\n{chain}")
    store = f"sqlite:///{tmp_path}/dagq.db"
    code, _, err = dagq("run", str(wf), "--store", store, "--id", "h1", cwd=tmp_path)
    assert code == 0, err
    with sqlite3.connect(tmp_path / "dagq.db") as db:
        (key,) = db.execute(
            "select key from documents where key like 'history/h1/%' order by key limit 1 offset 1"
        ).fetchone()
        db.execute("update documents set data = x'00' where key = ?", (key,))
    for args in (("events", "h1"), ("run", str(wf), "--id", "h1"), ("status", "h1")):
        code, out, err = dagq(*args, "--store", store, cwd=tmp_path)
        assert "Traceback" not in out + err, f"dagq {args[0]}: {err[-300:]}"
        assert code == 0, f"dagq {args[0]}: {err[-300:]}"
    code, out, err = dagq("events", "h1", "--json", "--store", store, cwd=tmp_path)
    entries = json.loads(out)
    damaged = [e for e in entries if e["kind"] == "damaged"]
    assert len(damaged) == 1 and damaged[0]["detail"].startswith(f"history chunk {key} is damaged")
    assert entries[0]["kind"] == "submitted" and entries[-1]["kind"] == "workflow_completed"


def quarantined_once(
    store: str, cwd: Path, done: Callable[[dict[str, dict[str, Any]]], bool]
) -> dict[str, dict[str, Any]]:
    """Run a coordinator until ``dagq quarantine list --json`` (by id) satisfies ``done``
    (30 s at most); that listing."""
    coordinator = subprocess.Popen(
        [DAGQ, "coordinator", "--store", store],
        cwd=cwd,
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    listed: dict[str, dict[str, Any]] = {}
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            code, out, _ = dagq("quarantine", "list", "--json", "--store", store, cwd=cwd)
            listed = {item["id"]: item for item in json.loads(out)} if code == 0 else {}
            if done(listed):
                return listed
            time.sleep(0.5)
        pytest.fail(f"the quarantine did not come to the expected listing: {listed}")
    finally:
        coordinator.terminate()
        coordinator.wait(30)


def test_one_damaged_quarantine_record_does_not_hide_the_others(tmp_path: Path) -> None:
    wf = write(
        tmp_path / "wait.yaml",
        """\
        name: wait
        tasks:
          - name: w
            wait_for: {signal: go, timeout_s: 600}
        """,
    )
    store = f"sqlite:///{tmp_path}/dagq.db"
    for wid in ("qa", "qb"):
        code, _, err = dagq("submit", str(wf), "--store", store, "--id", wid, cwd=tmp_path)
        assert code == 0, err
    with sqlite3.connect(tmp_path / "dagq.db") as db:
        db.execute(
            "update documents set data = x'deadbeef' where key in ('states/qa', 'states/qb')"
        )
    quarantined_once(store, tmp_path, lambda listed: {"qa", "qb"} <= set(listed))
    with sqlite3.connect(tmp_path / "dagq.db") as db:
        db.execute("update documents set data = x'ff00ff' where key = 'quarantine/qa'")
    code, out, err = dagq("quarantine", "list", "--store", store, cwd=tmp_path)
    assert "qb" in out, f"exit {code}: {err.strip()}"
    code, out, err = dagq("quarantine", "list", "--json", "--store", store, cwd=tmp_path)
    listed = {item["id"]: item for item in json.loads(out)}
    assert (listed["qa"]["damaged"], listed["qb"]["damaged"]) == (True, False)
    assert "dagq quarantine release qa deletes it" in listed["qa"]["reason"]

    for args in (("status", "qa"), ("run", str(wf), "--id", "qa")):
        code, out, err = dagq(*args, "--store", store, cwd=tmp_path)
        assert "Traceback" not in out + err, f"dagq {args[0]}: {err[-300:]}"
        said = " ".join((out + err).split())
        assert "the quarantine record of qa is damaged" in said, f"dagq {args[0]}: {said}"
        assert "dagq quarantine release qa" in said, f"dagq {args[0]}: {said}"

    code, out, err = dagq("quarantine", "release", "qa", "--store", store, cwd=tmp_path)
    assert code == 0, err
    assert "its damaged quarantine record was deleted" in out
    with sqlite3.connect(tmp_path / "dagq.db") as db:
        assert db.execute("select 1 from documents where key = 'quarantine/qa'").fetchone() is None
    # The coordinator loads qa again, finds its state damaged and quarantines it anew,
    # this time with a readable record.
    listed = quarantined_once(
        store, tmp_path, lambda listed: "qa" in listed and not listed["qa"]["damaged"]
    )
    assert listed["qa"]["reason"].startswith("load failed"), listed["qa"]


def test_an_exception_that_cannot_be_printed_is_still_reported_by_type(tmp_path: Path) -> None:
    write(
        tmp_path / "weird_mod.py",
        """\
        class Weird(Exception):
            def __str__(self):
                raise RuntimeError("str fails")

        def weird():
            raise Weird()
        """,
    )
    wf = write(
        tmp_path / "weird.yaml",
        """\
        name: weird
        tasks:
          - {name: w, call: "weird_mod:weird", num_retries: 0}
        """,
    )
    store = f"sqlite:///{tmp_path}/dagq.db"
    code, out, err = dagq("run", str(wf), "--store", store, "--id", "w1", cwd=tmp_path)
    assert code == 1, err
    error = task_rows("w1", store, tmp_path)["w"]["error"]
    assert error == "Weird: <unprintable: str() raised RuntimeError: str fails>"
    code, out, err = dagq("logs", "w1", "w", "--store", store, cwd=tmp_path)
    assert code == 0, err
    assert "Traceback (most recent call last)" in out
    assert "in weird\n    raise Weird()" in out
