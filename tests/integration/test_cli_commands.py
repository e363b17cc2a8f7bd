"""Every command of issue 3 against a running cluster: fields, exit codes, effects.

One ``dagq coordinator`` and one ``dagq worker`` (default queue, Python tasks from
this repository) serve the module's store; each test submits workflows under ids of
its own. Tasks append to side-effect logs, so a test can tell what really ran again.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dagq import keys
from dagq.messages import OUTPUT_INLINE_LIMIT
from dagq.stores.base import Store
from tests.integration.cli_harness import (
    ROOT,
    DagqCli,
    lines,
    pid_alive,
    read_pids,
    wait_until,
)

pytestmark = pytest.mark.timeout(30)

STATUS_FIELDS = {
    "id",
    "name",
    "status",
    "total",
    "done",
    "counts",
    "created_at",
    "updated_at",
    "finished_at",
    "error",
    "failed",
}
TASK_FIELDS = {
    "name",
    "status",
    "attempt",
    "queue",
    "started_at",
    "finished_at",
    "duration_s",
    "error",
    "output_ref",
    "compensation",
    "items",
    "failed_items",
}
LIST_FIELDS = {
    "id",
    "name",
    "status",
    "total",
    "counts",
    "created_at",
    "updated_at",
    "tenant",
    "error",
    "labels",
}
EVENT_FIELDS = {"at", "kind", "task", "attempt", "detail", "actor"}
DOCTOR_FIELDS = {"level", "check", "detail", "fix"}
SUBMIT_FIELDS = {"id", "created"}

#: Fails until the file '<task>.fixed' exists; logs every run.
GATED = 'echo "$DAGQ_TASK" >> {log}; test -f "$DAGQ_TASK.fixed"'


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DagqCli]:
    with DagqCli(tmp_path_factory.mktemp("commands")) as cli:
        cli.start_coordinator()
        cli.start_worker("-q", "default", "-c", "4", "--import-path", ROOT)
        yield cli


@pytest.fixture
def cli(cluster: DagqCli) -> Iterator[DagqCli]:
    with cluster.scope() as cli:
        yield cli


def submit(cli: DagqCli, workflow_id: str, tasks: list[dict[str, Any]]) -> Path:
    """``dagq submit`` of a new workflow file; the file."""
    wf = cli.workflow(f"{workflow_id}.yaml", {"name": workflow_id, "tasks": tasks})
    result = cli.run("submit", wf, "--id", workflow_id)
    assert result.code == 0, result.output
    return wf


def finished(cli: DagqCli, workflow_id: str, tasks: list[dict[str, Any]]) -> str:
    cli.submit_here(workflow_id, {"name": workflow_id, "tasks": tasks})
    return cli.wait_for_end(workflow_id, timeout_s=15)


def stored(cli: DagqCli, workflow_id: str, task: str) -> tuple[int, str | None]:
    """A task's attempt and output reference, read from the store in this process."""
    _, plan, st = cli.run_state(workflow_id)
    i = plan.by_name[task]
    return st.attempt[i], st.output_refs.get(i)


@pytest.fixture(scope="module")
def done_id(cluster: DagqCli) -> str:
    """A completed workflow whose one task failed once before succeeding."""
    chatty = 'echo "attempt $DAGQ_ATTEMPT speaking"; test "$DAGQ_ATTEMPT" -ge 2'
    tasks = [
        {"name": "first", "cmd": "true"},
        {
            "name": "chatty",
            "depends_on": ["first"],
            "cmd": chatty,
            "num_retries": 1,
            "retry": {"backoff_s": 0.01, "jitter": 0},
        },
    ]
    assert finished(cluster, "done", tasks) == "completed"
    return "done"


@pytest.fixture(scope="module")
def failed_id(cluster: DagqCli) -> str:
    """A failed workflow: 'boom' exits 3, 'after' never runs."""
    tasks = [
        {"name": "boom", "cmd": "echo kaboom >&2; exit 3"},
        {"name": "after", "depends_on": ["boom"], "cmd": "true"},
    ]
    assert finished(cluster, "failed", tasks) == "failed"
    return "failed"


# --- stable JSON --------------------------------------------------------------------


