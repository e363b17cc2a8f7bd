"""The configuration file: lookup, precedence, typed keys, paths relative to the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from dagq import config
from dagq.errors import ValidationError

pytestmark = pytest.mark.timeout(10)


def settings(tmp_path: Path, cwd: Path | None = None, **env: str) -> config.Settings:
    return config.load({"XDG_CONFIG_HOME": str(tmp_path / "xdg"), **env}, cwd or tmp_path)


def user(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "xdg" / "dagq" / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_without_files_every_setting_is_its_built_in_default(tmp_path: Path) -> None:
    found = settings(tmp_path)
    assert found.files == []
    assert {s.source for s in found.settings} == {"default"}
    assert found.value("store") == config.DEFAULT_STORE
    assert found.overridden() == {}


def test_the_project_file_is_found_from_a_subdirectory_and_beats_the_users(
    tmp_path: Path,
) -> None:
    user(tmp_path, "store: memory://\nworker: {concurrency: 2, queues: [cpu]}\n")
    project = tmp_path / "project"
    (project / "src" / "deep").mkdir(parents=True)
    (project / ".dagq.yaml").write_text("worker:\n  concurrency: 8\n")
    found = settings(tmp_path, cwd=project / "src" / "deep")
    assert found.value("worker.concurrency") == 8
    assert found.value("worker.queues") == ["cpu"]
    assert found.value("store") == "memory://"
    sources = {s.key: s.source for s in found.settings}
    assert sources["worker.concurrency"] == str(project / ".dagq.yaml")
    assert sources["store"].endswith("config.yaml")


def test_environment_variables_beat_the_files(tmp_path: Path) -> None:
    (tmp_path / "dagq.yaml").write_text("worker: {concurrency: 2}\n")
    found = settings(tmp_path, DAGQ_WORKER_CONCURRENCY="6", DAGQ_WORKER_QUEUES="a, b")
    assert found.value("worker.concurrency") == 6
    assert found.value("worker.queues") == ["a", "b"]
    assert {s.key: s.source for s in found.settings}["worker.queues"] == "env DAGQ_WORKER_QUEUES"


def test_a_relative_sqlite_path_and_import_paths_are_relative_to_the_file(tmp_path: Path) -> None:
    (tmp_path / "dagq.yaml").write_text(
        "store: sqlite:///state/dagq.db\nworker: {import_paths: [src]}\n"
    )
    sub = tmp_path / "a" / "b"
    sub.mkdir(parents=True)
    found = settings(tmp_path, cwd=sub)
    assert found.value("store") == f"sqlite:///{tmp_path.resolve()}/state/dagq.db"
    assert found.value("worker.import_paths") == [str(tmp_path.resolve() / "src")]


def test_an_absolute_sqlite_path_is_kept(tmp_path: Path) -> None:
    (tmp_path / "dagq.yaml").write_text("store: sqlite:////var/dagq.db\n")
    assert settings(tmp_path).value("store") == "sqlite:////var/dagq.db"


@pytest.mark.parametrize(
    ("text", "mentions"),
    [
        ("stor: memory://\n", "unknown key 'stor'"),
        ("worker: {concurency: 2}\n", "unknown key 'worker.concurency'"),
        ("worker: {concurrency: lots}\n", "worker.concurrency"),
        ("run: {workers: 0}\n", "run.workers"),
        ("worker: {processor: not a function}\n", "worker.processor"),
        ("- a list\n", "a mapping of settings"),
        ("store: [unclosed\n", "invalid YAML"),
    ],
)
def test_a_bad_file_is_refused_in_one_line_naming_the_file_and_key(
    tmp_path: Path, text: str, mentions: str
) -> None:
    (tmp_path / "dagq.yaml").write_text(text)
    with pytest.raises(ValidationError) as caught:
        settings(tmp_path)
    message = str(caught.value)
    assert "\n" not in message
    assert str(tmp_path / "dagq.yaml") in message
    assert mentions in message


def test_a_bad_environment_value_is_refused_naming_the_variable(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="DAGQ_RUN_WORKERS='x': expected an integer"):
        settings(tmp_path, DAGQ_RUN_WORKERS="x")


def test_two_project_files_in_one_directory_are_refused(tmp_path: Path) -> None:
    (tmp_path / "dagq.yaml").write_text("{}\n")
    (tmp_path / ".dagq.yaml").write_text("{}\n")
    with pytest.raises(ValidationError, match="both exist"):
        settings(tmp_path)


def test_dagq_config_names_the_only_file_read_or_none(tmp_path: Path) -> None:
    user(tmp_path, "store: memory://\n")
    other = tmp_path / "elsewhere.yaml"
    other.write_text("run: {workers: 9}\n")
    found = settings(tmp_path, DAGQ_CONFIG=str(other))
    assert found.files == [str(other)]
    assert found.value("run.workers") == 9
    assert found.value("store") == config.DEFAULT_STORE
    assert settings(tmp_path, DAGQ_CONFIG="none").files == []


def test_the_template_is_a_valid_file_of_the_defaults(tmp_path: Path) -> None:
    (tmp_path / "dagq.yaml").write_text(config.template("memory://"))
    found = settings(tmp_path)
    assert found.value("store") == "memory://"
    assert found.value("worker.queues") == ["default"]
    assert found.value("run.workers") == 4


def test_settings_become_the_defaults_of_the_commands_that_take_them() -> None:
    import click

    from dagq.cli.settings import default_map

    @click.group()
    def main() -> None: ...

    @main.command()
    @click.option("--store", "store_url")
    @click.option("--workers")
    @click.option("--processor")
    def run(**_: object) -> None: ...

    @main.command()
    @click.option("--store", "store_url")
    @click.option("-q", "--queue", "queues", multiple=True)
    def worker(**_: object) -> None: ...

    @main.group()
    def dlq() -> None: ...

    @dlq.command("list")
    @click.option("--store", "store_url")
    def dlq_list(**_: object) -> None: ...

    @main.command()
    def validate() -> None: ...

    overridden = {
        "store": "memory://",
        "run.processor": "pkg.mod:fn",
        "worker.queues": ["cpu"],
        "worker.concurrency": 3,  # no such option here: left out
    }
    assert default_map(main, overridden) == {
        "run": {"store_url": "memory://", "processor": "pkg.mod:fn"},
        "worker": {"store_url": "memory://", "queues": ["cpu"]},
        "dlq": {"list": {"store_url": "memory://"}},
    }
