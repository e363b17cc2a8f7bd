"""The server is an optional extra: without it, ``dagq server`` says what to install."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(60)

_WITHOUT_FASTAPI = """
import sys
sys.modules["fastapi"] = None  # as if the server extra were not installed
from dagq.cli import main
main(["server", "--store", "memory://"])
"""


def test_dagq_server_without_the_extra_names_the_install_command() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_FASTAPI], capture_output=True, text=True, check=False
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: dagq server needs the server extra (fastapi")
    assert "pip install 'dagq[server]'" in lines[0]


def test_the_core_never_imports_the_server_libraries() -> None:
    probe = (
        "import sys, dagq, dagq.cli, dagq.client, dagq.stores, dagq.local, dagq.server\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('fastapi', 'uvicorn', 'starlette', 'sse_starlette', 'pydantic')))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