def test_submit_json_fields_are_stable(cli: DagqCli) -> None:
    wf = cli.workflow("fields.yaml", {"name": "fields", "tasks": [{"name": "a", "cmd": "true"}]})
    assert set(cli.json("submit", wf, "--id", "fields")) == SUBMIT_FIELDS


def test_status_json_fields_are_stable(cli: DagqCli, failed_id: str) -> None:
    status = cli.json("status", failed_id)

    assert set(status) == STATUS_FIELDS
    assert status["failed"], "a failed workflow lists its failed tasks"
    assert all(set(task) == TASK_FIELDS for task in status["failed"])


def test_tasks_json_fields_are_stable(cli: DagqCli, done_id: str) -> None:
    tasks = cli.json("tasks", done_id)

    assert [t["name"] for t in tasks] == ["first", "chatty"]
    assert all(set(task) == TASK_FIELDS for task in tasks)


def test_list_json_fields_are_stable(cli: DagqCli, done_id: str) -> None:
    rows = cli.json("list")

    assert done_id in {row["id"] for row in rows}
    assert all(set(row) == LIST_FIELDS for row in rows)


def test_events_json_fields_are_stable(cli: DagqCli, done_id: str) -> None:
    events = cli.json("events", done_id)

    assert events
    assert all(set(event) == EVENT_FIELDS for event in events)


def test_doctor_json_fields_are_stable(cli: DagqCli) -> None:
    findings = cli.json("doctor")

    assert findings
    assert all(set(finding) == DOCTOR_FIELDS for finding in findings)


# --- status and list ----------------------------------------------------------------


def test_status_watch_exits_1_for_a_failed_workflow(cli: DagqCli, failed_id: str) -> None:
    result = cli.run("status", failed_id, "--watch", timeout_s=15)

    assert result.code == 1, result.output
    assert "boom" in result.stdout
    assert "exit code 3" in result.stdout


def test_status_json_names_the_failed_task_and_its_error(cli: DagqCli, failed_id: str) -> None:
    status = cli.json("status", failed_id)

    assert status["status"] == "failed"
    failed = {t["name"]: (t["status"], t["error"]) for t in status["failed"]}
    assert failed["boom"][0] == "failed"
    assert "exit code 3" in failed["boom"][1]
    assert "kaboom" in failed["boom"][1]
    assert failed["after"][0] == "upstream_failed"


def test_list_filters_by_status_and_name(cli: DagqCli, done_id: str, failed_id: str) -> None:
    failed_rows = cli.json("list", "--status", "failed")
    named = cli.json("list", "--name", done_id)

    assert failed_id in {row["id"] for row in failed_rows}
    assert {row["status"] for row in failed_rows} == {"failed"}
    assert [row["id"] for row in named] == [done_id]


def test_tasks_state_filter_keeps_only_tasks_in_that_state(cli: DagqCli, failed_id: str) -> None:
    tasks = cli.json("tasks", failed_id, "--state", "upstream_failed")

    assert [t["name"] for t in tasks] == ["after"]


# --- submit -------------------------------------------------------------------------


def test_submit_again_with_the_same_id_and_definition_returns_the_same_id(cli: DagqCli) -> None:
    wf = submit(cli, "twice", [{"name": "a", "cmd": "true"}])

    again = cli.json("submit", wf, "--id", "twice")

    assert again == {"id": "twice", "created": False}


def test_submit_with_an_existing_id_and_a_different_definition_exits_2(cli: DagqCli) -> None:
    submit(cli, "clash", [{"name": "a", "cmd": "true"}])
    other = cli.workflow("other.yaml", {"name": "clash", "tasks": [{"name": "b", "cmd": "true"}]})

    result = cli.run("submit", other, "--id", "clash")

    assert result.code == 2, result.output
    assert "'clash'" in result.stderr
    assert "different definition" in result.stderr
    assert "Traceback" not in result.output


def test_submit_without_an_id_prints_a_new_one(cli: DagqCli) -> None:
    wf = cli.workflow("anon.yaml", {"name": "anon", "tasks": [{"name": "a", "cmd": "true"}]})

    first = cli.run("submit", wf)
    second = cli.run("submit", wf)

    assert first.code == second.code == 0
    assert first.stdout.strip().startswith("anon-")
    assert first.stdout.strip() != second.stdout.strip()


# --- cancel -------------------------------------------------------------------------


