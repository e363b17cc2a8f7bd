"""Hostile input: names that could escape storage paths, random definitions, broken
messages and a very large definition — each refused with a clean error or handled
correctly, never a traceback of another kind or a hang."""

from __future__ import annotations

import contextlib
import string
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dagq.errors import ValidationError
from dagq.loading import load_data
from dagq.messages import (
    TaskFinished,
    TaskMessage,
    TaskSpec,
    decode_events,
    decode_tasks,
    encode_events,
    encode_task,
)
from dagq.plan import compile_plan
from dagq.validation import check_queue_name, check_workflow_id

pytestmark = pytest.mark.timeout(120)

SAFE = set(string.ascii_letters + string.digits + "_.-")
HOSTILE_TEXT = st.one_of(
    st.text(max_size=200),
    st.sampled_from(
        ["../x", "/etc/passwd", "a/../../b", "a\n", "a\x00b", "..", ".", "a\\b", "C:\\x", "é", ""]
    ),
    st.builds(lambda a, b: a + b, st.sampled_from(["ok", "../", "a\n"]), st.text(max_size=20)),
)


@given(HOSTILE_TEXT)
def test_a_workflow_id_is_accepted_only_if_it_cannot_leave_its_storage_path(text: str) -> None:
    try:
        check_workflow_id(text)
    except ValidationError as exc:
        assert "is not valid" in str(exc)
        return
    assert set(text) <= SAFE and text[0] not in "._-" and 1 <= len(text) <= 128


@given(HOSTILE_TEXT)
def test_a_queue_name_is_accepted_only_if_every_backend_can_hold_it(text: str) -> None:
    try:
        check_queue_name(text)
    except ValidationError:
        return
    assert set(text) <= SAFE and text[0] not in "._-" and 1 <= len(text) <= 63


SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True),
    st.text(max_size=30),
)
FIELDS = st.sampled_from(
    [
        "name", "cmd", "call", "depends_on", "queue", "condition", "timeout_s",
        "num_retries", "args", "dep_policy", "foreach", "loop", "wait_for", "sleep_s",
        "compensate", "retry", "max_parallel", "allow_failures", "bogus",
    ]
)  # fmt: skip
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
TASKS = st.lists(
    st.dictionaries(FIELDS, VALUES | st.sampled_from(["a", "b", "true"]), max_size=6), max_size=6
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.fixed_dictionaries(
        {"name": st.one_of(st.text(max_size=10), SCALARS), "tasks": st.one_of(TASKS, VALUES)},
        optional={"params": VALUES, "defaults": VALUES, "deadline_s": SCALARS},
    )
)
def test_a_random_definition_loads_or_is_refused_cleanly(raw: dict[str, Any]) -> None:
    try:
        definition = load_data(raw, source="fuzz.yaml")
    except ValidationError as exc:
        assert str(exc).startswith("fuzz.yaml")
        return
    with contextlib.suppress(ValidationError):
        compile_plan(definition, {})


def _task(i: int) -> TaskMessage:
    spec = TaskSpec(kind="shell", cmd="true")
    return TaskMessage(
        workflow_id="w", task=i, name=f"t{i}", attempt=1, spec=spec, idempotency_key="k"
    )


VALID = [
    encode_task(_task(1)),
    encode_events([TaskFinished(workflow_id="w", task=1, attempt=1, at=1.0, ok=True)]),
]


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=300), st.sampled_from(VALID).flatmap(
    lambda body: st.integers(0, len(body) - 1).map(lambda n: body[:n])
)))  # fmt: skip
def test_a_broken_or_truncated_message_is_a_decode_error_and_nothing_else(body: bytes) -> None:
    for decode in (decode_tasks, decode_events):
        with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
            decode(body)


def test_a_definition_of_100_000_tasks_loads_and_compiles() -> None:
    tasks: list[dict[str, Any]] = [{"name": "root", "cmd": "true"}]
    tasks += [{"name": f"t{i}", "cmd": "true", "depends_on": ["root"]} for i in range(100_000)]
    definition = load_data({"name": "huge", "tasks": tasks}, source="huge.yaml")
    plan = compile_plan(definition, {})
    assert len(plan.tasks) == 100_001


def test_a_100_000_task_cycle_is_refused_by_name() -> None:
    tasks = [
        {"name": f"t{i}", "cmd": "true", "depends_on": [f"t{(i + 1) % 100_000}"]}
        for i in range(100_000)
    ]
    with pytest.raises(ValidationError, match="cycle"):
        compile_plan(load_data({"name": "loop", "tasks": tasks}, source="loop.yaml"), {})
