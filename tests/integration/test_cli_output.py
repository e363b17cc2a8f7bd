"""What ``dagq`` prints, piped and on a terminal: whole values, escaped control characters,
truthful summaries, and the commands that wait (``status --watch``, ``submit --wait``).

Runs made with ``dagq run`` live in one store (no coordinator: ``run`` drives its own);
runs that need a coordinator and a worker live in another.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from dagq import keys
from dagq.stores.base import OutgoingMessage, Store
from tests.integration.cli_harness import (
    ROOT,
    DagqCli,
    summary_rows,
    wait_for_file,
    wait_until,
)

pytestmark = pytest.mark.timeout(60)

ETA = re.compile(r"\beta\b")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
BOX = set("│┃━─┏┓┗┛┡┩└┘├┤╇╈┳┻═║╭╮╰╯")
#: A run id longer than a narrow column.
LONG_ID = "a-rather-long-workflow-id-that-a-narrow-table-would-cut-short"
#: What task 'a' writes to stderr before it fails: a colour change and a control byte.
HOSTILE = r"printf 'bad \033[31mred\001\n' >&2; exit 3"
ESCAPED = r"bad \x1b[31mred\x01"
UPSTREAM = 30

FAILING = {
    "name": "failing",
    "tasks": [
        {"name": "a", "cmd": HOSTILE},
        {"name": "b", "cmd": "exit 1"},
        {"name": "c", "cmd": "exit 1"},
        {"name": "d", "depends_on": ["a", "b", "c"], "cmd": "true"},
        *({"name": f"fan-{k}", "depends_on": ["d"], "cmd": "true"} for k in range(UPSTREAM)),
    ],
}

SAGA = {
    "name": "saga",
    "tasks": [
        {"name": "charge", "cmd": "echo charged", "compensate": {"cmd": "echo refunded"}},
        {
            "name": "poll",
            "depends_on": ["charge"],
            "cmd": "true",
            "loop": {"until": "iteration >= 3", "max_iterations": 5},
        },
        {
            "name": "flaky",
            "depends_on": ["poll"],
            "cmd": 'test "$DAGQ_ATTEMPT" -ge 2',
            "num_retries": 1,
            "retry": {"backoff_s": 0.01, "jitter": 0},
        },
        {"name": "boom", "depends_on": ["flaky"], "cmd": "exit 1"},
    ],
}

MARKED = {
    "name": "marked",
    "params": {"items": [1, 2, 3]},
    "tasks": [
        {"name": "fan", "foreach": "params.items", "max_parallel": 2, "cmd": "true"},
        {
            "name": "poll",
            "depends_on": ["fan"],
            "cmd": "true",
            "loop": {"until": "iteration >= 2", "max_iterations": 5},
        },
        {"name": "review", "depends_on": ["poll"], "wait_for": {"signal": "approve"}},
        {"name": "cool-off", "depends_on": ["review"], "sleep_s": 60},
        {
            "name": "publish",
            "depends_on": ["cool-off"],
            "cmd": "true",
            "compensate": {"cmd": "true"},
        },
    ],
}


def raw_controls(text: str) -> set[str]:
    """The control characters in ``text`` other than newline, tab and the terminal's own
    escape sequences (colours, cursor moves)."""
    return {c for c in ANSI.sub("", text) if (ord(c) < 32 and c not in "\n\t\r") or c == "\x7f"}


def plain(text: str) -> str:
    """What a terminal's reader sees: the escape sequences taken out."""
    return ANSI.sub("", text).replace("\r", "")


def tab_rows(text: str, first: str) -> list[dict[str, str]]:
    """The rows of the tab-separated table whose header starts with ``first``."""
    rows: list[dict[str, str]] = []
    header: list[str] | None = None
    for line in text.splitlines():
        cells = line.split("\t")
        if cells[0] == first and len(cells) > 1:
            header = cells
        elif header is not None and len(cells) == len(header):
            rows.append(dict(zip(header, cells, strict=True)))
        elif header is not None:
            header = None
    return rows


# --- runs driven by dagq run ---------------------------------------------------------


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DagqCli]:
    with DagqCli(tmp_path_factory.mktemp("output")) as cli:
        yield cli


@pytest.fixture(scope="module")
def failed_run(local: DagqCli) -> str:
    """The summary ``dagq run`` printed (piped) for a run that failed three ways."""
    wf = local.workflow("failing.yaml", FAILING)
    result = local.run("run", wf, "--id", LONG_ID)
    assert result.code == 1, result.output
    return result.stdout


