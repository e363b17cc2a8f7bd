"""``open_store`` picks the backend a URL names and rejects the rest."""

from __future__ import annotations

from pathlib import Path

import pytest

from dagq.errors import ValidationError
from dagq.stores import open_store
from dagq.stores.azure_documents import AzureDocuments
from dagq.stores.memory import MemoryDocuments
from dagq.stores.sqlite import SqliteDocuments


async def test_memory_url_opens_a_memory_store() -> None:
    store = open_store("memory://")
    assert isinstance(store.documents, MemoryDocuments)
    await store.close()


async def test_relative_sqlite_url_opens_a_file_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    store = open_store("sqlite:///data/dagq.db")
    assert isinstance(store.documents, SqliteDocuments)
    await store.close()
    assert (tmp_path / "data" / "dagq.db").is_file()


async def test_absolute_sqlite_url_opens_that_file(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path}/dagq.db")
    await store.close()
    assert (tmp_path / "dagq.db").is_file()
    assert store.url == f"sqlite:///{tmp_path}/dagq.db"


async def test_a_plain_path_ending_in_db_opens_sqlite(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "dagq.db"))
    assert isinstance(store.documents, SqliteDocuments)
    await store.close()


async def test_an_azure_url_opens_an_azure_store_without_touching_the_network() -> None:
    store = open_store("azure://devstoreaccount1/dagq")
    assert isinstance(store.documents, AzureDocuments)
    assert store.url == "azure://devstoreaccount1/dagq"
    await store.close()


def test_a_bad_azure_url_names_itself() -> None:
    with pytest.raises(ValidationError, match="azure://devstoreaccount1/x"):
        open_store("azure://devstoreaccount1/x")


async def test_a_postgres_url_opens_a_postgres_store_without_touching_the_network() -> None:
    from dagq.stores.postgres_documents import PostgresDocuments

    store = open_store("postgresql://me:secret@db.invalid:5433/jobs?schema=team_a")
    assert isinstance(store.documents, PostgresDocuments)
    assert store.url == "postgresql://me@db.invalid:5433/jobs?schema=team_a"
    await store.close()


@pytest.mark.parametrize("url", ["mysql://db/dagq", "memory://named", "dagq.sqlite", ""])
def test_an_unknown_url_names_itself_and_the_supported_schemes(url: str) -> None:
    with pytest.raises(ValidationError) as raised:
        open_store(url)
    assert repr(url) in str(raised.value)
    assert "memory://" in str(raised.value) and "sqlite:///" in str(raised.value)


def test_max_deliveries_below_one_is_rejected() -> None:
    with pytest.raises(ValidationError, match="max_deliveries"):
        open_store("memory://", max_deliveries=0)