def test_cancel_of_a_running_workflow_ends_it_cancelled(cli: DagqCli) -> None:
    cli.submit_here(
        "stopme",
        {
            "name": "stopme",
            "tasks": [
                {"name": "nap", "cmd": "echo $$ >> stopme.pids; sleep 30"},
                {"name": "after", "depends_on": ["nap"], "cmd": "true"},
            ],
        },
    )
    pids = wait_until(
        lambda: read_pids(cli.workdir / "stopme.pids"), timeout_s=10, what="'nap' to start"
    )

    result = cli.run("cancel", "stopme")
    watch = cli.run("status", "stopme", "--watch", timeout_s=15)

    assert result.code == 0, result.output
    assert watch.code == 1, watch.output
    assert cli.statuses("stopme") == {"nap": "cancelled", "after": "cancelled"}
    assert cli.workflow_status("stopme") == "cancelled"
    wait_until(lambda: not pid_alive(pids[0]), timeout_s=10, what="'nap' to be killed")


# --- retry --------------------------------------------------------------------------


def _retry_workflow(cli: DagqCli, workflow_id: str, gates: tuple[str, ...]) -> None:
    log = f"{workflow_id}.log"
    tasks: list[dict[str, Any]] = [{"name": "ok", "cmd": f"echo ok >> {log}"}]
    for gate in gates:
        tasks.append({"name": gate, "depends_on": ["ok"], "cmd": GATED.format(log=log)})
        tasks.append(
            {"name": f"{gate}-after", "depends_on": [gate], "cmd": f"echo {gate}-after >> {log}"}
        )
    tasks.append({"name": "side", "depends_on": ["ok"], "cmd": f"echo side >> {log}"})
    assert finished(cli, workflow_id, tasks) == "failed"


def _ran(cli: DagqCli, workflow_id: str) -> list[str]:
    return sorted(lines(cli.workdir / f"{workflow_id}.log"))


def test_retry_reruns_only_failed_and_upstream_failed_tasks_and_completes(cli: DagqCli) -> None:
    _retry_workflow(cli, "again", ("gate",))
    (cli.workdir / "gate.fixed").touch()

    result = cli.run("retry", "again")
    watch = cli.run("status", "again", "--watch", timeout_s=15)

    assert result.code == 0, result.output
    assert watch.code == 0, watch.output
    assert cli.workflow_status("again") == "completed"
    assert _ran(cli, "again") == ["gate", "gate", "gate-after", "ok", "side"]
    assert stored(cli, "again", "gate")[0] == 2


def test_retry_of_one_task_reruns_it_and_its_dependants_only(cli: DagqCli) -> None:
    _retry_workflow(cli, "pick", ("left", "right"))
    (cli.workdir / "left.fixed").touch()
    (cli.workdir / "right.fixed").touch()

    result = cli.run("retry", "pick", "--task", "left")
    first_watch = cli.run("status", "pick", "--watch", timeout_s=15)

    assert result.code == 0, result.output
    assert first_watch.code == 1, "'right' is still failed"
    assert cli.statuses("pick") == {
        "ok": "completed",
        "left": "completed",
        "left-after": "completed",
        "right": "failed",
        "right-after": "upstream_failed",
        "side": "completed",
    }
    assert cli.run("retry", "pick", "--task", "right").code == 0
    assert cli.run("status", "pick", "--watch", timeout_s=15).code == 0
    assert _ran(cli, "pick") == [
        "left",
        "left",
        "left-after",
        "ok",
        "right",
        "right",
        "right-after",
        "side",
    ]


def test_retry_of_a_compensated_run_is_refused_up_front_with_exit_2(cli: DagqCli) -> None:
    tasks = [
        {"name": "charge", "cmd": "true", "compensate": {"cmd": "echo refund >> refunds.log"}},
        {"name": "ship", "depends_on": ["charge"], "cmd": "exit 1"},
    ]
    assert finished(cli, "undone", tasks) == "failed"
    assert lines(cli.workdir / "refunds.log") == ["refund"]

    result = cli.run("retry", "undone")

    assert result.code == 2, result.output
    assert "retry requested" not in result.output
    [line] = result.stderr.strip().splitlines()
    assert "undone cannot be retried" in line and "compensated" in line and "new id" in line
    assert cli.workflow_status("undone") == "failed"


