"""The azure store's HTTP session follows the environment's proxy settings and
``.netrc`` only when there are some (a session that does looks them up, in a thread,
at every request)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("azure.storage.blob")

from dagq.stores.azure_service import _trusts_environment

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def bare(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """An environment without proxy variables, and a home without ``.netrc``."""
    for name in list(os.environ):
        if name.lower().endswith("_proxy") or name == "NETRC":
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def test_without_proxies_or_netrc_the_session_ignores_the_environment(bare: Path) -> None:
    assert not _trusts_environment()


@pytest.mark.parametrize("name", ["HTTPS_PROXY", "http_proxy", "ALL_PROXY", "NETRC"])
def test_a_proxy_variable_is_followed(
    bare: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.setenv(name, "http://127.0.0.1:3128")
    assert _trusts_environment()


def test_a_netrc_file_is_followed(bare: Path) -> None:
    (bare / ".netrc").write_text("machine example login a password b\n")
    assert _trusts_environment()
