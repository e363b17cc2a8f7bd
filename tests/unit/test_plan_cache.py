"""A long-lived reader compiles each run's plan once (views.PlanCache)."""

from __future__ import annotations

import pytest

from dagq import keys
from dagq.client import Client
from dagq.compiled import PLANS
from dagq.stores import open_store
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
