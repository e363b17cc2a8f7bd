"""The payload layer: every value dagq carries stays within its bounds.

Long errors are cut and kept whole; deep or huge values are refused where they enter
(with one line naming them) or fail only their own attempt; a task message that
would be too large travels by reference; a hostile YAML cannot expand without bound.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from dagq import keys, payloads, reporting
from dagq.client import Client
from dagq.coordinator import Coordinator, CoordinatorOptions
from dagq.dispatching import task_message
from dagq.errors import DamagedData, PayloadTooLarge, UsageError, ValidationError
from dagq.group import Group
from dagq.loading import load_text
from dagq.local import LocalRunner
from dagq.machine import Dispatch
from dagq.messages import (
    SignalSent,
    TaskFinished,
    TaskMessage,
    TaskSpec,
    decode_events,
    decode_tasks,
    encode_events,
    encode_task,
)
from dagq.plan import compile_plan, parse_param, resolve_params
from dagq.runners import Outcome, TaskContext, child
from dagq.runners import shell as shell_runner
from dagq.runners.pool import TaskPool
from dagq.runners.python import run_python
from dagq.runners.shell import run_shell
from dagq.state import RunState, TaskStatus
from dagq.stores.base import MAX_MESSAGE_BYTES, OutgoingMessage
from dagq.stores.memory import open_memory_store
from dagq.submission import submit
from dagq.validation import check_queue_name, check_workflow_id
from tests.helpers import definition

pytestmark = pytest.mark.timeout(60)


def nested(depth: int, leaf: Any = 1) -> Any:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


# --- the pure layer ---------------------------------------------------------------------


@given(st.text(max_size=5000), st.integers(60, 3000), st.text(max_size=60))
@example("x" * 5000, 60, "n" * 60)
def test_cut_keeps_head_and_tail_within_the_limit(text: str, limit: int, note: str) -> None:
    out = payloads.cut(text, limit, note=note)
    assert len(out) <= limit
    if len(text) <= limit:
        assert out == text
    else:
        assert "characters cut" in out
        assert text.startswith(out[:10]) and text.endswith(out[-10:])


def test_cut_says_where_the_whole_text_is_when_there_is_room() -> None:
    out = payloads.cut("y" * 5000, 2000, note="whole text: dagq logs wf a")
    omitted = 5000 - out.count("y")
    assert len(out) == 2000 and f"[{omitted} characters cut; whole text: dagq logs wf a]" in out


def test_echo_repeats_a_long_name_only_in_part() -> None:
    echoed = payloads.echo("n" * 5000)
    assert len(echoed) < 120 and "5000 characters" in echoed
    assert payloads.echo("short") == "short"


def test_encode_json_refuses_too_deep_too_big_and_not_json_naming_the_value() -> None:
    assert payloads.encode_json(nested(100), "x") == b"[" * 100 + b"1" + b"]" * 100
    with pytest.raises(PayloadTooLarge, match=r"^the thing is nested more than 100 levels deep$"):
        payloads.encode_json(nested(101), "the thing")
    with pytest.raises(PayloadTooLarge, match="nested more than 100 levels deep"):
        payloads.encode_json(nested(100_000), "the thing")
    with pytest.raises(PayloadTooLarge, match="20002 bytes as JSON, over the limit of 100 bytes"):
        payloads.encode_json("x" * 20000, "the thing", max_bytes=100)
    with pytest.raises(ValidationError, match="not JSON-serialisable"):
        payloads.encode_json(object(), "the thing")


def test_decode_json_turns_a_too_deep_document_into_damaged_data() -> None:
    with pytest.raises(DamagedData, match="nested too deep"):
        payloads.decode_json(b"[" * 100_000 + b"]" * 100_000, "doc")
    with pytest.raises(DamagedData, match="cannot be decoded"):
        payloads.decode_json(b"{nope", "doc")


def test_a_message_nested_too_deep_is_a_decode_error_never_a_recursion_error() -> None:
    small = encode_events([SignalSent(workflow_id="w", name="go", data=nested(3))])
    deep = small.replace(b"\x91\x91\x91\x01", b"\x91" * 100_000 + b"\x01")
    with pytest.raises(msgspec.DecodeError, match="nested too deep"):
        decode_events(deep)
    task = encode_task(attempt(item=nested(3)))
    with pytest.raises(msgspec.DecodeError, match="nested too deep"):
        decode_tasks(task.replace(b"\x91\x91\x91\x01", b"\x91" * 100_000 + b"\x01"))


# --- reports ------------------------------------------------------------------------------


def attempt(**extra: Any) -> TaskMessage:
    fields: dict[str, Any] = {
        "workflow_id": "wf-1",
        "task": 3,
        "name": "boom",
        "attempt": 2,
        "spec": TaskSpec(kind="python", call="m:f"),
    }
    return TaskMessage(**{**fields, **extra})


async def report(outcome: Outcome, task: TaskMessage | None = None) -> tuple[Any, Any]:
    store = open_memory_store()
    event = await reporting.finished(
        store.documents, task or attempt(), outcome, started=0.0, clock=lambda: 1.0, worker="w"
    )
    return store, event


async def test_a_long_error_is_cut_in_the_event_and_kept_whole_in_a_document() -> None:
    text = "ValueError: " + "x" * 60_000 + " the end"
    store, event = await report(Outcome(ok=False, error=text))

    assert len(encode_events([event])) < 8 * 1024
    assert len(event.error) <= payloads.ERROR_INLINE_CHARS
    assert event.error.startswith("ValueError: xxx") and event.error.endswith("the end")
    assert "whole text: dagq logs wf-1 boom --attempt 2" in event.error
    doc = await store.documents.get(keys.error("wf-1", 3, 2))
    assert doc is not None and doc.data.decode() == text


async def test_a_short_error_is_sent_as_it_is_and_nothing_is_stored() -> None:
    store, event = await report(Outcome(ok=False, error="short"))
    assert event.error == "short"
    assert await store.documents.list("logs/") == []


async def test_an_instance_or_undo_keeps_its_whole_error_under_a_key_of_its_own() -> None:
    store, event = await report(Outcome(ok=False, error="e" * 9000), attempt(item_index=4))
    assert "whole text: dagq logs wf-1 boom --attempt 2 --item 4" in event.error
    assert await store.documents.get(keys.error("wf-1", 3, 2, item=4)) is not None
    assert await store.documents.get(keys.error("wf-1", 3, 2)) is None
    _, event = await report(Outcome(ok=False, error="e" * 9000), attempt(undo=True))
    assert "whole text: dagq logs wf-1 boom --attempt 2 --undo" in event.error


async def test_the_whole_error_of_a_foreach_instance_is_fetched_by_the_client() -> None:
    store = open_memory_store()
    task = {
        "name": "fan",
        "call": "tests.sample_tasks:long_error_on",
        "args": {"fail": 1},
        "foreach": "[0, 1, 2]",
    }
    runner = LocalRunner(store, workers=2)
    await runner.submit(definition([task]), params={}, workflow_id="wf")
    assert await asyncio.wait_for(runner.drive(), 30) == "failed"

    whole = await Client(store).error("wf", "fan", item=1)
    assert whole is not None and whole.startswith("ValueError: item 1: " + "x" * 60_000)
    assert await Client(store).error("wf", "fan", item=0) is None
    with pytest.raises(UsageError, match="has 3 items; there is no item 3"):
        await Client(store).error("wf", "fan", item=3)


@pytest.mark.parametrize("depth", [101, 5000, 100_000])
async def test_an_output_nested_too_deep_fails_the_attempt_for_good(depth: int) -> None:
    _, event = await report(Outcome(ok=True, output=nested(depth)))
    assert (event.ok, event.retryable, event.output) == (False, False, None)
    assert event.error == "the output is nested more than 100 levels deep"


async def test_an_output_that_refers_to_itself_fails_the_attempt() -> None:
    loop: list[Any] = []
    loop.append(loop)
    _, event = await report(Outcome(ok=True, output=loop))
    assert not event.ok and "nested more than 100 levels deep" in event.error


async def test_a_large_output_travels_by_reference() -> None:
    store, event = await report(Outcome(ok=True, output="o" * (payloads.OUTPUT_INLINE_BYTES + 1)))
    assert event.ok and event.output is None and event.output_ref is not None
    assert await store.documents.get(event.output_ref) is not None


async def test_an_output_of_short_floats_small_in_json_but_not_in_msgpack_goes_by_reference() -> (
    None
):
    floats = [0.5] * 7000  # 28 KB as JSON, 63 KB as msgpack
    _, event = await report(Outcome(ok=True, output=floats))
    assert event.output_ref is not None
    assert len(encode_events([event])) <= MAX_MESSAGE_BYTES


# --- task messages ------------------------------------------------------------------------


def dispatched(tasks: list[dict[str, Any]], params: dict[str, Any], **extra: Any) -> Any:
    d = definition(tasks, params={name: "" for name in params})
    plan = compile_plan(d, resolve_params(d, params))
    state = RunState("wf-1", len(plan.tasks), created_at=0.0)
    return plan, state


def test_a_60_kb_param_in_a_command_sends_the_spec_by_reference() -> None:
    plan, state = dispatched([{"name": "a", "cmd": "echo {{ params.big }}"}], {"big": "b" * 60_000})
    out = task_message(plan, state, Dispatch(0, 1, 0.0))

    assert len(out.message.body) <= payloads.TASK_MESSAGE_INLINE_BYTES
    (task,) = decode_tasks(out.message.body)
    assert task.spec_ref == keys.spec("wf-1", 0) and task.spec.cmd is None
    stored = dict(out.documents)[task.spec_ref]
    assert "b" * 60_000 in msgspec.msgpack.decode(stored, type=TaskSpec).cmd


def test_a_large_undo_command_has_a_spec_document_of_its_own() -> None:
    tasks = [{"name": "a", "cmd": "true", "compensate": {"cmd": "echo {{ params.big }}"}}]
    plan, state = dispatched(tasks, {"big": "u" * 60_000})
    out = task_message(plan, state, Dispatch(0, 1, 0.0, undo=True))
    (task,) = decode_tasks(out.message.body)
    assert task.undo and task.spec_ref == keys.spec("wf-1", 0, undo=True)


def test_a_message_too_large_even_without_its_spec_travels_whole_by_reference() -> None:
    parents = [{"name": f"p{'x' * 150}{i}"} for i in range(400)]
    child = {"name": "child", "depends_on": [p["name"] for p in parents]}
    plan, state = dispatched([*parents, child], {})
    for i in range(400):  # every parent's output is stored by reference
        state.task_status[i] = TaskStatus.COMPLETED
        state.output_refs[i] = keys.output("wf-1", i, 1)
    out = task_message(plan, state, Dispatch(400, 1, 0.0))

    assert len(out.message.body) <= payloads.TASK_MESSAGE_INLINE_BYTES
    (stub,) = decode_tasks(out.message.body)
    assert stub.body_ref is not None and stub.input_refs == {}
    whole = decode_tasks(dict(out.documents)[stub.body_ref])[0]
    assert len(whole.input_refs) == 400 and whole.attempt == 1


VALUES = st.sampled_from(["s", 0.5, 7]).flatmap(
    lambda unit: st.integers(0, 12_000).map(lambda n: [unit] * n)
)


@given(
    outputs=st.lists(st.one_of(st.none(), VALUES), min_size=1, max_size=4),
    previous=st.one_of(st.none(), VALUES),
    item=st.one_of(st.none(), VALUES),
    param=st.integers(0, 70_000),
)
def test_no_task_message_is_ever_over_the_limit(
    outputs: list[Any], previous: Any, item: Any, param: int
) -> None:
    """Whatever mix of inline outputs (short floats weigh more in msgpack than in JSON),
    previous output, foreach item and rendered param: the body stays under the limit."""
    parents = [{"name": f"p{i}"} for i in range(len(outputs))]
    child: dict[str, Any] = {
        "name": "c",
        "depends_on": [p["name"] for p in parents],
        "cmd": "echo {{ params.big }}",
    }
    if previous is not None:
        child["loop"] = {"until": "true", "max_iterations": 5}
    elif item is not None:
        child["foreach"] = "[1]"
    plan, state = dispatched([*parents, child], {"big": "b" * param})
    c = len(parents)
    for i, value in enumerate(outputs):
        state.task_status[i] = TaskStatus.COMPLETED
        state.outputs[i] = value
    dispatch = Dispatch(c, 1, 0.0)
    if previous is not None:
        state.iteration[c], state.outputs[c] = 2, previous
    elif item is not None:
        state.groups[c] = Group(1, [item], None)
        dispatch = Dispatch(c, 1, 0.0, item=0)

    out = task_message(plan, state, dispatch)

    assert len(out.message.body) <= payloads.TASK_MESSAGE_INLINE_BYTES
    (task,) = decode_tasks(out.message.body)
    if task.body_ref is not None:
        task = decode_tasks(dict(out.documents)[task.body_ref])[0]
    assert task.attempt == 1 and task.task == c


def test_a_small_message_is_sent_as_it_is() -> None:
    plan, state = dispatched([{"name": "a", "cmd": "echo {{ params.p }}"}], {"p": "small"})
    out = task_message(plan, state, Dispatch(0, 1, 0.0))
    (task,) = decode_tasks(out.message.body)
    assert task.spec_ref is None and task.body_ref is None and out.documents == ()
    assert len(out.message.body) < MAX_MESSAGE_BYTES


# --- input bounds -------------------------------------------------------------------------


def billion_laughs(where: str = "args") -> str:
    lines = ['lol: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for level in range(1, 10):
        prev, name = chr(ord("a") + level - 1), chr(ord("a") + level)
        lines.append(f"{name}{level}: &{name} [" + ", ".join([f"*{prev}"] * 9) + "]")
    return "\n".join(lines)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "params:\n  a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n"
            + "".join(
                f"  {chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]\n"
                for i in range(9)
            )
            + "name: bomb\ntasks: [{name: t, cmd: echo, args: *j}]\n",
            "its YAML aliases expand it beyond the limit",
        ),
        ("name: loop\ntasks: &t [{name: t, cmd: echo, args: *t}]\n", "refers to a node that"),
        (
            "params:\n  p0: &p0 [1]\n"
            + "".join(f"  p{i}: &p{i} [*p{i - 1}]\n" for i in range(1, 150))
            + "name: chain\ntasks: [{name: t, cmd: echo}]\n",
            "nested more than 100 levels deep once its YAML aliases are expanded",
        ),
    ],
    ids=["billion-laughs", "recursive-alias", "alias-chain"],
)
def test_a_yaml_whose_aliases_expand_without_bound_is_refused_naming_the_file(
    text: str, expected: str
) -> None:
    with pytest.raises(ValidationError, match=f"^bomb.yaml: .*{expected}"):
        load_text(text, source="bomb.yaml")


def test_yaml_anchors_within_bounds_still_load() -> None:
    text = (
        "name: ok\nparams:\n  base: &base {retries: 2, queue: cpu}\n"
        "tasks:\n  - {name: a, cmd: 'x && y', retry: &r {backoff_s: 1}}\n"
        "  - {name: b, cmd: echo, retry: *r}\n"
    )
    d = load_text(text, source="ok.yaml")
    assert d.tasks[1].retry == d.tasks[0].retry and d.params["base"]["queue"] == "cpu"


@pytest.mark.parametrize("depth", [960, 990, 5000])
@pytest.mark.parametrize("suffix", ["json", "yaml"])
def test_a_definition_with_a_deeply_nested_param_is_refused_in_one_line(
    depth: int, suffix: str
) -> None:
    deep = "[" * depth + "]" * depth
    text = f'{{"name": "x", "params": {{"p": {deep}}}, "tasks": [{{"name": "a", "cmd": "e"}}]}}'
    with pytest.raises(ValidationError) as caught:
        load_text(text, source=f"deep.{suffix}")
    message = str(caught.value)
    assert message.startswith(f"deep.{suffix}: ") and "nest" in message
    assert "\n" not in message


def test_deep_args_are_refused_naming_the_task() -> None:
    raw = json.dumps({"name": "x", "tasks": [{"name": "a", "call": "m:f", "args": nested(150)}]})
    with pytest.raises(ValidationError, match="task 'a': args is nested more than 100"):
        load_text(raw, source="w.json")


@pytest.mark.parametrize("depth", [150, 970, 5000])
def test_a_deep_param_on_the_command_line_is_refused(depth: int) -> None:
    with pytest.raises(PayloadTooLarge, match=r"^-p p: the value is nested"):
        parse_param("p=" + "[" * depth + "]" * depth)


@pytest.mark.parametrize("value", [1.5, 2.25, float("inf")])
def test_allow_failures_that_is_neither_a_count_nor_a_fraction_is_refused(value: float) -> None:
    task = {"name": "fan", "cmd": "true", "foreach": "[1, 2, 3]", "allow_failures": value}
    with pytest.raises(ValidationError, match=r"task 'fan': allow_failures: .* neither a count"):
        definition([task])


@pytest.mark.parametrize("value", [0, 0.5, 0.99, 1, 2.0, 3])
def test_allow_failures_as_a_count_or_a_fraction_is_accepted(value: float) -> None:
    task = {"name": "fan", "cmd": "true", "foreach": "[1, 2, 3]", "allow_failures": value}
    definition([task])


@pytest.mark.parametrize(
    "raw",
    [
        {"name": "x", "tasks": [{"name": "a", "cmd": "e", "queue": "q" * 5000}]},
        {"name": "x", "tasks": [{"name": "a", "cmd": "e", "depends_on": ["d" * 5000]}]},
        {"name": "x", "params": {"p" * 5000: 1}, "tasks": [{"name": "a", "cmd": "e"}]},
        {"name": "x", "tasks": [{"name": "a", "cmd": "e", "b" * 5000: 1}]},
        {"name": "x", "tasks": [{"name": "n" * 5000, "cmd": "e", "bogus": 1}]},
        {"name": "x", "tasks": [{"name": "n" * 5000, "cmd": "e"}]},
        {"name": "w" * 5000, "tasks": [{"name": "a", "cmd": "e"}]},
    ],
    ids=["queue", "dependency", "param", "field", "task-name-and-field", "task-name", "name"],
)
def test_a_5000_character_name_is_never_echoed_in_full(raw: dict[str, Any]) -> None:
    with pytest.raises(ValidationError) as caught:
        load_text(json.dumps(raw), source="w.json")
    assert len(str(caught.value)) < 600, str(caught.value)


# --- the client and the coordinator -------------------------------------------------------


WAITS = [
    {"name": "approve", "wait_for": {"signal": "go"}},
    {"name": "after", "depends_on": ["approve"]},
]


@pytest.mark.parametrize("depth", [101, 970, 5000])
async def test_the_client_refuses_deep_signal_data_before_sending_anything(depth: int) -> None:
    store = open_memory_store()
    client = Client(store)
    await client.submit(definition(WAITS), workflow_id="wf")

    with pytest.raises(PayloadTooLarge, match="the data of signal 'go' is nested more than 100"):
        await client.signal("wf", "go", nested(depth))
    sent = await store.queues.receive(
        keys.COMPLETIONS_QUEUE, max_messages=10, visibility_timeout_s=60
    )
    assert len(sent) == 1  # the submit event, and nothing since


async def test_the_client_refuses_signal_data_over_its_hard_bound() -> None:
    store = open_memory_store()
    client = Client(store)
    await client.submit(definition(WAITS), workflow_id="wf")
    with pytest.raises(PayloadTooLarge, match=f"over the limit of {payloads.MAX_SIGNAL_BYTES}"):
        await client.signal("wf", "go", "s" * payloads.MAX_SIGNAL_BYTES)


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"p": nested(970)}, "param 'p' is nested more than 100 levels deep"),
        ({"p": "p" * payloads.MAX_PARAMS_BYTES}, "over the limit of 1048576 bytes"),
        ({"p": object()}, "param 'p' is not JSON-serialisable"),
    ],
    ids=["deep", "large", "not-json"],
)
async def test_the_client_refuses_params_over_their_bounds(
    params: dict[str, Any], expected: str
) -> None:
    d = definition([{"name": "a", "cmd": "echo {{ params.p }}"}], params={"p": None})  # any type
    store = open_memory_store()
    with pytest.raises(ValidationError, match=expected):
        await Client(store).submit(d, params=params)
    assert await store.documents.list("definitions/") == []


async def test_the_client_refuses_a_definition_built_in_python_with_deep_args() -> None:
    d = definition([{"name": "a", "call": "m:f", "args": {"x": 1}}])
    deep = msgspec.structs.replace(
        d, tasks=[msgspec.structs.replace(d.tasks[0], args=nested(5000))]
    )
    with pytest.raises(PayloadTooLarge, match="task 'a': args is nested more than 100"):
        await Client(open_memory_store()).submit(deep)


async def test_a_deep_event_that_arrives_anyway_is_dead_lettered_and_nothing_else_stops() -> None:
    store = open_memory_store()
    await submit(store, definition(WAITS), workflow_id="wf")
    coord = Coordinator(store, CoordinatorOptions())
    await coord.step()
    shallow = encode_events([SignalSent(workflow_id="wf", name="go", data=nested(3))])
    deep = shallow.replace(b"\x91\x91\x91\x01", b"\x91" * 5000 + b"\x01")
    await store.queues.send(keys.COMPLETIONS_QUEUE, [OutgoingMessage(deep)])

    await coord.step()

    [dead] = await store.queues.dead_letters(keys.COMPLETIONS_QUEUE)
    assert "nested too deep" in dead.reason
    await Client(store).signal("wf", "go", {"ok": True})
    await coord.step()
    st = coord.state_of("wf")
    assert st is not None and st.task_status[0] == TaskStatus.COMPLETED


async def test_a_retry_of_hundreds_of_long_named_tasks_travels_by_reference() -> None:
    store = open_memory_store()
    names = [f"{'t' * 180}{i}" for i in range(300)]  # 55 KB of names
    await submit(store, definition([{"name": n} for n in names]), workflow_id="wf")
    coord = Coordinator(store, CoordinatorOptions())
    await coord.step()
    sent = await store.queues.receive("default", max_messages=1000, visibility_timeout_s=60)
    tasks = [t for m in sent for t in decode_tasks(m.body)]
    failed = [
        TaskFinished(workflow_id="wf", task=t.task, attempt=1, at=0.0, ok=False, retryable=False)
        for t in tasks
    ]
    await store.queues.send(keys.COMPLETIONS_QUEUE, [OutgoingMessage(encode_events(failed))])
    await coord.step()
    assert (st := coord.state_of("wf")) is not None and st.status == "failed"

    await Client(store).retry("wf", names, ack_timeout_s=0)
    await coord.step()

    assert st.status == "running" and set(st.attempt) == {2}


async def test_a_cancel_reason_of_any_length_is_sent_cut() -> None:
    store = open_memory_store()
    await submit(store, definition([{"name": "a"}]), workflow_id="wf")
    await Client(store).cancel("wf", "r" * 100_000)
    coord = Coordinator(store, CoordinatorOptions())
    await coord.step()
    assert (st := coord.state_of("wf")) is not None and st.status in ("cancelled", "cancelling")


LONG = "n" * 5000


@pytest.mark.parametrize(
    "call",
    [
        lambda: check_workflow_id(LONG),
        lambda: check_queue_name(LONG),
        lambda: parse_param(LONG),
        lambda: resolve_params(definition([{"name": "a"}]), {LONG: 1}),
    ],
    ids=["workflow-id", "queue", "param-text", "unknown-param"],
)
def test_a_5000_character_name_given_elsewhere_is_echoed_in_part(call: Any) -> None:
    with pytest.raises(ValidationError) as caught:
        call()
    assert len(str(caught.value)) < 400, str(caught.value)


async def test_a_5000_character_task_name_asked_of_the_client_is_echoed_in_part() -> None:
    store = open_memory_store()
    await submit(store, definition([{"name": "a"}]), workflow_id="wf")
    with pytest.raises(UsageError) as caught:
        await Client(store).logs("wf", LONG)
    assert len(str(caught.value)) < 300


def test_a_definition_text_over_its_bound_is_refused_before_it_is_parsed() -> None:
    text = "name: x\ntasks: [{name: a, cmd: e}]\n#" + "x" * payloads.MAX_DEFINITION_BYTES
    with pytest.raises(ValidationError, match=r"^big.yaml: \d+ characters, over the limit"):
        load_text(text, source="big.yaml")


async def test_a_definition_over_its_bound_is_refused_at_submit_before_it_is_stored() -> None:
    command = "echo " + "c" * 15_000  # each task within its own bound
    d = definition([{"name": f"t{i}", "cmd": command} for i in range(2300)])
    store = open_memory_store()
    with pytest.raises(PayloadTooLarge, match="over the limit of 33554432 bytes"):
        await Client(store).submit(d, workflow_id="wf")
    assert await store.documents.list("definitions/") == []


async def test_the_client_refuses_a_billion_laughs_file_like_the_command_line(
    tmp_path: Path,
) -> None:
    path = tmp_path / "lol.yaml"
    path.write_text(
        "params:\n  a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n"
        + "".join(
            f"  {chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]\n"
            for i in range(9)
        )
        + "name: bomb\ntasks: [{name: t, cmd: echo, args: *j}]\n"
    )
    with pytest.raises(ValidationError, match=r"lol\.yaml: its YAML aliases expand it beyond"):
        await Client(open_memory_store()).submit(path)


async def test_a_definition_stored_before_the_bounds_is_damaged_data_not_a_recursion_error() -> (
    None
):
    store = open_memory_store()
    await submit(store, definition([{"name": "a"}]), workflow_id="wf")
    doc = await store.documents.get(keys.definition("wf"))
    assert doc is not None
    deep = doc.data.replace(b'"params":{}', b'"params":{"p":' + b"[" * 5000 + b"]" * 5000 + b"}")
    assert deep != doc.data
    await store.documents.put(keys.definition("wf"), deep)
    with pytest.raises(DamagedData, match="nested too deep"):
        await Client(store).status("wf")


# --- names echoed, outputs over the hard bound, exceptions that cannot be printed ------


def test_echo_escapes_control_characters_so_an_error_stays_one_line() -> None:
    assert payloads.echo("charge\nrefund") == "charge\\nrefund"
    assert payloads.echo("a\x1b[31mred\tb\u202ec") == "a\\x1b[31mred\\tb\\u202ec"
    assert payloads.echo("naïve é") == "naïve é"
    long = payloads.echo("\n" * 200)
    assert "\n" not in long and long.endswith("… (200 characters)")


async def test_an_output_over_the_hard_bound_fails_the_attempt_naming_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(payloads, "MAX_OUTPUT_BYTES", 1000)
    _, event = await report(Outcome(ok=True, output="o" * 1000))
    assert (event.ok, event.retryable, event.output, event.output_ref) == (False, False, None, None)
    assert event.error.startswith("the output (as JSON) is 1002 bytes, over the limit of 1000")


def test_a_python_output_over_the_bound_is_refused_where_it_is_encoded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(child, "MAX_OUTPUT_BYTES", 1000)
    reply = child.encode_output(["x" * 500, "y" * 500])
    assert (reply.ok, reply.retryable, reply.output) == (False, False, b"")
    assert reply.error is not None and "1007 bytes, over the limit of 1000 bytes" in reply.error
    assert child.encode_output("x" * 900).ok


SHELL = TaskContext(workflow_id="wf", task="t", attempt=1, idempotency_key="k")


async def shell(cmd: str, tmp_path: Path) -> Outcome:
    return await asyncio.wait_for(
        run_shell(TaskSpec(kind="shell", cmd=cmd), SHELL, work_dir=str(tmp_path)), 20
    )


@pytest.mark.parametrize(
    ("cmd", "kind"),
    [
        ('rm -f "$DAGQ_OUTPUT"; mkfifo "$DAGQ_OUTPUT"', "a FIFO"),
        ('ln -sf /dev/zero "$DAGQ_OUTPUT"', "a character device"),
        ('rm -f "$DAGQ_OUTPUT"; mkdir "$DAGQ_OUTPUT"', "a directory"),
    ],
)
async def test_a_dagq_output_that_is_not_a_regular_file_fails_only_its_attempt(
    cmd: str, kind: str, tmp_path: Path
) -> None:
    outcome = await shell(cmd, tmp_path)
    assert (outcome.ok, outcome.retryable) == (False, False)
    assert outcome.error == f"$DAGQ_OUTPUT is not a regular file ({kind})"


async def test_a_dagq_output_over_the_bound_is_refused_without_being_read(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(shell_runner, "MAX_OUTPUT_BYTES", 1000)
    outcome = await shell('truncate -s 5G "$DAGQ_OUTPUT"', tmp_path)
    assert (outcome.ok, outcome.retryable) == (False, False)
    assert outcome.error is not None
    assert outcome.error.startswith("$DAGQ_OUTPUT is 5368709120 bytes, over the limit of 1000")
    # Over the bound once encoded (1e5 is 100000.0), though the file is not: refused too.
    numbers = ",".join(["1e5"] * 200)
    outcome = await shell(f"""echo '[{numbers}]' > "$DAGQ_OUTPUT\"""", tmp_path)
    assert outcome.error == (
        "the output (as JSON) is 1801 bytes, over the limit of 1000 bytes for a task's output"
    )