@pytest.fixture(scope="module")
def saga_run(local: DagqCli) -> str:
    wf = local.workflow("saga.yaml", SAGA)
    result = local.run("run", wf, "--id", "saga")
    assert result.code == 1, result.output
    return result.stdout


def test_piped_list_prints_whole_values_so_grep_finds_failed_runs(
    local: DagqCli, failed_run: str
) -> None:
    result = local.run("list")

    assert result.code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split("\t") == ["id", "name", "status", "progress", "created", "error"]
    [row] = [line for line in lines if "\tfailed\t" in line]
    cells = row.split("\t")
    assert cells[:4] == [LONG_ID, "failing", "failed", f"{4 + UPSTREAM}/{4 + UPSTREAM}"]
    assert ESCAPED in cells[5]


@pytest.mark.parametrize(
    "args",
    [
        ("list",),
        ("tasks", LONG_ID),
        ("tasks",),
        ("status", LONG_ID),
        ("events", LONG_ID),
        ("explain", LONG_ID, "a"),
        ("summary", LONG_ID),
        ("logs", LONG_ID, "a"),
    ],
    ids=lambda args: "-".join(args[:1] + args[2:]),
)
def test_piped_output_has_no_colour_box_characters_or_raw_control_characters(
    local: DagqCli, failed_run: str, args: tuple[str, ...]
) -> None:
    result = local.run(*args)

    assert result.code == 0, result.output
    assert "\x1b" not in result.stdout
    assert not raw_controls(result.stdout)
    assert not BOX & set(result.stdout), result.stdout
    assert "…" not in result.stdout.replace("… and ", "")  # a count, never a cut value
    if args[0] != "summary":  # the one that shows no errors
        assert ESCAPED in result.stdout


def test_the_run_summary_is_a_plain_table_with_the_error_escaped(failed_run: str) -> None:
    rows = summary_rows(failed_run)

    assert rows["a"][:2] == ["failed", "1"]
    assert rows["a"][3] == f"exit code 3; stderr: {ESCAPED}"
    assert not raw_controls(failed_run)
    assert "\x1b" not in failed_run


def test_the_error_of_a_task_names_every_failed_parent(local: DagqCli, failed_run: str) -> None:
    rows = tab_rows(local.run("tasks", LONG_ID).stdout, "task")

    [d] = [row for row in rows if row["task"] == "d"]
    assert d["state"] == "upstream_failed"
    assert d["error"] == "3 parent tasks did not succeed: a, b, c"


def test_status_of_a_failed_run_lists_root_causes_and_counts_upstream_failed(
    local: DagqCli, failed_run: str
) -> None:
    result = local.run("status", LONG_ID)

    assert result.code == 0, result.output
    failed = tab_rows(result.stdout, "failed task")
    assert [row["failed task"] for row in failed] == ["a", "b", "c"]
    assert failed[0]["error"] == f"exit code 3; stderr: {ESCAPED}"
    assert f"… and {UPSTREAM + 1} tasks upstream_failed" in result.stdout
    assert "fan-7" not in result.stdout


def test_times_of_another_day_carry_their_date(local: DagqCli, failed_run: str) -> None:
    assert local.run_here("old-run", [{"name": "t", "cmd": "true"}]) == "completed"
    long_ago = time.time() - 3 * 86_400

    async def backdate(store: Store) -> None:
        row = await store.index.get("old-run")
        assert row is not None
        await store.index.upsert(msgspec.structs.replace(row, created_at=long_ago))

    local.with_store(backdate)
    listed = tab_rows(local.run("list").stdout, "id")

    [old] = [row for row in listed if row["id"] == "old-run"]
    assert old["created"] == time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(long_ago))
    [today] = [row for row in listed if row["id"] == LONG_ID]
    assert re.fullmatch(r"\d\d:\d\d:\d\d\.\d{3}", today["created"])


def test_terminal_tables_fold_long_values_instead_of_cutting_them(
    local: DagqCli, failed_run: str
) -> None:
    result = local.run_on_terminal("list", columns=60)

    assert result.code == 0, result.stdout
    shown = plain(result.stdout)
    assert "…" not in shown
    assert "failed" in shown.split()  # the status is never 'f…'
    first_column = "".join(
        line.split("│")[1].strip() for line in shown.splitlines() if line.startswith("│")
    )
    assert LONG_ID in first_column
    assert ANSI.search(result.stdout)  # still coloured on a terminal


