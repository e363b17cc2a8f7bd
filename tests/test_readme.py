"""The README is tested: its commands are the ones CI runs, its examples are valid."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from dagq.loading import load_data
from tests.postgres import Cluster

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
CI = (ROOT / ".ci" / "run").read_text()


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.S)


def test_readme_starts_with_the_two_commands_and_ci_runs_them_verbatim() -> None:
    commands = [b.strip() for b in blocks("bash")[:2]]
    venv = "python3 -m venv .venv && .venv/bin/pip install -e "
    assert commands[0].startswith(venv + ". && .venv/bin/dagq run examples/")
    assert commands[1].startswith(venv + "'.[test]' && ")
    assert "pytest" in commands[1]
    for command in commands:
        assert command in CI


def test_the_main_example_exists() -> None:
    command = blocks("bash")[0]
    example = re.search(r"dagq run (\S+)", command)
    assert example is not None
    assert (ROOT / example.group(1)).is_file()


@pytest.mark.parametrize("text", [b for b in blocks("yaml") if "tasks:" in b])
def test_yaml_examples_in_the_readme_are_valid(text: str) -> None:
    load_data(yaml.safe_load(text), source="README")


def test_condition_examples_in_the_readme_parse() -> None:
    from dagq import expression

    block = next(b for b in blocks("text") if "inputs.train.mae" in b)
    for line in block.splitlines():
        text = line.split("  #")[0].strip()
        if text:
            expression.parse(text)


def test_python_example_in_the_readme_builds_a_valid_definition(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dagq.builder import load_python_file

    source = next(b for b in blocks("python") if "Workflow(" in b)
    module = tmp_path / "readme_example.py"
    module.write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    definition = load_python_file(module)
    assert [t.name for t in definition.tasks] == ["download", "transform", "load"]
    assert definition.tasks[1].call == "readme_example:transform"


def test_client_example_in_the_readme_is_valid_python() -> None:
    import ast

    source = next(b for b in blocks("python") if "Client(" in b)
    compile(source, "README", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    assert "client.wait(" in source


def _python_block(marker: str) -> str:
    return next(b for b in blocks("python") if marker in b)


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    """A directory with the examples, as a fresh clone has them."""
    import shutil

    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    return tmp_path


def _python(source: str, cwd: Path, timeout_s: float) -> str:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", source],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.timeout(120)
def test_the_embedded_run_example_in_the_readme_runs_as_written(scratch: Path) -> None:
    shown = _python(_python_block("dagq.run("), scratch, 100)

    assert shown.startswith("completed {")
    assert (scratch / ".dagq" / "dagq.db").is_file()  # the default store of dagq run


@pytest.mark.timeout(180)
def test_the_client_example_in_the_readme_runs_as_written(scratch: Path) -> None:
    from tests.integration.cli_harness import DagqCli, wait_until

    store = "sqlite:///.dagq/dagq.db"
    with DagqCli(scratch) as cli:
        coordinator = cli.start("coordinator", "--store", store)
        worker = cli.start("worker", "--import-path", "examples", "--store", store)
        for process, line in ((coordinator, "holds the lease"), (worker, " serving ")):
            wait_until(lambda p=process, w=line: w in p.stderr(), timeout_s=30, what=f"'{line}'")

        shown = _python(_python_block("Client("), scratch, 150).splitlines()

    assert shown[0].startswith("completed {")
    assert shown[1].startswith("{")  # the report's output
    assert shown[2] == "['contracts']"


def test_the_param_declarations_in_the_readme_are_valid() -> None:
    from dagq.params import param_specs

    block = next(b for b in blocks("yaml") if "type: string, choices" in b)
    specs = param_specs(yaml.safe_load(block)["params"])

    assert specs["shards"].required
    assert specs["mode"].choices == ("fast", "full")


#: What marks each Python block of the README, and the test that runs it as written.
PYTHON_BLOCKS = {
    "dagq.run(": "test_the_embedded_run_example_in_the_readme_runs_as_written",
    "Client(": "test_the_client_example_in_the_readme_runs_as_written",
    "Workflow(": "test_python_example_in_the_readme_builds_a_valid_definition",
    "WorkflowDefinition.": "test_the_workflow_definition_example_in_the_readme_runs_as_written",
}
#: Shell blocks that show rather than run: benchmarks (minutes long).
SHOWN_ONLY = ("python -m bench",)
#: What marks each other shell block, and the test that runs it as written.
SHELL_BLOCKS = {
    "dagq server": "test_the_server_example_in_the_readme_runs_as_written",
    "dagq store migrate": "test_the_postgresql_setup_in_the_readme_runs_as_written",
    "dagq store copy": "test_the_store_copy_line_in_the_readme_runs_as_written",
}


def test_every_python_and_shell_block_of_the_readme_is_run_by_a_test() -> None:
    for source in blocks("python"):
        marks = [mark for mark in PYTHON_BLOCKS if mark in source]
        assert len(marks) == 1, f"no one test runs this README block:\n{source}"
        assert PYTHON_BLOCKS[marks[0]] in globals()
    for source in blocks("bash")[2:]:
        marks = [mark for mark in SHELL_BLOCKS if mark in source]
        assert len(marks) == 1 or any(s in source for s in SHOWN_ONLY), source
        assert all(SHELL_BLOCKS[mark] in globals() for mark in marks)


#: The PostgreSQL URL the README shows; the tests put a throw-away cluster's in its place.
README_PG_URL = "postgresql://dagq@db.internal:5432/jobs?schema=dagq"


def _shell_lines(source: str) -> list[str]:
    return [line.split("  #")[0].strip() for line in source.splitlines() if line.strip()]


@pytest.mark.timeout(120)
def test_the_postgresql_setup_in_the_readme_runs_as_written(
    scratch: Path, postgres_cluster: Cluster
) -> None:
    """Each line in turn (the extra is installed already); the processes started in the
    background come up on the cluster, and are stopped at the end."""
    from tests.conftest import postgres_url
    from tests.integration.cli_harness import DagqCli, wait_until

    source = next(b for b in blocks("bash") if "dagq store migrate" in b)
    lines = _shell_lines(source.replace(README_PG_URL, postgres_url(postgres_cluster)))
    assert lines[0] == "pip install 'dagq[postgres]'"
    with DagqCli(scratch) as cli:
        for line in lines[1:]:
            words = shlex.split(line.rstrip("&"))
            if words[0] == "export":
                name, _, value = words[1].partition("=")
                cli.env[name] = value
            elif line.endswith("&"):
                started = cli.start(*words[1:])
                ready = " serving " if words[1] == "worker" else "holds the lease"
                wait_until(lambda s=started, r=ready: r in s.stderr(), timeout_s=60, what=ready)
            else:
                done = cli.run(*words[1:])
                assert done.code == 0, done.output
                assert "created, schema version" in done.stdout


@pytest.mark.timeout(120)
def test_the_store_copy_line_in_the_readme_runs_as_written(
    scratch: Path, postgres_cluster: Cluster
) -> None:
    from tests.conftest import postgres_url
    from tests.integration.cli_harness import DagqCli

    source = next(b for b in blocks("bash") if "dagq store copy" in b)
    [line] = _shell_lines(source.replace(README_PG_URL, postgres_url(postgres_cluster)))
    with DagqCli(scratch) as cli:
        cli.store_url = f"sqlite:///{scratch / 'dagq.db'}"  # the line's relative dagq.db
        cli.submit_here("waiting", {"name": "w", "tasks": [{"name": "a", "cmd": "true"}]})
        done = cli.run(*shlex.split(line)[1:])
    assert done.code == 0, done.output
    assert "1 index row(s)" in done.stdout


@pytest.mark.timeout(60)
def test_the_workflow_definition_example_in_the_readme_runs_as_written(scratch: Path) -> None:
    (scratch / "pipeline.yaml").write_text((ROOT / "examples/document_pipeline.yaml").read_text())

    _python(_python_block("WorkflowDefinition."), scratch, 50)


@pytest.mark.timeout(180)
def test_the_server_example_in_the_readme_runs_as_written(scratch: Path) -> None:
    """The curl lines, against a real server (on a free port, not 8080), a coordinator
    and a worker: submit (202 + Location), status, then the stream to the run's end."""
    import socket
    import subprocess

    from tests.integration.cli_harness import DagqCli, wait_until

    source = next(b for b in blocks("bash") if "dagq server" in b)
    server_line, *rest = source.replace("\\\n", " ").splitlines()
    curls = [line for line in rest if line.startswith("curl")]
    shown_id = re.search(r"location: /v1/workflows/(\S+)", source)
    assert shown_id is not None and len(curls) == 3
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    def curl(line: str, run_id: str) -> str:
        line = line.replace("localhost:8080", f"127.0.0.1:{port}")
        line = line.replace(shown_id.group(1), run_id)
        done = subprocess.run(
            ["bash", "-c", line],
            cwd=scratch,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    store = "sqlite:///.dagq/dagq.db"
    assert server_line.split("#")[0].split() == ["dagq", "server", "--store", store]
    with DagqCli(scratch) as cli:
        coordinator = cli.start("coordinator", "--store", store)
        worker = cli.start("worker", "--import-path", "examples", "--store", store)
        server = cli.start("server", "--store", store, "--port", str(port))
        for process, line in (
            (coordinator, "holds the lease"),
            (worker, " serving "),
            (server, f"127.0.0.1:{port}"),
        ):
            wait_until(lambda p=process, w=line: w in p.stderr(), timeout_s=30, what=f"'{line}'")

        submitted = curl(curls[0], "")
        assert submitted.startswith("HTTP/1.1 202 Accepted"), submitted
        location = re.search(r"(?im)^location: /v1/workflows/(\S+)", submitted)
        assert location is not None, submitted
        run_id = location.group(1)
        assert '"status"' in curl(curls[1], run_id)
        streamed = curl(curls[2], run_id)  # ends with the run

    assert "event: end" in streamed and "completed" in streamed.split("event: end")[-1]


@pytest.mark.timeout(120)
def test_the_access_control_example_in_the_readme_runs_as_written(scratch: Path) -> None:
    """Make a token, list it, serve with --auth, read with the token (and not without),
    revoke it: refused within the cache's 5 seconds."""
    import os
    import socket
    import subprocess
    import sys

    from tests.integration.cli_harness import DagqCli, wait_until

    source = next(b for b in blocks("bash") if "dagq token create" in b)
    create, listing, server_line, curl_line, revoke = (
        line.split("  #")[0].strip() for line in source.strip().splitlines()
    )
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    curl_line = curl_line.replace("localhost:8080", f"127.0.0.1:{port}")

    with DagqCli(scratch) as cli:
        env = {**cli.env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}

        def sh(line: str, **extra: str) -> str:
            done = subprocess.run(
                ["bash", "-c", line],
                cwd=scratch,
                env={**env, **extra},
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert done.returncode == 0, done.stderr
            return done.stdout

        token = sh(f'{create} && echo "$TOKEN"').strip()
        assert token.startswith("dagq_")
        [row] = [line.split("\t") for line in sh(listing).splitlines() if "\tingest\t" in line]
        assert row[2:5] == ["operator", "acme", "active"]
        token_id = row[0]

        assert server_line.split() == [
            "dagq",
            "server",
            "--auth",
            "--store",
            "sqlite:///.dagq/dagq.db",
        ]
        server = cli.start(*server_line.split()[1:], "--port", str(port))
        wait_until(lambda: f"127.0.0.1:{port}" in server.stderr(), timeout_s=30, what="the server")

        assert '"items"' in sh(curl_line, TOKEN=token)
        status = " -o /dev/null -w '%{http_code}'"
        assert sh(curl_line + status, TOKEN="") == "401"
        sh(revoke.replace("3f2a9c41d0b7", token_id))
        wait_until(
            lambda: sh(curl_line + status, TOKEN=token) == "401",
            timeout_s=15,
            what="the revoked token to be refused",
            interval_s=0.2,
        )
