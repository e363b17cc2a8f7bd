"""The ``store`` fixture: every backend, with the clock it runs on.

A backend joins the conformance suite by adding one entry to ``BACKENDS``. memory and
sqlite run on a fake clock that moves only when told (postgres too: its times come from
the client's clock); azure runs against the Azurite
emulator, whose time is real, so its clock's ``advance`` really waits (the tests keep
durations short) and time comparisons allow ``clock.tolerance`` of slack.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import pytest

from dagq.stores.azure import open_azure_store
from dagq.stores.base import Store
from dagq.stores.memory import open_memory_store
from dagq.stores.postgres import open_postgres_store
from dagq.stores.sqlite import open_sqlite_store
from tests.conftest import azure_prefix

#: Small, so dead-lettering is quick to reach (tests read it from the fixture).
MAX_DELIVERIES = 3


class SuiteClock(Protocol):
    """What the tests need of a clock: read it, move it, and how exact it is."""

    tolerance: float

    @property
    def now(self) -> float: ...

    def __call__(self) -> float: ...

    def advance(self, seconds: float) -> None: ...


class FakeClock:
    """A clock that moves only when told to."""

    tolerance = 0.0

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class RealClock:
    """The wall clock, for a backend whose server keeps its own time: advancing waits.

    The wait blocks the event loop on purpose: nothing else may run meanwhile, as with
    the fake clock.
    """

    tolerance = 1.0

    @property
    def now(self) -> float:
        return time.time()

    def __call__(self) -> float:
        return time.time()

    def advance(self, seconds: float) -> None:
        time.sleep(seconds)


#: Opens an empty store of one backend: (scratch directory, clock, max_deliveries).
StoreFactory = Callable[[Path, SuiteClock, int], Awaitable[Store]]


@dataclass(frozen=True)
class Backend:
    """How to open a backend's store, and what it needs."""

    open: StoreFactory
    clock: Callable[[], SuiteClock] = FakeClock
    #: The name of a fixture the backend needs running (e.g. its emulator).
    needs: str | None = None


async def _memory(tmp_path: Path, clock: SuiteClock, max_deliveries: int) -> Store:
    return open_memory_store(clock=clock, max_deliveries=max_deliveries)


async def _sqlite(tmp_path: Path, clock: SuiteClock, max_deliveries: int) -> Store:
    return open_sqlite_store(tmp_path / "store.db", clock=clock, max_deliveries=max_deliveries)


async def _azure(tmp_path: Path, clock: SuiteClock, max_deliveries: int) -> Store:
    url = f"azure://devstoreaccount1/{azure_prefix()}"
    return open_azure_store(url, clock=clock, max_deliveries=max_deliveries, environ={})


#: The running cluster's server URL, set by the ``backend`` fixture for postgres.
_POSTGRES: list[str] = []


async def _postgres(tmp_path: Path, clock: SuiteClock, max_deliveries: int) -> Store:
    url = f"{_POSTGRES[0]}?schema=t{secrets.token_hex(6)}"
    return open_postgres_store(url, clock=clock, max_deliveries=max_deliveries)


BACKENDS: dict[str, Backend] = {
    "memory": Backend(_memory),
    "sqlite": Backend(_sqlite),
    "azure": Backend(_azure, clock=RealClock, needs="azurite"),
    "postgres": Backend(_postgres, needs="postgres_cluster"),
}


@pytest.fixture(params=list(BACKENDS))
def backend(request: pytest.FixtureRequest) -> str:
    """The name of the backend under test (its emulator started, if it needs one)."""
    name: str = request.param
    needs = BACKENDS[name].needs
    if needs is not None:
        running = request.getfixturevalue(needs)
        if name == "postgres":
            _POSTGRES[:] = [running.url]
    return name


@pytest.fixture
def clock(backend: str) -> SuiteClock:
    return BACKENDS[backend].clock()


@pytest.fixture(scope="session")
def store_factories() -> dict[str, StoreFactory]:
    """The backends on a fake clock, for tests that open their own stores and drive
    time themselves (see BACKENDS)."""
    return {
        name: b.open for name, b in BACKENDS.items() if b.clock is FakeClock and b.needs is None
    }


@pytest.fixture(scope="session")
def clock_type() -> type[FakeClock]:
    """The fake clock class, for tests that need a fresh clock per example."""
    return FakeClock


@pytest.fixture
def max_deliveries() -> int:
    return MAX_DELIVERIES


@pytest.fixture
async def store(
    backend: str, tmp_path: Path, clock: SuiteClock, max_deliveries: int
) -> AsyncIterator[Store]:
    opened = await BACKENDS[backend].open(tmp_path, clock, max_deliveries)
    yield opened
    await opened.close()
