"""Crash safety on the azure store (a real Azurite): a batch there is not one
transaction but phases — history, state (the commit point), task messages, then the
index row and the acknowledgements — so the coordinator is SIGKILLed between each of
them (``DAGQ_FAULTS``), then replaced. The workflow completes, each guarded effect
happens once, and no task whose completion was recorded runs again."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.azurite import Azurite
from tests.conftest import azure_prefix
from tests.integration.cli_harness import DagqCli
from tests.integration.test_fault_injection import (
    DIAMOND,
    effects_once,
    killed,
    start_faulty,
)

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def cli(tmp_path: Path, azurite: Azurite) -> Iterator[DagqCli]:
    with DagqCli(tmp_path) as cli:
        cli.store_url = f"azure://devstoreaccount1/{azure_prefix()}"
        yield cli


@pytest.mark.parametrize(
    "fault",
    [
        "documents.put@1=kill-after",
        "documents.put@2=kill-after",
        "queues.send@1=kill-after",
        "index.upsert@1=kill-after",
        "queues.delete@1=kill-after",
        "documents.put@4=kill",
    ],
    ids=[
        "after-history",
        "after-state",
        "after-task-messages",
        "after-index-row",
        "after-first-ack",
        "before-second-state",
    ],
)
def test_a_coordinator_killed_between_the_phases_of_a_batch_is_replaced_safely(
    cli: DagqCli, fault: str
) -> None:
    cli.submit_here("w", DIAMOND)
    cli.start_worker("-q", "default", "--visibility-timeout", "5")
    killed(start_faulty(cli, fault, "coordinator"))

    cli.start_coordinator()

    assert cli.wait_for_end("w", timeout_s=60) == "completed"
    assert effects_once(cli) == {"a": 1, "b": 1, "c": 1, "d": 1}
