"""Fixtures every test directory may use: the Azurite emulator for the azure backend."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator

import pytest

from tests.azurite import Azurite, AzuriteMissing, start


@pytest.fixture(scope="session")
def azurite() -> Iterator[Azurite]:
    """A running Azurite (started here if none listens): skip without one, except in CI."""
    try:
        server = start()
    except AzuriteMissing as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true, so the azure tests must run, but {exc}", pytrace=False)
        pytest.skip(f"azure tests skipped: {exc}")
    yield server
    server.stop()


def azure_prefix() -> str:
    """A fresh, valid store prefix: each test gets a container, table and queues of its own."""
    return f"t{secrets.token_hex(6)}"
