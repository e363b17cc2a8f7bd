"""The Azure store is an optional extra: without it, azure:// says what to install."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(60)

_WITHOUT_AZURE = """
import sys
sys.modules["azure"] = None  # as if the azure extra were not installed
from dagq.errors import ValidationError
from dagq.stores import open_store
try:
    open_store("azure://devstoreaccount1/prefix")
except ValidationError as exc:
    print(exc)
"""


def test_an_azure_url_without_the_extra_names_the_install_command() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_AZURE], capture_output=True, text=True, check=True
    )
    assert "pip install 'dagq[azure]'" in done.stdout
    assert "azure://devstoreaccount1/prefix" in done.stdout


def test_the_core_never_imports_the_azure_sdks() -> None:
    probe = (
        "import sys, dagq, dagq.cli, dagq.client, dagq.stores, dagq.local\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('azure', 'aiohttp')))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
