"""What the commands people type most import: only what they use.

Start-up time lives in ``bench/`` (timing tests are not allowed here); these tests pin
its cause instead. ``python -X importtime -m dagq ...`` runs the command as typed and
names, on stderr, every module it imports: ``dagq validate`` must not load the runtime
or rich, a SQLite run must load none of the optional extras (Azure, PostgreSQL, the
server, OpenTelemetry) nor importlib.metadata, and what prints plain lines (``status``
and ``list`` piped, ``run --quiet``) must not load rich, which only draws.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.cli_harness import DagqCli, dagq_command

pytestmark = pytest.mark.timeout(90)

#: The optional extras' packages: never for a SQLite store.
EXTRAS = ("azure", "aiohttp", "psycopg", "psycopg_pool", "fastapi", "uvicorn", "starlette")
EXTRAS += ("sse_starlette", "opentelemetry", "prometheus_client")


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[DagqCli]:
    with DagqCli(tmp_path) as cli:
        cli.workflow(
            "small.yaml",
            {
                "name": "small",
                "tasks": [
                    {"name": "a", "cmd": "true"},
                    {"name": "b", "depends_on": ["a"], "cmd": "true"},
                    {"name": "c", "depends_on": ["b"], "cmd": "true"},
                ],
            },
        )
        yield cli


def python(
    cli: DagqCli, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` run as ``cli`` runs dagq (its directory, its environment and
    ``env``); it must succeed."""
    done = subprocess.run(
        [sys.executable, *args],
        cwd=cli.workdir,
        env={**cli.env, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def imported(cli: DagqCli, *args: str) -> set[str]:
    """The modules ``dagq ARGS`` imports, as ``-X importtime`` names them."""
    words = cli.command(*args)[len(dagq_command()) :]
    done = python(cli, "-X", "importtime", "-m", "dagq", *words)
    return set(importtime_order(done.stderr))


def importtime_order(stderr: str) -> list[str]:
    """The modules that ``-X importtime`` names in ``stderr``, in the order it does."""
    return [
        line.rpartition("|")[2].strip()
        for line in stderr.splitlines()
        if line.startswith("import time:")
    ]


def imported_by(statement: str) -> set[str]:
    """The modules ``python -c STATEMENT`` imports."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", statement],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return set(importtime_order(done.stderr))


def loaded(modules: set[str], *packages: str) -> list[str]:
    """Those of ``modules`` that are ``packages`` or inside them."""
    return sorted(m for m in modules if m.partition(".")[0] in packages or m in packages)


def test_validate_loads_neither_the_runtime_nor_rich(cli: DagqCli) -> None:
    modules = imported(cli, "validate", "small.yaml")

    assert "dagq.loading" in modules  # what validate is about: the measure is working
    assert loaded(modules, "rich", "asyncio", "sqlite3", *EXTRAS) == []
    runtime = ("dagq.coordinator", "dagq.worker", "dagq.local", "dagq.cli.run", "dagq.stores")
    assert loaded(modules, *runtime) == []
    # Its values are msgspec structs (a dataclass is compiled from source as it is
    # defined); difflib only suggests a name for a field a file gets wrong.
    assert loaded(modules, "dataclasses", "difflib") == []


def test_a_sqlite_run_loads_no_extra_nor_importlib_metadata(cli: DagqCli) -> None:
    modules = imported(cli, "run", "small.yaml", "--id", "s", "--quiet")

    assert "dagq.stores.sqlite" in modules
    assert loaded(modules, *EXTRAS) == []
    assert "importlib.metadata" not in modules


def test_status_of_a_sqlite_run_loads_no_extra(cli: DagqCli) -> None:
    assert cli.run("run", "small.yaml", "--id", "s", "--quiet").code == 0

    modules = imported(cli, "status", "s")

    assert "dagq.stores.sqlite" in modules
    assert loaded(modules, *EXTRAS, "dagq.coordinator", "dagq.worker") == []
    assert "importlib.metadata" not in modules


def test_status_piped_loads_neither_rich_nor_what_reads_files(cli: DagqCli) -> None:
    assert cli.run("run", "small.yaml", "--id", "s", "--quiet").code == 0

    modules = imported(cli, "status", "s")

    assert "dagq.cli.status" in modules
    readers = ("yaml", "dagq.loading", "dagq.builder", "dagq.stores.memory", "dagq.stores.faults")
    assert loaded(modules, "rich", *readers) == []


def test_status_reads_the_definition_without_the_submit_path(cli: DagqCli) -> None:
    assert cli.run("run", "small.yaml", "--id", "s", "--quiet").code == 0

    modules = imported(cli, "status", "s")

    assert "dagq.submitted" in modules  # the definition document is read
    assert loaded(modules, "dagq.submission", "dagq.observability") == []


def test_status_of_a_file_without_templates_loads_no_expression_language(cli: DagqCli) -> None:
    assert cli.run("run", "small.yaml", "--id", "s", "--quiet").code == 0

    modules = imported(cli, "status", "s")

    assert "dagq.plan" in modules  # the plan is compiled: the measure is working
    # Commands without {{ }} and tasks without conditions parse nothing; the values
    # read are msgspec structs, not dataclasses; dead letters are another command's.
    unused = ("dagq.expression", "dagq.validation", "dagq.dead_letters", "dataclasses")
    assert loaded(modules, *unused) == []


def test_a_quiet_run_loads_no_rich_and_launches_the_zygote_before_the_runtime(
    cli: DagqCli,
) -> None:
    cli.workflow(
        "py.yaml",
        {"name": "py", "tasks": [{"name": "a", "call": "tests.sample_tasks:pid"}]},
    )
    words = cli.command("run", "py.yaml", "--id", "p", "--quiet")[len(dagq_command()) :]
    # The tests' modules importable, and the dagq under test still first if it is there.
    paths = [str(Path(__file__).resolve().parents[2]), cli.env.get("PYTHONPATH", "")]
    source = {"PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    done = python(cli, "-X", "importtime", "-m", "dagq", *words, env=source)
    assert done.stdout.startswith("completed: p")
    order = importtime_order(done.stderr)

    assert loaded(set(order), "rich") == []
    # The zygote is launched from dagq.zygote before the command is built or the file
    # read (dagq.cli.early), let alone the runtime's modules loaded.
    launched = order.index("dagq.zygote")
    assert launched < order.index("dagq.cli.commands.run")
    assert launched < order.index("yaml") < order.index("dagq.local")
    assert "dagq.runners" not in order[:launched]  # nor what a task's context needs


def test_the_zygote_imports_only_what_running_a_task_needs() -> None:
    """The zygote (and each pool process it forks) imports what calling a task and
    answering the worker need — not socket's enums, json, hashlib's OpenSSL nor the
    metrics, and nothing of the runtime."""
    modules = imported_by("import dagq.runners.child")

    assert {"dagq.runners.child", "msgspec", "pickle", "_socket"} <= modules
    unused = ("socket", "json", "hashlib", "_hashlib", "asyncio", "subprocess", "click", "yaml")
    assert loaded(modules, *unused) == []
    runtime = ("dagq.observability.metrics", "dagq.worker", "dagq.stores", "dagq.zygote")
    assert loaded(modules, *runtime) == []


def test_list_reads_the_index_without_plans_views_or_the_client(cli: DagqCli) -> None:
    assert cli.run("run", "small.yaml", "--id", "s", "--quiet").code == 0

    modules = imported(cli, "list")

    assert "dagq.listing" in modules
    heavy = ("dagq.client", "dagq.views", "dagq.plan", "dagq.expression", "dagq.coordinator")
    assert loaded(modules, *heavy, *EXTRAS, "rich") == []


def test_help_lists_every_command_with_its_short_help(cli: DagqCli) -> None:
    import click

    from dagq.cli import COMMANDS, main

    done = cli.run("--help")

    assert done.code == 0
    rows = done.stdout.partition("Commands:")[2].splitlines()
    listed = [line.split(None, 1) for line in rows if line.strip()]
    assert [name for name, _ in listed] == sorted(COMMANDS)
    for name, short in listed:
        command = main.get_command(click.Context(main), name)
        assert command is not None and command.help is not None
        # The short help is the start of the command's own help (cut with "...").
        assert " ".join(command.help.split()).startswith(short.removesuffix("...")), name


@pytest.mark.parametrize(
    "words",
    [
        *[(name,) for name in ("run", "validate", "status", "list", "worker", "submit")],
        ("quarantine", "list"),
        ("dlq", "replay"),
        ("token", "create"),
        ("config", "show"),
        ("store", "copy"),
    ],
)
def test_each_command_shows_its_own_help(cli: DagqCli, words: tuple[str, ...]) -> None:
    done = cli.run(*words, "--help")

    assert done.code == 0
    assert done.stdout.startswith(f"Usage: dagq {' '.join(words)} ")


def test_importing_the_cli_builds_no_command() -> None:
    modules = imported_by("import dagq.cli")

    assert "dagq.cli" in modules
    assert [m for m in modules if m.startswith("dagq.cli.")] == []
    assert loaded(modules, "asyncio", "msgspec", "logging", "rich", "yaml", *EXTRAS) == []


def test_a_command_imports_no_other_commands_module(cli: DagqCli) -> None:
    assert cli.run("run", "small.yaml", "--id", "s", "--quiet").code == 0

    commands = {m for m in imported(cli, "status", "s") if m.startswith("dagq.cli.commands.")}
    assert commands == {"dagq.cli.commands.status"}
    commands = {
        m for m in imported(cli, "validate", "small.yaml") if m.startswith("dagq.cli.commands.")
    }
    assert commands == {"dagq.cli.commands.validate"}


def test_the_process_leaves_what_is_alive_to_its_exit(cli: DagqCli) -> None:
    """``dagq`` as a process freezes what is alive as it ends (its last collections would
    walk it all); called with arguments, as tests call it, it freezes nothing."""
    report = (
        "import atexit, gc; atexit.register(lambda: print('frozen', gc.get_freeze_count() > 0))"
    )
    run_main = (
        "import sys; from dagq.cli import main; sys.argv = ['dagq', 'validate', 'small.yaml']"
    )
    for call, frozen in (("main()", True), ("main.main(sys.argv[1:])", False)):
        done = python(cli, "-c", f"{report}; {run_main}; {call}")
        assert done.stdout.splitlines()[-1] == f"frozen {frozen}", call


def test_the_structs_read_at_start_up_hold_no_string_annotations() -> None:
    """msgspec turns a string annotation into a ForwardRef it compiles and evaluates, the
    first time a type is decoded: the structs every command decodes are written with
    evaluated annotations (their modules do without ``from __future__ import
    annotations``)."""
    import msgspec

    from dagq import definition, history, messages, registry, snapshots, submitted

    modules = (definition, history, messages, registry, snapshots, submitted)
    structs = [
        value
        for module in modules
        for value in vars(module).values()
        if isinstance(value, type)
        and issubclass(value, msgspec.Struct)
        and value.__module__ == module.__name__
        and value is not submitted.Created  # never decoded: it holds a Plan
    ]

    assert len(structs) > 20
    quoted = [
        f"{struct.__name__}.{name}"
        for struct in structs
        for name, kind in vars(struct).get("__annotations__", {}).items()
        if isinstance(kind, str)
    ]
    assert quoted == []


#: ``python WATCH ARGS`` runs ``dagq ARGS`` and writes to the file named by $RICH_AT the
#: time (``time.time()``, the worker's clock) at which rich is first imported.
WATCH = """
import os, runpy, sys, time

class Watch:
    seen = False

    def find_spec(self, name, path=None, target=None):
        if name == "rich" and not self.seen:
            self.seen = True
            with open(os.environ["RICH_AT"], "w") as file:
                file.write(repr(time.time()))
        return None

sys.meta_path.insert(0, Watch())
runpy.run_module("dagq", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("terminal", [False, True], ids=["piped", "live"])
@pytest.mark.parametrize("pause", [0, 0.6], ids=["short", "drawn-while-running"])
def test_a_new_run_starts_its_first_task_before_importing_rich(
    cli: DagqCli, tmp_path: Path, terminal: bool, pause: float
) -> None:
    """The display (rich, ~25 ms to import) is made once a task has started (a run
    that lasts is drawn while it runs, a short one at its end): the first task does
    not wait for rich, and what is printed is the same."""
    cli.workflow(
        "small.yaml",
        {
            "name": "small",
            "tasks": [
                {"name": "a", "cmd": "true"},
                {"name": "b", "depends_on": ["a"], "cmd": f"sleep {pause}"},
                {"name": "c", "depends_on": ["b"], "cmd": "true"},
            ],
        },
    )
    watch = tmp_path / "watch_rich.py"
    watch.write_text(WATCH)
    marker = tmp_path / "rich_at"
    words = cli.command("run", "small.yaml", "--id", "s")[len(dagq_command()) :]
    env = {"RICH_AT": str(marker)} | ({"FORCE_COLOR": "1"} if terminal else {})
    done = python(cli, str(watch), *words, env=env)

    if not terminal:
        lines = done.stdout.splitlines()
        assert lines[0] == "running small as s"
        assert lines[1].endswith(" tasks/s")  # the progress line, drawn once
        assert lines[2:4] == ["small  s", "task\tstate\tattempts\tduration\terror"]
    assert "workflow completed" in done.stdout
    imported_at = float(marker.read_text())  # rich was imported: to draw
    _, plan, st = cli.run_state("s")
    first = plan.by_name["a"]
    assert 0 < st.started_at[first] < imported_at
    if pause:  # drawn while the run went on, before its last task started
        assert imported_at < st.started_at[plan.by_name["c"]]
