"""A long-lived reader compiles each run's plan once (views.PlanCache)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from dagq import keys
from dagq.client import Client
from dagq.compiled import PLANS, Compiled
from dagq.coordinator import Coordinator, CoordinatorOptions
from dagq.stores import open_store
from dagq.stores.base import Document, Documents
from dagq.stores.counting import counted
from dagq.submission import submit
from dagq.views import PlanCache, load_run
from tests.helpers import definition

pytestmark = pytest.mark.timeout(10)


async def test_a_run_read_twice_is_compiled_once_and_the_oldest_plans_make_room() -> None:
    store = open_store("memory://")
    plans = PlanCache(max_tasks=5)
    try:
        client = Client(store, plans=plans)
        for name, n in (("a", 3), ("b", 3)):
            tasks = [{"name": f"t{i}"} for i in range(n)]
            await client.submit(definition(tasks, name=name), workflow_id=name)
        _, first, _ = await load_run(store, "a", plans=plans)
        _, again, _ = await load_run(store, "a", plans=plans)
        assert again is first
        assert (await client.status("a")).total == 3  # the client reads through it too
        await load_run(store, "b", plans=plans)  # 6 tasks > 5: a's plan goes
        PLANS.clear()  # and this process's shared plans do not have it either
        _, recompiled, _ = await load_run(store, "a", plans=plans)
        assert recompiled is not first and recompiled == first
    finally:
        await store.close()


async def test_a_run_that_did_not_change_is_read_again_from_what_was_kept() -> None:
    store = open_store("memory://")
    plans = PlanCache()
    try:
        await Client(store).submit(definition([{"name": "t"}], name="a"), workflow_id="a")
        first = await load_run(store, "a", plans=plans)
        again = await load_run(store, "a", plans=plans)
        assert again[2] is first[2] and again[0] is first[0]  # one small read, no decode
        header = await store.documents.get(keys.state("a"))
        assert header is not None
        await store.documents.put(keys.state("a"), header.data)  # rewritten: a new etag
        changed = await load_run(store, "a", plans=plans)
        assert changed[2] is not first[2]
        assert changed[2].task_status == first[2].task_status
        assert changed[0] is first[0]  # the definition document is decoded once
    finally:
        await store.close()


async def test_a_changed_run_is_read_with_one_read_of_its_state_header() -> None:
    store, counts = counted(open_store("memory://"))
    plans = PlanCache()
    try:
        await Client(store).submit(definition([{"name": "t"}], name="a"), workflow_id="a")
        header = await store.documents.get(keys.state("a"))
        assert header is not None
        await load_run(store, "a", plans=plans)
        await store.documents.put(keys.state("a"), header.data)  # rewritten: a new etag
        counts.clear()
        st = (await load_run(store, "a", plans=plans))[2]
        # the header (which says the run changed), then nothing but the definition: the
        # state is decoded from the header read first, not read again
        assert counts["documents.get"] == 2 and st.workflow_id == "a"
    finally:
        await store.close()


async def test_a_definition_is_compiled_once_by_its_submits_the_coordinator_and_readers() -> None:
    store = open_store("memory://")
    plans = Compiled()
    try:
        wf = definition([{"name": "a"}, {"name": "b", "depends_on": ["a"]}], name="once")
        PLANS.clear()
        before = PLANS.compiles
        first = await submit(store, wf, workflow_id="w1")
        second = await submit(store, wf, workflow_id="w2")
        assert second.plan is first.plan
        coordinator = Coordinator(store, CoordinatorOptions())
        await coordinator.step()
        assert coordinator.plan_of("w1") is first.plan  # loaded, not compiled again
        client = Client(store)
        assert (await client.status("w2")).total == 2
        _, read, _ = await load_run(store, "w1")
        assert read is first.plan
        assert PLANS.compiles == before + 1
        other = await submit(store, wf, params={}, workflow_id="w3")
        assert other.plan is first.plan  # the same definition and params: one fingerprint
        assert plans.compiles == 0
    finally:
        await store.close()


def test_the_plans_kept_stay_within_their_bound_and_a_larger_one_is_not_kept() -> None:
    plans = Compiled(max_tasks=5)
    three = definition([{"name": f"t{i}"} for i in range(3)], name="three")
    six = definition([{"name": f"t{i}"} for i in range(6)], name="six")
    a = plans.plan(three, {}, "a")
    assert plans.plan(three, {}, "a") is a
    b = plans.plan(three, {}, "b")  # 6 tasks > 5: the least recently used goes
    assert plans.get("a") is None and plans.get("b") is b
    plans.plan(six, {}, "c")  # over the bound alone: compiled, not kept
    assert plans.get("c") is None and plans.get("b") is b
    assert plans.compiles == 3


class _ManyReads:
    """Documents that read several at once (as PostgreSQL's do), counting the requests."""

    def __init__(self, inner: Documents) -> None:
        self.inner = inner
        self.requests: list[list[str]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def get(self, key: str) -> Document | None:
        self.requests.append([key])
        return await self.inner.get(key)

    async def get_many(self, names: Sequence[str]) -> list[Document | None]:
        self.requests.append(list(names))
        return [await self.inner.get(name) for name in names]


async def test_a_status_reads_a_new_run_in_one_request_and_a_known_one_without_its_definition() -> (
    None
):
    store = open_store("memory://")
    documents = _ManyReads(store.documents)
    store.documents = documents
    try:
        client = Client(store, plans=PlanCache())
        await client.submit(definition([{"name": "t"}], name="a"), workflow_id="a")
        documents.requests.clear()
        assert (await client.status("a")).total == 1
        wanted = [keys.quarantine("a"), keys.state("a"), keys.definition("a")]
        assert documents.requests == [wanted]
        documents.requests.clear()
        assert (await client.status("a")).total == 1  # unchanged: as kept
        assert documents.requests == [wanted[:2]]
    finally:
        await store.close()


async def test_a_coordinator_reads_a_new_run_in_one_request() -> None:
    store = open_store("memory://")
    documents = _ManyReads(store.documents)
    store.documents = documents
    try:
        await submit(store, definition([{"name": "t"}], name="a"), workflow_id="a")
        documents.requests.clear()
        coordinator = Coordinator(store, CoordinatorOptions())
        await coordinator.step()
        assert coordinator.plan_of("a") is not None
        wanted = [keys.definition("a"), keys.quarantine("a"), keys.state("a")]
        assert wanted in documents.requests
        assert not [r for r in documents.requests if len(r) == 1 and r[0] in wanted]
    finally:
        await store.close()


async def test_a_coordinator_reads_a_steps_new_runs_together_in_one_request() -> None:
    store = open_store("memory://")
    documents = _ManyReads(store.documents)
    store.documents = documents
    ids = [f"w{i}" for i in range(5)]
    try:
        for workflow_id in ids:  # submitted elsewhere: nothing handed to the coordinator
            await submit(store, definition([{"name": "t"}], name="a"), workflow_id=workflow_id)
        documents.requests.clear()
        coordinator = Coordinator(store, CoordinatorOptions())
        await coordinator.step()
        assert all(coordinator.plan_of(i) is not None for i in ids)
        loads = [r for r in documents.requests if keys.definition(ids[0]) in r]
        assert loads == [
            [k for i in ids for k in (keys.definition(i), keys.quarantine(i), keys.state(i))]
        ]
    finally:
        await store.close()
