"""``dagq run`` guesses from its command line, before parsing it, whether the run has
Python tasks (and launches their zygote then): a wrong yes costs an idle process, so
shell-only files and other commands must say no."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dagq.cli.early import runs_python


@pytest.fixture
def files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "py.yaml").write_text("name: p\ntasks:\n- name: a\n  call: m:f\n")
    (tmp_path / "py.json").write_text('{"name": "p", "tasks": [{"name": "a", "call": "m:f"}]}')
    (tmp_path / "sh.yaml").write_text("name: s\ntasks:\n- name: a\n  cmd: 'true'\n")
    flow = "from dagq import Workflow\nflow = Workflow('f')\n"
    (tmp_path / "flow.py").write_text(flow + "@flow.task()\ndef a() -> int:\n    return 1\n")
    (tmp_path / "called.py").write_text(flow + "flow.call('a', 'm:f')\n")
    (tmp_path / "shell.py").write_text(flow + "flow.shell('a', 'true')\n")
    (tmp_path / "notes.txt").write_text("call")
    return tmp_path


@pytest.mark.parametrize(
    "args",
    [
        ["run", "py.yaml"],
        ["run", "--quiet", "py.json", "--id", "x"],
        ["run", "-p", "n=3", "flow.py"],
        ["run", "called.py"],
        ["run", "sh.yaml", "--processor", "m:f"],
        ["run", "sh.yaml", "--processor=m:f"],
    ],
)
def test_a_run_of_python_tasks_is_recognised(files: Path, args: list[str]) -> None:
    assert runs_python(args)


@pytest.mark.parametrize(
    "args",
    [
        ["run", "sh.yaml"],
        ["run", "shell.py"],
        ["run", "missing.yaml"],
        ["run", "notes.txt"],
        ["run", "--help"],
        ["run"],
        ["validate", "py.yaml"],
        ["submit", "py.yaml"],
        [],
    ],
)
def test_anything_else_is_not(files: Path, args: list[str]) -> None:
    assert not runs_python(args)


def test_a_pipe_is_left_for_the_loader_to_read(files: Path) -> None:
    os.mkfifo(files / "fifo.yaml")  # opening it to read would wait for a writer

    assert not runs_python(["run", "fifo.yaml"])