# --- output, logs, events -----------------------------------------------------------


@pytest.fixture(scope="module")
def data_id(cluster: DagqCli) -> str:
    size = OUTPUT_INLINE_LIMIT + 1000
    tasks = [
        {"name": "small", "call": "tests.sample_tasks:echo", "args": {"n": 2, "word": "hi"}},
        {"name": "big", "call": "tests.sample_tasks:big", "args": {"size": size}},
        {"name": "quiet", "cmd": "true"},
    ]
    assert finished(cluster, "data", tasks) == "completed"
    return "data"


def _output(cli: DagqCli, workflow_id: str, task: str) -> Any:
    result = cli.run("output", workflow_id, task)
    assert result.code == 0, result.output
    return json.loads(result.stdout)


def test_output_prints_an_inline_output_as_json(cli: DagqCli, data_id: str) -> None:
    assert _output(cli, data_id, "small") == {"n": 2, "word": "hi"}
    assert stored(cli, data_id, "small")[1] is None


def test_output_fetches_an_output_stored_by_reference(cli: DagqCli, data_id: str) -> None:
    assert stored(cli, data_id, "big")[1] is not None
    assert _output(cli, data_id, "big") == "x" * (OUTPUT_INLINE_LIMIT + 1000)


def test_output_of_a_task_without_output_is_null(cli: DagqCli, data_id: str) -> None:
    assert _output(cli, data_id, "quiet") is None


def test_logs_show_the_latest_attempt_by_default(cli: DagqCli, done_id: str) -> None:
    result = cli.run("logs", done_id, "chatty")

    assert result.code == 0, result.output
    assert "attempt 2 speaking" in result.stdout
    assert "attempt 1" not in result.stdout


def test_logs_with_attempt_show_that_attempt(cli: DagqCli, done_id: str) -> None:
    result = cli.run("logs", done_id, "chatty", "--attempt", "1")

    assert result.code == 0, result.output
    assert "attempt 1 speaking" in result.stdout


def test_events_tell_the_story_of_a_retried_task(cli: DagqCli, done_id: str) -> None:
    events = cli.json("events", done_id)

    story = [(e["kind"], e["task"], e["attempt"]) for e in events]
    assert story[0] == ("submitted", None, 0)
    assert [s for s in story if s[1] == "chatty"] == [
        ("dispatched", "chatty", 1),
        ("started", "chatty", 1),
        ("retried", "chatty", 1),
        ("dispatched", "chatty", 2),
        ("started", "chatty", 2),
        ("completed", "chatty", 2),
    ]
    assert story[-1] == ("workflow_completed", None, 0)
    assert [e["at"] for e in events] == sorted(e["at"] for e in events)


def test_events_in_a_table_for_people(cli: DagqCli, done_id: str) -> None:
    result = cli.run("events", done_id)

    assert result.code == 0, result.output
    assert "retried" in result.stdout
    assert "chatty" in result.stdout


# --- graph --------------------------------------------------------------------------

DIAMOND = {
    "name": "diamond",
    "tasks": [
        {"name": "top", "cmd": "true"},
        {"name": "left", "depends_on": ["top"], "cmd": "true"},
        {"name": "right", "depends_on": ["top"], "cmd": "true", "condition": "false"},
        {"name": "bottom", "depends_on": ["left", "right"], "cmd": "true"},
    ],
}


Drawing = tuple[set[tuple[str, str]], dict[str, str]]


def _read_dot(text: str) -> Drawing:
    edges, states = set(), {}
    for line in text.splitlines():
        if "->" in line:
            parent, child = line.split("->")
            edges.add((parent.strip('" '), child.split(";")[0].split("[")[0].strip('" ')))
        elif "label=" in line:
            label = line.split('label="')[1].split('"')[0]
            name, _, state = label.partition("\\n")  # DOT's own line break
            if state:
                states[name] = state
    return edges, states


def _read_mermaid(text: str) -> Drawing:
    names, states, edges = {}, {}, set()
    for line in text.splitlines():
        if '["' in line:
            node, label = line.strip().split("[", 1)
            name, _, state = json.loads(label.rstrip("]")).partition("<br/>")
            names[node] = name
            if state:
                states[name] = state.removeprefix("<i>").removesuffix("</i>")
        for arrow in (" --> ", " -.-> "):
            if arrow in line:
                parent, child = line.strip().split(arrow)
                edges.add((names[parent], names[child]))
    return edges, states