@pytest.mark.parametrize("args", [("tasks", LONG_ID), ("status", LONG_ID), ("logs", LONG_ID, "a")])
def test_terminal_output_shows_control_characters_escaped(
    local: DagqCli, failed_run: str, args: tuple[str, ...]
) -> None:
    result = local.run_on_terminal(*args)

    assert result.code == 0, result.stdout
    assert "\x1b[31mred" not in result.stdout
    assert not raw_controls(result.stdout)
    assert ESCAPED in plain(result.stdout)


def test_summary_counts_attempts_apart_from_loop_iterations_and_undos(saga_run: str) -> None:
    rows = summary_rows(saga_run, ("state", "attempts", "iterations", "undos"))

    assert rows["charge"] == ["compensated", "1", "-", "1"]
    assert rows["poll"] == ["completed", "1", "3", "-"]
    assert rows["flaky"] == ["completed", "2", "-", "-"]
    assert rows["boom"] == ["failed", "1", "-", "-"]


def test_a_compensated_task_is_shown_as_such_in_tasks_status_and_graph(
    local: DagqCli, saga_run: str
) -> None:
    listed = tab_rows(local.run("tasks", "saga").stdout, "task")
    tasks = {row["task"]: row["state"] for row in listed}
    status = local.run("status", "saga").stdout
    drawn = local.run("graph", "saga").stdout

    assert tasks["charge"] == "compensated"
    assert "compensated: charge" in status
    assert re.search(r"^\s+charge\s+\[compensated\]", drawn, re.MULTILINE), drawn


def test_graph_marks_foreach_loop_wait_for_sleep_and_compensate(local: DagqCli) -> None:
    wf = local.workflow("marked.yaml", MARKED)

    text = local.run("graph", wf).stdout
    mermaid = local.run("graph", wf, "--format", "mermaid").stdout
    dot = local.run("graph", wf, "--format", "dot").stdout

    marks = {
        "fan": "foreach ≤2 at once",
        "poll": "loop ≤5",
        "review": "wait_for 'approve'",
        "cool-off": "sleep 60s",
        "publish": "compensate",
    }
    for task, mark in marks.items():
        [line] = [line for line in text.splitlines() if line.strip().startswith(task + " ")]
        assert "{" + mark + "}" in line, text
        assert mark in mermaid
        assert mark in dot


# --- runs served by a coordinator and a worker ----------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DagqCli]:
    with DagqCli(tmp_path_factory.mktemp("served")) as cli:
        cli.start_coordinator()
        cli.start_worker("-q", "default", "-c", "4", "--import-path", ROOT)
        yield cli


@pytest.fixture
def served(cluster: DagqCli) -> Iterator[DagqCli]:
    with cluster.scope() as cli:
        yield cli


def gated(name: str, gate: str, *, fail: bool = False) -> dict[str, Any]:
    """A one-task workflow that ends once the file ``gate`` exists (failing if told)."""
    cmd = f"{wait_for_file(gate)}; test -f {gate}" + ("; exit 1" if fail else "")
    return {"name": name, "tasks": [{"name": "work", "cmd": cmd}]}


def status_json(cli: DagqCli, workflow_id: str) -> dict[str, Any]:
    found: dict[str, Any] = cli.json("status", workflow_id)
    return found


def test_status_watch_piped_prints_a_line_per_interval_until_the_run_ends(
    served: DagqCli,
) -> None:
    served.submit_here("watched", gated("watched", "watched.go"))
    watching = served.start("status", "watched", "--watch", "--interval", "0.2")
    wait_until(
        lambda: len(watching.stdout_file.read_text().splitlines()) >= 3,
        timeout_s=20,
        what="three status lines",
    )
    (served.workdir / "watched.go").touch()

    finished = watching.wait(timeout_s=20)

    assert finished.code == 0, finished.output
    lines = finished.stdout.splitlines()
    assert all(re.match(r"^\d\d:\d\d:\d\d\.\d{3} watched \w+ \d+/1 ", line) for line in lines)
    assert " completed 1/1 " in lines[-1]
    assert not any(" completed " in line for line in lines[:-1])
    assert "\x1b" not in finished.stdout


def test_status_watch_exits_1_when_the_run_fails(served: DagqCli) -> None:
    served.submit_here("watched-fail", gated("watched-fail", "wf.go", fail=True))
    watching = served.start("status", "watched-fail", "--watch", "--interval", "0.2")
    (served.workdir / "wf.go").touch()

    finished = watching.wait(timeout_s=20)

    assert finished.code == 1, finished.output
    assert " failed 1/1 " in finished.stdout.splitlines()[-1]


