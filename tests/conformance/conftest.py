"""The ``store`` fixture: every backend, each on a fake clock.

A backend joins the conformance suite by adding one entry to ``BACKENDS``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from dagq.stores.base import Store
from dagq.stores.memory import open_memory_store
from dagq.stores.sqlite import open_sqlite_store

#: Small, so dead-lettering is quick to reach (tests read it from the fixture).
MAX_DELIVERIES = 3


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


#: Opens an empty store of one backend: (scratch directory, clock, max_deliveries).
StoreFactory = Callable[[Path, FakeClock, int], Awaitable[Store]]


async def _memory(tmp_path: Path, clock: FakeClock, max_deliveries: int) -> Store:
    return open_memory_store(clock=clock, max_deliveries=max_deliveries)


async def _sqlite(tmp_path: Path, clock: FakeClock, max_deliveries: int) -> Store:
    return open_sqlite_store(tmp_path / "store.db", clock=clock, max_deliveries=max_deliveries)


BACKENDS: dict[str, StoreFactory] = {"memory": _memory, "sqlite": _sqlite}


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(scope="session")
def store_factories() -> dict[str, StoreFactory]:
    """Every backend, for tests that open their own stores (see BACKENDS)."""
    return BACKENDS


@pytest.fixture(scope="session")
def clock_type() -> type[FakeClock]:
    """The fake clock class, for tests that need a fresh clock per example."""
    return FakeClock


@pytest.fixture
def max_deliveries() -> int:
    return MAX_DELIVERIES


@pytest.fixture(params=list(BACKENDS))
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock, max_deliveries: int
) -> AsyncIterator[Store]:
    opened = await BACKENDS[request.param](tmp_path, clock, max_deliveries)
    yield opened
    await opened.close()
