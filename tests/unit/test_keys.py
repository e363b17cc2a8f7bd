"""Idempotency keys and message ids are unambiguous by construction: no task, instance
or compensation shares one with another, whatever the task names."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from dagq import keys
from dagq.dispatching import task_message
from dagq.machine import Dispatch
from dagq.messages import decode_task
from dagq.validation import NAME_PATTERN
from tests.helpers import Sim

#: A task name as validation allows it (kept short so collisions are likely to be tried).
names = st.from_regex(r"\A[a-c0-1_][a-c0-1_./:@+=\-]{0,6}\Z")
#: What an attempt runs: the task (-1, False), instance k, or the compensation.
parts = st.one_of(
    st.just((-1, False)),
    st.just((-1, True)),
    st.tuples(st.integers(0, 12), st.just(False)),
)


def test_a_task_named_like_a_compensation_does_not_share_its_key_or_message_id() -> None:
    sim = Sim(
        [
            {"name": "charge", "compensate": {"cmd": "refund"}},
            {"name": "charge/undo"},
        ]
    )
    sim.start()
    undo = task_message(sim.plan, sim.state, Dispatch(sim.index("charge"), 1, undo=True))
    task = task_message(sim.plan, sim.state, Dispatch(sim.index("charge/undo"), 1))

    assert undo.message.id != task.message.id
    undo_key = decode_task(bytes(undo.message.body)).idempotency_key
    task_key = decode_task(bytes(task.message.body)).idempotency_key
    assert undo_key != task_key
    assert (undo_key, task_key) == ("wf-1/charge#undo", "wf-1/charge/undo")


def test_the_characters_that_mark_instances_and_undos_cannot_appear_in_a_task_name() -> None:
    for name in ("x[0]", "charge#undo", "a]", "b["):
        assert not NAME_PATTERN.match(name), name


@given(st.lists(st.tuples(names, parts, st.integers(1, 12)), min_size=2, max_size=12, unique=True))
def test_message_ids_and_idempotency_keys_never_collide(
    attempts: list[tuple[str, tuple[int, bool], int]],
) -> None:
    ids = {}
    for name, (item, undo), attempt in attempts:
        assert NAME_PATTERN.match(name)
        part = keys.attempt_name(name, item=item, undo=undo)
        ids.setdefault(keys.message_id("wf", part, attempt), set()).add((name, item, undo, attempt))
    assert all(len(found) == 1 for found in ids.values()), ids
    owners = {}
    for name, (item, undo), _ in attempts:
        key = keys.idempotency_key("wf", name, item=item, undo=undo)
        assert owners.setdefault(key, (name, item, undo)) == (name, item, undo), key


def test_message_ids_stay_deterministic_per_attempt() -> None:
    assert keys.message_id("wf", keys.attempt_name("x", item=3), 2) == "wf/x[3]/2"
    assert keys.message_id("wf", keys.attempt_name("charge", undo=True), 1) == "wf/charge#undo/1"
    assert keys.message_id("wf", keys.attempt_name("a/b"), 1) == "wf/a/b/1"