def test_status_watch_on_a_terminal_keeps_its_live_display(served: DagqCli) -> None:
    served.submit_here("live", {"name": "live", "tasks": [{"name": "t", "cmd": "true"}]})
    served.wait_for_end("live", timeout_s=15)

    result = served.run_on_terminal("status", "live", "--watch", "--interval", "0.2")

    assert result.code == 0, result.stdout
    assert "━" in result.stdout  # the progress bar
    assert "completed" in plain(result.stdout)


@pytest.mark.parametrize(("fail", "code", "state"), [(False, 0, "completed"), (True, 1, "failed")])
def test_submit_wait_prints_the_final_status_and_exits_with_its_code(
    served: DagqCli, fail: bool, code: int, state: str
) -> None:
    (served.workdir / f"{state}.go").touch()
    wf = served.workflow(f"{state}.yaml", gated(state, f"{state}.go", fail=fail))

    result = served.run("submit", wf, "--id", f"waited-{state}", "--wait", timeout_s=30)

    assert result.code == code, result.output
    first, last = result.stdout.splitlines()
    assert first == f"waited-{state}"
    assert f" waited-{state} {state} 1/1 " in last


def test_submit_wait_with_json_prints_the_final_status_document(served: DagqCli) -> None:
    (served.workdir / "json.go").touch()
    wf = served.workflow("json.yaml", gated("json", "json.go"))

    result = served.run("submit", wf, "--id", "waited-json", "--wait", "--json", timeout_s=30)

    assert result.code == 0, result.output
    found = json.loads(result.stdout)
    assert (found["id"], found["status"], found["done"]) == ("waited-json", "completed", 1)


def test_submit_wait_gives_up_at_the_timeout_with_exit_3(served: DagqCli) -> None:
    wf = served.workflow("slow.yaml", gated("slow", "slow.go"))

    started = time.monotonic()
    result = served.run("submit", wf, "--id", "slow", "--wait", "--timeout", "0.5")

    assert result.code == 3, result.output
    assert time.monotonic() - started < 15
    assert "error: workflow slow did not end within --timeout 0.5s" in result.stderr
    (served.workdir / "slow.go").touch()
    assert served.wait_for_end("slow", timeout_s=20) == "completed"


def test_submit_timeout_without_wait_is_a_usage_error(served: DagqCli) -> None:
    wf = served.workflow("nowait.yaml", gated("nowait", "nowait.go"))

    result = served.run("submit", wf, "--timeout", "3")

    assert result.code == 2
    assert result.stderr.startswith("error: --timeout goes with --wait")


def _status_once_waiting(cli: DagqCli, workflow_id: str, words: str) -> str:
    """Poll ``dagq status`` (piped) until it says ``words``; its output."""
    found: list[str] = []

    def check() -> bool:
        result = cli.run("status", workflow_id)
        found[:] = [result.stdout]
        return words in result.stdout

    wait_until(check, timeout_s=30, what=f"status to say {words!r}", interval_s=0.3)
    return found[0]


def test_status_of_a_run_waiting_for_a_signal_says_so_instead_of_an_eta(served: DagqCli) -> None:
    served.submit_here(
        "gate",
        {
            "name": "gate",
            "tasks": [
                {"name": "first", "cmd": "true"},
                {"name": "review", "depends_on": ["first"], "wait_for": {"signal": "approve"}},
            ],
        },
    )

    shown = _status_once_waiting(served, "gate", "waiting for signal 'approve'")
    on_terminal = plain(served.run_on_terminal("status", "gate").stdout)

    assert not ETA.search(shown)
    assert "no ETA" in shown
    assert "dagq signal gate approve" in shown
    assert "waiting for signal 'approve'" in on_terminal
    assert not ETA.search(on_terminal)
    assert served.run("signal", "gate", "approve").code == 0
    assert served.wait_for_end("gate", timeout_s=15) == "completed"


def test_status_of_a_run_waiting_for_a_timer_says_so(served: DagqCli) -> None:
    served.submit_here("timer", {"name": "timer", "tasks": [{"name": "cool-off", "sleep_s": 300}]})

    shown = _status_once_waiting(served, "timer", "waiting for a timer")

    assert not ETA.search(shown)
    assert served.run("cancel", "timer").code == 0


