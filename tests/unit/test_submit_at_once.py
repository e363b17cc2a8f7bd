"""A new workflow is stored in one batch where the store commits all or nothing."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from dagq import keys
from dagq.client import Client
from dagq.coordinator import Coordinator
from dagq.local import LOCAL_COORDINATOR
from dagq.stores import open_store
from dagq.stores.base import BatchOp, Committer, Store
from dagq.submission import submit
from tests.helpers import definition

pytestmark = pytest.mark.timeout(20)


class Recording:
    """The sqlite store's own committer, with the kinds of operation of each batch noted
    (and, once, a concurrent submit of the same id let in first)."""

    atomic = True

    def __init__(self, store: Store) -> None:
        assert store.committer is not None
        self.inner: Committer = store.committer
        self.store = store
        self.batches: list[list[str]] = []
        self.race: str | None = None

    async def __call__(self, ops: Sequence[BatchOp]) -> list[str]:
        racing, self.race = self.race, None
        if racing is not None:  # another client's submit of the same id gets there first
            await submit(self.store, definition([{"name": "a"}], name="w"), workflow_id=racing)
        self.batches.append([type(op).__name__ for op in ops])
        return await self.inner(ops)


def recorded(tmp_path: Path) -> tuple[Store, Recording]:
    store = open_store(f"sqlite:///{tmp_path / 'dagq.db'}")
    recording = Recording(store)
    store.committer = recording
    return store, recording


async def test_a_new_workflow_is_one_batch_of_row_definition_state_and_event(
    tmp_path: Path,
) -> None:
    store, recording = recorded(tmp_path)
    try:
        result = await submit(store, definition([{"name": "a"}], name="w"), workflow_id="w1")

        assert result.created
        assert recording.batches == [["UpsertOp", "PutOp", "PutOp", "SendOp"]]
        row = await store.index.get("w1")
        assert row is not None and row.status == "pending"
        assert await store.documents.get(keys.definition("w1")) is not None
        assert (await Client(store).status("w1")).status == "pending"
        events = await store.queues.receive(
            keys.COMPLETIONS_QUEUE, max_messages=10, visibility_timeout_s=30
        )
        assert len(events) == 1
    finally:
        await store.close()


async def test_submitting_it_again_writes_nothing_new_and_it_runs_once(tmp_path: Path) -> None:
    store, recording = recorded(tmp_path)
    try:
        wf = definition([{"name": "a"}], name="w")
        await submit(store, wf, workflow_id="w1")
        kept = [await store.documents.get(k) for k in (keys.definition("w1"), keys.state("w1"))]
        again = await submit(store, wf, workflow_id="w1")

        assert not again.created
        # The second one's batch was refused whole (the definition exists): nothing new.
        assert len(recording.batches) == 2
        assert [
            await store.documents.get(k) for k in (keys.definition("w1"), keys.state("w1"))
        ] == kept
        coordinator = Coordinator(store, LOCAL_COORDINATOR)
        await coordinator.step()
        state = await coordinator.settled_state("w1")
        assert state is not None and state.status == "running"
        assert (
            len(await store.queues.receive("default", max_messages=10, visibility_timeout_s=30))
            == 1
        )  # its task, once
    finally:
        await store.close()


async def test_a_submit_that_loses_the_race_returns_the_workflow_the_other_stored(
    tmp_path: Path,
) -> None:
    store, recording = recorded(tmp_path)
    try:
        recording.race = "w1"
        result = await submit(store, definition([{"name": "a"}], name="w"), workflow_id="w1")

        assert not result.created  # the other submit created it; nothing was doubled
        status = await Client(store).status("w1")
        assert status.status == "pending" and status.total == 1
        events = await store.queues.receive(
            keys.COMPLETIONS_QUEUE, max_messages=10, visibility_timeout_s=30
        )
        assert 1 <= len(events) <= 2  # the winner's, and the loser's wake-up (harmless)
    finally:
        await store.close()