def _read_text(text: str) -> Drawing:
    edges, states = set(), {}
    for line in text.splitlines():
        if not line.startswith("  "):
            continue
        words = line.split()
        if len(words) > 1 and words[1].startswith("["):
            states[words[0]] = words[1].strip("[]")
        if "<-" in line:
            parents = line.split("<-")[1].split(" if ")[0]
            edges |= {(p.strip(), words[0]) for p in parents.split(",")}
    return edges, states


def _edges_and_states(fmt: str, text: str) -> Drawing:
    """The edges and node states a drawing shows, read back from its text."""
    readers = {"dot": _read_dot, "mermaid": _read_mermaid, "text": _read_text}
    return readers[fmt](text)


DIAMOND_EDGES = {("top", "left"), ("top", "right"), ("left", "bottom"), ("right", "bottom")}


@pytest.mark.parametrize("fmt", ["mermaid", "dot", "text"])
def test_graph_of_a_file_draws_every_task_and_edge(cli: DagqCli, fmt: str) -> None:
    wf = cli.workflow("diamond.yaml", DIAMOND)

    result = cli.run("graph", wf, "--format", fmt)

    assert result.code == 0, result.output
    edges, states = _edges_and_states(fmt, result.stdout)
    assert edges == DIAMOND_EDGES
    assert states == {}


@pytest.fixture(scope="module")
def diamond_id(cluster: DagqCli) -> str:
    cluster.submit_here("diamond", DIAMOND)
    assert cluster.wait_for_end("diamond", timeout_s=15) == "completed"
    return "diamond"


@pytest.mark.parametrize("fmt", ["mermaid", "dot", "text"])
def test_graph_of_a_workflow_id_shows_each_task_state(
    cli: DagqCli, diamond_id: str, fmt: str
) -> None:
    result = cli.run("graph", diamond_id, "--format", fmt)

    assert result.code == 0, result.output
    edges, states = _edges_and_states(fmt, result.stdout)
    assert edges == DIAMOND_EDGES
    assert states == {
        "top": "completed",
        "left": "completed",
        "right": "skipped",
        "bottom": "completed",
    }


# --- doctor and purge ---------------------------------------------------------------


def test_doctor_is_healthy_with_a_coordinator_running(cli: DagqCli) -> None:
    result = cli.run("doctor")

    assert result.code == 0, result.output
    assert "coordinator" in result.stdout
    assert "held by" in result.stdout


def _documents_of(cli: DagqCli, workflow_id: str) -> list[str]:
    """The keys of every document the store holds for a workflow."""

    async def names(store: Store) -> list[str]:
        docs = store.documents
        single = (keys.definition(workflow_id), keys.state(workflow_id), keys.control(workflow_id))
        found = [key for key in single if await docs.get(key) is not None]
        for prefix in ("history", "outputs", "inputs", "logs"):
            found += await docs.list(f"{prefix}/{workflow_id}/")
        return found

    return cli.with_store(names)


def test_purge_removes_state_outputs_logs_history_and_index_row(cli: DagqCli) -> None:
    size = OUTPUT_INLINE_LIMIT + 10
    tasks = [
        {"name": "big", "call": "tests.sample_tasks:big", "args": {"size": size}},
        {"name": "talk", "cmd": "echo hello"},
    ]  # and a chain whose history outgrows the state's tail into documents
    tasks += [
        {"name": f"c{i}", "cmd": "true", "depends_on": [f"c{i - 1}"] if i else []}
        for i in range(24)
    ]
    assert finished(cli, "purgeme", tasks) == "completed"
    before = _documents_of(cli, "purgeme")
    kinds = {name.split("/")[0] for name in before}
    assert kinds >= {"definitions", "states", "history", "outputs", "logs"}

    result = cli.run("purge", "purgeme")

    assert result.code == 0, result.output
    assert _documents_of(cli, "purgeme") == []
    assert cli.with_store(lambda store: store.index.get("purgeme")) is None
    assert cli.run("status", "purgeme").code == 2
    assert "purgeme" not in {row["id"] for row in cli.json("list")}