def test_status_of_a_run_stuck_on_a_queue_nobody_serves_says_so(served: DagqCli) -> None:
    served.submit_here(
        "stuck", {"name": "stuck", "tasks": [{"name": "t", "queue": "nobody", "cmd": "true"}]}
    )

    shown = _status_once_waiting(served, "stuck", "waiting for a worker")

    assert not ETA.search(shown)
    assert "queue 'nobody'" in shown
    assert served.run("cancel", "stuck").code == 0


# --- dead letters ----------------------------------------------------------------------


def test_an_unreadable_dead_letter_is_shown_escaped_piped_and_on_a_terminal(
    tmp_path: Path,
) -> None:
    body = b"\xff\x00\x1b[2Jhello"
    with DagqCli(tmp_path) as cli:

        async def bury(store: Store) -> None:
            await store.queues.send("q", [OutgoingMessage(body)])
            [message] = await store.queues.receive("q", max_messages=1, visibility_timeout_s=30)
            await store.queues.dead_letter("q", message.receipt, "cannot be parsed")

        cli.with_store(bury)
        [dead] = cli.json("dlq", "list")
        listed = cli.run("dlq", "list")
        shown = cli.run("dlq", "show", dead["key"])
        on_terminal = cli.run_on_terminal("dlq", "show", dead["key"])

    escaped = r"\xff\x00\x1b[2Jhello"
    for result in (listed, shown):
        assert result.code == 0, result.output
        assert escaped in result.stdout
        assert "\x1b" not in result.stdout
        assert not raw_controls(result.stdout)
    assert tab_rows(listed.stdout, "key")[0]["what"] == escaped
    assert "\x1b[2J" not in on_terminal.stdout
    assert escaped in plain(on_terminal.stdout)


def test_quarantine_list_piped_is_a_plain_table(tmp_path: Path) -> None:
    with DagqCli(tmp_path) as cli:
        cli.submit_here("victim", {"name": "victim", "tasks": [{"name": "a", "cmd": "true"}]})

        async def damage(store: Store) -> None:
            await store.documents.put(keys.state("victim"), b"z\x1b[2J\x00 not a state")

        cli.with_store(damage)
        cli.start_coordinator()
        wait_until(
            lambda: cli.json("status", "victim")["status"] == "quarantined",
            timeout_s=30,
            what="the quarantine",
        )
        result = cli.run("quarantine", "list")

    assert result.code == 0, result.output
    [row] = tab_rows(result.stdout, "id")
    assert (row["id"], row["step"]) == ("victim", "load")
    assert row["reason"]
    assert "\x1b" not in result.stdout
    assert not raw_controls(result.stdout)
    assert not BOX & set(result.stdout)


def test_piped_tables_keep_every_line_of_an_error(local: DagqCli) -> None:
    wf = local.workflow(
        "two-lines.yaml",
        {"name": "two-lines", "tasks": [{"name": "t", "cmd": "printf 'one\\ntwo\\n' >&2; exit 3"}]},
    )
    ran = local.run("run", wf, "--id", "two-lines")
    assert ran.code == 1, ran.output

    for shown in (ran.stdout, local.run("tasks", "two-lines").stdout, local.run("list").stdout):
        [row] = [line for line in shown.splitlines() if line.startswith(("t\t", "two-lines\t"))]
        assert "one\\ntwo" in row, shown  # whole, the newline escaped, on one line


#: A right-to-left override and a C1 control: invisible, and they reorder what follows.
SNEAKY = "evil\u202eexe\u0085"


def test_a_name_and_an_output_with_invisible_marks_are_shown_escaped(local: DagqCli) -> None:
    wf = local.workflow(
        "sneaky.yaml",
        {
            "name": SNEAKY,
            "tasks": [{"name": "t", "call": "json:loads", "args": [json.dumps(SNEAKY)]}],
        },
    )
    validated = local.run("validate", wf)
    ran = local.run("run", wf, "--id", "sneaky")
    shown = local.run("output", "sneaky", "t")

    assert "workflow 'evil\\u202eexe\\x85'" in validated.stdout
    assert "running evil\\u202eexe\\x85 as sneaky" in ran.stdout
    # Still JSON, and the same value: the marks are written as JSON escapes.
    assert shown.stdout.strip() == '"evil\\u202eexe\\u0085"'
    assert json.loads(shown.stdout) == SNEAKY
    for text in (validated.stdout, ran.stdout, shown.stdout):
        assert "\u202e" not in text and "\u0085" not in text