async def test_a_dagq_output_within_the_bounds_is_handed_over_encoded(tmp_path: Path) -> None:
    outcome = await shell("""printf '{ "a" : [1, 2] }\\n' > "$DAGQ_OUTPUT\"""", tmp_path)
    assert (outcome.ok, outcome.output) == (True, {"a": [1, 2]})
    assert outcome.output_json == b'{"a":[1,2]}'
    assert (await shell("true", tmp_path)).output_json is None


async def test_in_thread_mode_too_an_output_over_the_bound_fails_its_attempt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(child, "MAX_OUTPUT_BYTES", 1000)
    spec = TaskSpec(kind="python", call="tests.sample_tasks:big", timeout_s=10)
    outcome = await run_python(spec, SHELL, {"size": 2000})
    assert (outcome.ok, outcome.retryable) == (False, False)
    assert outcome.error is not None and "2002 bytes, over the limit of 1000" in outcome.error
    small = await run_python(spec, SHELL, {"size": 10})
    assert (small.ok, small.output, small.output_json) == (True, "x" * 10, b'"' + b"x" * 10 + b'"')


async def test_an_exception_that_cannot_be_printed_is_reported_by_its_type() -> None:
    spec = TaskSpec(kind="python", call="tests.sample_tasks:unprintable", timeout_s=10)
    outcome = await run_python(spec, SHELL, None)  # thread mode
    assert outcome.error == "Unprintable: <unprintable: str() raised RuntimeError: str fails>"
    assert outcome.error_type == "Unprintable"
    assert b"Traceback (most recent call last)" in outcome.log and b"in unprintable" in outcome.log
    pool = TaskPool(1)
    try:
        pooled = await pool.run("tests.sample_tasks:unprintable", None, SHELL, 10)
        after = await pool.run("tests.sample_tasks:pid", {}, SHELL, 10)
    finally:
        await pool.close()
    assert pooled.error == outcome.error and b"in unprintable" in pooled.log
    assert after.ok and pool.started == 1  # the process survived it
