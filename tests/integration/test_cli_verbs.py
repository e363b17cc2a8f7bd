"""The operator verbs of issue 12, run as a user would: explain, summary, submit of several
files, list --recent, tasks across workflows, and the configuration file.

One ``dagq coordinator`` and one ``dagq worker`` (queue ``default``) serve the module's
store; no worker serves queue ``gpu``, so a task sent there waits.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.cli_harness import DagqCli, Finished

pytestmark = pytest.mark.timeout(60)

EXPLAIN_FIELDS = {
    "workflow_id",
    "workflow_status",
    "task",
    "status",
    "summary",
    "attempt",
    "queue",
    "semantics",
    "error",
    "dependencies",
    "condition",
    "retries",
    "waiting_for",
    "events",
}
SUMMARY_FIELDS = {"id", "name", "status", "total", "done", "layers"}
LAYER_FIELDS = {"layer", "total", "done", "counts", "tasks"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DagqCli]:
    with DagqCli(tmp_path_factory.mktemp("verbs")) as cli:
        cli.start_coordinator()
        cli.start_worker("-q", "default", "-c", "2")
        yield cli


@pytest.fixture(scope="module")
def finished_id(cluster: DagqCli) -> str:
    """A failed run: 'a' completes, 'b' is skipped by its condition, 'c' fails after a
    retry, 'd' (any of b, c) cannot run."""
    tasks = [
        {"name": "a", "cmd": """echo '{"score": 0.2}' > "$DAGQ_OUTPUT" """},
        {"name": "b", "depends_on": ["a"], "condition": "inputs.a.score > 0.5", "cmd": "true"},
        {
            "name": "c",
            "depends_on": ["a"],
            "cmd": "echo broken >&2; exit 3",
            "num_retries": 1,
            "retry": {"backoff_s": 0.01, "jitter": 0},
        },
        {"name": "d", "depends_on": ["b", "c"], "dep_policy": "any", "cmd": "true"},
    ]
    cluster.submit_here("explained", {"name": "explained", "tasks": tasks})
    assert cluster.wait_for_end("explained", timeout_s=30) == "failed"
    return "explained"


def run_with_stdin(cli: DagqCli, text: str, *args: str) -> Finished:
    done = subprocess.run(
        cli.command(*args),
        cwd=cli.workdir,
        env=cli.env,
        input=text.encode(),
        capture_output=True,
        timeout=60,
        check=False,
    )
    return Finished(done.returncode, done.stdout.decode(), done.stderr.decode())


def tiny(cli: DagqCli, name: str, **task: Any) -> Path:
    return cli.workflow(f"{name}.yaml", {"name": name, "tasks": [{"name": "t", **task}]})


# --- explain ------------------------------------------------------------------------------


def test_explain_says_why_a_task_was_skipped_by_its_condition(
    cluster: DagqCli, finished_id: str
) -> None:
    result = cluster.run("explain", finished_id, "b")
    assert result.code == 0, result.output
    assert "skipped: condition is false" in result.stdout
    assert "inputs.a.score > 0.5  →  false" in result.stdout
    assert "\x1b[" not in result.stdout  # piped: plain text


def test_explain_json_shows_retries_and_their_reasons(cluster: DagqCli, finished_id: str) -> None:
    found = cluster.json("explain", finished_id, "c")
    assert set(found) == EXPLAIN_FIELDS
    assert found["status"] == "failed"
    assert found["retries"]["max_attempts"] == 2
    assert found["retries"]["attempts_used"] == 2
    kinds = [(e["kind"], e["attempt"]) for e in found["retries"]["attempts"]]
    assert ("retried", 1) in kinds and ("failed", 2) in kinds
    assert "2 of 2 attempts used" in found["summary"]


def test_explain_shows_a_policy_that_can_no_longer_be_satisfied(
    cluster: DagqCli, finished_id: str
) -> None:
    found = cluster.json("explain", finished_id, "d")
    deps = found["dependencies"]
    assert deps["policy"] == "any"
    assert deps["satisfied"] is False
    assert [(p["name"], p["counts_as"]) for p in deps["parents"]] == [
        ("b", "skipped"),
        ("c", "failed"),
    ]


def test_explain_of_a_task_sent_to_a_queue_without_workers_shows_the_queue(
    cluster: DagqCli,
) -> None:
    cluster.submit_here(
        "gpu-wait", {"name": "g", "tasks": [{"name": "t", "cmd": "true", "queue": "gpu"}]}
    )
    found = cluster.json("explain", "gpu-wait", "t")
    for _ in range(100):
        if found["status"] == "ready":
            break
        found = cluster.json("explain", "gpu-wait", "t")
    assert found["status"] == "ready"
    queue = next(w for w in found["waiting_for"] if w["kind"] == "queue")
    assert "queue 'gpu' (1 waiting" in queue["detail"]
    cluster.run("cancel", "gpu-wait")


def test_explain_of_an_unknown_task_or_workflow_is_one_line_and_exit_2(
    cluster: DagqCli, finished_id: str
) -> None:
    for args in (("explain", finished_id, "nope"), ("explain", "nowhere", "t")):
        result = cluster.run(*args)
        assert result.code == 2
        assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: ")
        assert "Traceback" not in result.output


# --- summary ------------------------------------------------------------------------------


def test_summary_counts_each_layer_of_the_dag(cluster: DagqCli, finished_id: str) -> None:
    found = cluster.json("summary", finished_id)
    assert set(found) == SUMMARY_FIELDS
    assert all(set(layer) == LAYER_FIELDS for layer in found["layers"])
    assert [(x["layer"], x["total"], x["done"]) for x in found["layers"]] == [
        (0, 1, 1),
        (1, 2, 2),
        (2, 1, 1),
    ]
    assert found["layers"][1]["counts"] == {"failed": 1, "skipped": 1}
    assert cluster.json("status", finished_id, "--by-layer") == found
    text = cluster.run("summary", finished_id)
    assert text.code == 0
    assert "b, c" in text.stdout and "2/2" in text.stdout


# --- submit of several files --------------------------------------------------------------


def test_submit_of_several_files_submits_each_and_reports_the_bad_one(cluster: DagqCli) -> None:
    good1, good2 = tiny(cluster, "one", cmd="true"), tiny(cluster, "two", cmd="true")
    bad = cluster.write("bad.yaml", "name: bad\ntasks: [{name: t, bogus: 1}]\n")
    result = cluster.run("submit", good1, bad, good2)
    assert result.code == 2
    lines = result.stdout.splitlines()
    assert len(lines) == 2
    assert lines[0].endswith(f" {good1}") and lines[1].endswith(f" {good2}")
    assert "bad.yaml" in result.stderr and "bogus" in result.stderr
    assert result.stderr.count("\n") == 1
    for line in lines:
        assert cluster.json("status", line.split()[0])["name"] in ("one", "two")


def test_submit_reads_paths_from_standard_input(cluster: DagqCli) -> None:
    first, second = tiny(cluster, "in1", cmd="true"), tiny(cluster, "in2", cmd="true")
    result = run_with_stdin(cluster, f"{first}\n\n{second}\n", "submit", "-", "--json")
    assert result.code == 0, result.output
    found = json.loads(result.stdout)
    assert [r["file"] for r in found] == [str(first), str(second)]
    assert all(r["error"] is None and r["created"] for r in found)
    assert len({r["id"] for r in found}) == 2


def test_submit_of_several_files_refuses_one_id_for_them_all(cluster: DagqCli) -> None:
    one = tiny(cluster, "same", cmd="true")
    result = cluster.run("submit", one, one, "--id", "x")
    assert result.code == 2
    assert "--id names one workflow" in result.stderr


# --- list and tasks -----------------------------------------------------------------------


def test_list_recent_gives_the_newest(cluster: DagqCli, finished_id: str) -> None:
    cluster.submit_here("newest", {"name": "n", "tasks": [{"name": "t", "cmd": "true"}]})
    rows = cluster.json("list", "--recent", "1")
    assert [r["id"] for r in rows] == ["newest"]


def test_tasks_across_workflows_filter_by_prefix_queue_state_and_limit(
    cluster: DagqCli, finished_id: str
) -> None:
    tasks = [{"name": f"prep-{k}", "cmd": "true", "queue": "gpu"} for k in range(3)]
    cluster.submit_here(
        "across", {"name": "x", "tasks": [*tasks, {"name": "other", "cmd": "true", "queue": "gpu"}]}
    )
    found = cluster.json("tasks", "--prefix", "prep-")
    assert {(t["workflow"], t["name"]) for t in found} == {
        ("across", "prep-0"),
        ("across", "prep-1"),
        ("across", "prep-2"),
    }
    assert len(cluster.json("tasks", "--queue", "gpu", "--limit", "2")) == 2
    failed = cluster.json("tasks", "--status", "failed")  # ai4s-jobq's name for --state
    assert ("explained", "c") in {(t["workflow"], t["name"]) for t in failed}
    both = cluster.json("tasks", "across", finished_id, "--prefix", "a")
    assert {t["workflow"] for t in both} == {finished_id}
    one = cluster.json("tasks", finished_id, "--prefix", "c")
    assert [t["name"] for t in one] == ["c"] and "workflow" not in one[0]
    text = cluster.run("tasks", "--prefix", "prep-")
    assert "across" in text.stdout and "prep-1" in text.stdout
    cluster.run("cancel", "across")


def test_tasks_with_an_unknown_state_is_one_line_and_exit_2(cluster: DagqCli) -> None:
    result = cluster.run("tasks", "--state", "sleepy")
    assert result.code == 2 and "unknown task state 'sleepy'" in result.stderr


# --- the configuration file -----------------------------------------------------------------


def test_config_init_then_show_from_a_subdirectory(tmp_path: Path) -> None:
    with DagqCli(tmp_path) as cli:
        made = cli.run("config", "init", "--store", "sqlite:///state/dagq.db")
        assert made.code == 0, made.output
        again = cli.run("config", "init")
        assert again.code == 2 and "exists already" in again.stderr
        sub = tmp_path / "src" / "deep"
        sub.mkdir(parents=True)
        shown = subprocess.run(
            [*cli.command("config", "show", "--json")],
            cwd=sub,
            env=cli.env,
            capture_output=True,
            timeout=30,
            check=True,
        )
        found = json.loads(shown.stdout)
        assert found["files"] == [str(tmp_path.resolve() / "dagq.yaml")]
        store = next(s for s in found["settings"] if s["key"] == "store")
        assert store["value"] == f"sqlite:///{tmp_path.resolve()}/state/dagq.db"


def test_the_store_of_the_config_file_is_used_under_env_and_flags(tmp_path: Path) -> None:
    with DagqCli(tmp_path) as cli:
        cli.write("dagq.yaml", "store: sqlite:///from-file.db\n")
        wf = tiny(cli, "configured", cmd="true")
        ran = cli.run("run", wf, "--id", "cfg", "--quiet", store=False)
        assert ran.code == 0, ran.output
        assert (tmp_path / "from-file.db").exists()
        listed = cli.run("list", "--json", store=False)
        assert [r["id"] for r in json.loads(listed.stdout)] == ["cfg"]
        other = f"sqlite:///{tmp_path / 'from-env.db'}"
        by_env = cli.run("list", store=False, env={"DAGQ_STORE": other})
        assert by_env.code == 2 and "from-env.db" in by_env.stderr  # env beats the file
        by_flag = cli.run("list", "--store", other, store=False, env={"DAGQ_STORE": "x://"})
        assert by_flag.code == 2 and "from-env.db" in by_flag.stderr  # the flag beats env


def test_a_worker_serves_the_queues_of_the_config_file(tmp_path: Path) -> None:
    with DagqCli(tmp_path) as cli:
        cli.write("dagq.yaml", "worker:\n  queues: [special]\n  concurrency: 2\n")
        cli.start_coordinator()
        worker = cli.start_worker("--idle-timeout", "30")
        assert "special" in worker.stderr()
        cli.submit_here(
            "q", {"name": "q", "tasks": [{"name": "t", "cmd": "true", "queue": "special"}]}
        )
        assert cli.wait_for_end("q", timeout_s=30) == "completed"


def test_an_unknown_key_in_the_config_file_stops_a_command_in_one_line(tmp_path: Path) -> None:
    with DagqCli(tmp_path) as cli:
        cli.write("dagq.yaml", "worker:\n  concurency: 2\n")
        result = cli.run("list")
        assert result.code == 2
        assert result.stderr.strip() == (
            f"error: {tmp_path.resolve() / 'dagq.yaml'}: unknown key 'worker.concurency' "
            "(known under worker: concurrency, queues, import_paths, processor)"
        )
        shown = cli.run("config", "show")
        assert shown.code == 2 and "worker.concurency" in shown.stderr
