"""``Index.count``, run against every backend: rows by status under the listing's
filters (name, tenant, labels, a created range), counted where the rows are."""

from __future__ import annotations

import pytest

from dagq.stores.base import IndexRow, Store

pytestmark = pytest.mark.timeout(120)

T0 = 1_700_000_000.0


def row(
    workflow_id: str,
    status: str,
    created_at: float,
    *,
    name: str = "etl",
    tenant: str = "",
    labels: dict[str, str] | None = None,
) -> IndexRow:
    return IndexRow(
        id=workflow_id,
        name=name,
        status=status,
        tenant=tenant,
        created_at=created_at,
        updated_at=created_at,
        data={"labels": labels} if labels else {},
    )


@pytest.fixture
async def rows(store: Store) -> Store:
    for found in (
        row("a", "completed", T0, labels={"team": "red"}),
        row("b", "completed", T0 + 1, tenant="acme", labels={"team": "blue"}),
        row("c", "failed", T0 + 2, labels={"team": "red", "env": "prod"}),
        row("d", "running", T0 + 3, name="train", tenant="acme"),
        row("e", "running", T0 + 4, name="train", labels={"team": "red"}),
        row("f", "cancelled", T0 + 5, name="train", tenant="acme", labels={"team": "red"}),
    ):
        await store.index.upsert(found)
    return store


async def test_an_empty_index_counts_nothing(store: Store) -> None:
    assert await store.index.count() == {}


async def test_every_row_is_counted_by_its_status(rows: Store) -> None:
    assert await rows.index.count() == {"completed": 2, "failed": 1, "running": 2, "cancelled": 1}


async def test_a_moved_row_is_counted_once_under_its_new_status(rows: Store) -> None:
    await rows.index.upsert(row("d", "completed", T0 + 3, name="train", tenant="acme"))
    assert await rows.index.count() == {"completed": 3, "failed": 1, "running": 1, "cancelled": 1}


async def test_name_and_tenant_narrow_the_count(rows: Store) -> None:
    assert await rows.index.count(name="train") == {"running": 2, "cancelled": 1}
    assert await rows.index.count(tenant="acme") == {"completed": 1, "running": 1, "cancelled": 1}
    assert await rows.index.count(name="train", tenant="acme") == {"running": 1, "cancelled": 1}
    assert await rows.index.count(name="nothing") == {}


async def test_every_label_given_must_match(rows: Store) -> None:
    assert await rows.index.count(labels={"team": "red"}) == {
        "completed": 1,
        "failed": 1,
        "running": 1,
        "cancelled": 1,
    }
    assert await rows.index.count(labels={"team": "red", "env": "prod"}) == {"failed": 1}
    assert await rows.index.count(labels={"team": "red"}, tenant="acme") == {"cancelled": 1}
    assert await rows.index.count(labels={"team": "green"}) == {}


async def test_the_created_range_includes_its_start_and_excludes_its_end(rows: Store) -> None:
    assert await rows.index.count(created_after=T0 + 1, created_before=T0 + 4) == {
        "completed": 1,
        "failed": 1,
        "running": 1,
    }
    assert await rows.index.count(created_after=T0 + 5) == {"cancelled": 1}
    assert await rows.index.count(created_before=T0) == {}
    assert await rows.index.count(created_before=T0 + 2, labels={"team": "blue"}) == {
        "completed": 1
    }
