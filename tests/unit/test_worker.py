"""Workers and coordinator together in one process, on the memory store."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dagq import keys
from dagq.local import LocalRunner
from dagq.stores.base import Store
from dagq.stores.memory import open_memory_store
from dagq.views import load_view
from tests.helpers import definition


@pytest.fixture
def store() -> Store:
    return open_memory_store()


async def run(store: Store, tasks: list[dict[str, Any]], **workflow: Any) -> tuple[str, Any]:
    runner = LocalRunner(store, workers=8)
    result = await runner.submit(definition(tasks, **workflow), params={}, workflow_id="w")
    # A bound for a hang, well above a loaded machine's time (3,000 tasks: 1.5 s idle).
    status = await asyncio.wait_for(runner.drive(), 60)
    return status, await load_view(store, result.workflow_id)


def task(view: Any, name: str) -> Any:
    return next(t for t in view.tasks if t.name == name)


async def outputs(store: Store) -> dict[str, Any]:
    from dagq.views import load_run

    _, plan, st = await load_run(store, "w")
    return {plan.tasks[i].name: v for i, v in st.outputs.items()}


async def test_python_task_gets_rendered_args_and_upstream_inputs(store: Store) -> None:
    status, _ = await run(
        store,
        [
            {"name": "a", "call": "tests.sample_tasks:echo", "args": {"n": 2}},
            {
                "name": "b",
                "call": "tests.sample_tasks:echo",
                "depends_on": ["a"],
                "args": {"from_a": "{{ inputs.a.n }}", "text": "n={{ inputs.a.n }}"},
            },
        ],
    )
    assert status == "completed"
    assert (await outputs(store))["b"] == {"from_a": 2, "text": "n=2"}


async def test_context_carries_attempt_and_idempotency_key(store: Store) -> None:
    await run(store, [{"name": "c", "call": "tests.sample_tasks:context"}])
    assert (await outputs(store))["c"] == {"task": "c", "attempt": 1, "key": "w/c"}


async def test_large_output_travels_by_reference(store: Store) -> None:
    status, _ = await run(
        store,
        [
            {"name": "big", "call": "tests.sample_tasks:big", "args": {"size": 100_000}},
            {
                "name": "len",
                "call": "tests.sample_tasks:length",
                "depends_on": ["big"],
                "condition": "len(inputs.big) > 50000",
            },
        ],
    )
    assert status == "completed"
    assert (await outputs(store))["len"] == 100_000
    assert await store.documents.get(keys.output("w", 0, 1)) is not None


async def test_non_retryable_fails_at_once_and_retry_after_retries(store: Store) -> None:
    status, view = await run(
        store,
        [
            {"name": "refuse", "call": "tests.sample_tasks:refuse", "num_retries": 3},
            {"name": "busy", "call": "tests.sample_tasks:busy_once", "num_retries": 1},
        ],
    )
    assert status == "failed"
    assert task(view, "refuse").attempts == 1
    assert "bad input" in task(view, "refuse").error
    assert (task(view, "busy").status, task(view, "busy").attempts) == ("completed", 2)


async def test_unimportable_call_fails_at_once_with_the_import_error(store: Store) -> None:
    _, view = await run(store, [{"name": "x", "call": "no_such_module:f", "num_retries": 2}])
    row = task(view, "x")
    assert (row.status, row.attempts) == ("failed", 1)
    assert "cannot import 'no_such_module:f'" in row.error


async def test_output_that_is_not_json_fails_clearly(store: Store) -> None:
    _, view = await run(store, [{"name": "x", "call": "tests.sample_tasks:unserialisable"}])
    assert "not JSON-serialisable" in task(view, "x").error


async def test_shell_task_sees_its_environment_and_writes_its_output(store: Store) -> None:
    script = (
        'python3 -c "import json,os; e=os.environ; '
        "json.dump({k: e[k] for k in ['DAGQ_WORKFLOW_ID','DAGQ_TASK','DAGQ_ATTEMPT']}"
        " | {'inputs': json.load(open(e['DAGQ_INPUTS']))}, open(e['JOBQ_OUTPUT_FILE'],'w'))\""
    )
    await run(
        store,
        [
            {"name": "a", "call": "tests.sample_tasks:echo", "args": {"v": 1}},
            {"name": "b", "cmd": script, "depends_on": ["a"]},
        ],
    )
    assert (await outputs(store))["b"] == {
        "DAGQ_WORKFLOW_ID": "w",
        "DAGQ_TASK": "b",
        "DAGQ_ATTEMPT": "1",
        "inputs": {"a": {"v": 1}},
    }


async def test_failed_shell_task_reports_exit_code_and_stderr_tail(store: Store) -> None:
    _, view = await run(store, [{"name": "x", "cmd": "echo nope >&2; exit 4"}])
    assert task(view, "x").error == "exit code 4; stderr: nope"
    assert await store.documents.get(keys.log("w", 0, 1)) is not None


async def test_non_retryable_exit_codes_fail_at_once(store: Store) -> None:
    _, view = await run(
        store,
        [
            {
                "name": "x",
                "cmd": "exit 7",
                "num_retries": 3,
                "retry": {"non_retryable_exit_codes": [7]},
            }
        ],
    )
    assert task(view, "x").attempts == 1


async def test_timeout_kills_the_attempt_and_retries(store: Store) -> None:
    _, view = await run(
        store,
        [
            {
                "name": "x",
                "cmd": "sleep 30",
                "timeout_s": 0.3,
                "num_retries": 1,
                "retry": {"backoff_s": 0},
            }
        ],
    )
    row = task(view, "x")
    assert (row.status, row.attempts) == ("failed", 2)
    assert "timed out after 0.3s" in row.error


async def test_many_quick_tasks_share_completion_messages(store: Store) -> None:
    tasks = [{"name": f"t{i}", "call": "tests.sample_tasks:echo"} for i in range(200)]
    runner = LocalRunner(store, workers=16)
    await runner.submit(definition(tasks), params={}, workflow_id="w")
    await asyncio.wait_for(runner.drive(), 20)
    assert runner.coordinator.stats.events >= 200
    assert runner.coordinator.stats.flushes < 200


async def test_cancel_stops_a_running_shell_task(store: Store) -> None:
    from dagq.submission import request_cancel

    runner = LocalRunner(store, workers=2)
    await runner.submit(
        definition([{"name": "sleepy", "cmd": "sleep 60"}]), params={}, workflow_id="w"
    )

    async def cancel_when_running(plan: Any, st: Any) -> None:
        if st.status == "running" and st.counts[2]:
            await request_cancel(store, "w", "enough")

    status = await asyncio.wait_for(runner.drive(cancel_when_running), 20)
    assert status == "cancelled"
    view = await load_view(store, "w")
    assert task(view, "sleepy").status == "cancelled"


async def test_foreach_instances_get_item_and_index_and_the_reduce_gets_the_list(
    store: Store,
) -> None:
    status, _ = await run(
        store,
        [
            {"name": "split", "call": "tests.sample_tasks:chunks", "args": {"n": 5}},
            {
                "name": "work",
                "call": "tests.sample_tasks:summarise",
                "depends_on": ["split"],
                "foreach": "inputs.split.chunks",
                "max_parallel": 2,
            },
            {"name": "reduce", "call": "tests.sample_tasks:count_items", "depends_on": ["work"]},
        ],
    )
    assert status == "completed"
    out = await outputs(store)
    assert out["work"] == [{"item": f"chunk-{k}", "index": k} for k in range(5)]
    assert out["reduce"] == 5


async def test_a_shell_instance_finds_its_item_and_index_in_the_environment(store: Store) -> None:
    script = (
        "python3 -c \"import json,os; json.dump([json.loads(os.environ['DAGQ_ITEM']),"
        " int(os.environ['DAGQ_INDEX'])], open(os.environ['DAGQ_OUTPUT'], 'w'))\""
    )
    status, _ = await run(
        store,
        [{"name": "each", "cmd": script, "foreach": "params.things"}],
        params={"things": [{"a": 1}, "two"]},
    )
    assert status == "completed"
    assert (await outputs(store))["each"] == [[{"a": 1}, 0], ["two", 1]]


async def test_a_large_items_list_reaches_instances_through_a_document(store: Store) -> None:
    status, _ = await run(
        store,
        [
            {"name": "split", "call": "tests.sample_tasks:chunks", "args": {"n": 3000}},
            {
                "name": "work",
                "call": "tests.sample_tasks:summarise",
                "depends_on": ["split"],
                "foreach": "inputs.split.chunks",
            },
            {"name": "reduce", "call": "tests.sample_tasks:count_items", "depends_on": ["work"]},
        ],
    )
    assert status == "completed"
    assert (await outputs(store))["reduce"] == 3000
    assert await store.documents.get(keys.foreach_items("w", 1)) is not None


async def test_a_damaged_control_document_stops_the_task_saying_so(store: Store) -> None:
    runner = LocalRunner(store, workers=2)
    await runner.submit(
        definition([{"name": "sleepy", "cmd": "sleep 60", "num_retries": 0}]),
        params={},
        workflow_id="w",
    )

    async def damage_when_running(plan: Any, st: Any) -> None:
        if st.status == "running" and st.counts[2]:
            await store.documents.put(keys.control("w"), b"\xff not json")

    status = await asyncio.wait_for(runner.drive(damage_when_running), 20)
    assert status == "failed"
    row = task(await load_view(store, "w"), "sleepy")
    assert row.error == "stopped: the workflow's control document is damaged"
