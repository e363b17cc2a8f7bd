"""The copies of new workflows a coordinator keeps for its first loads (``preload``):
bounded, but a copy whose state is not written yet — the only copy of that state —
is never dropped; a new one is declined instead (its submit writes the state)."""

from __future__ import annotations

from dagq.plan import compile_plan, resolve_params
from dagq.preloads import Preloads
from dagq.state import RunState
from dagq.submitted import Created, Submitted
from tests.helpers import definition

_DEFINITION = definition([{"name": "a"}])
_PLAN = compile_plan(_DEFINITION, resolve_params(_DEFINITION, {}))


def _created(workflow_id: str, etag: str) -> Created:
    submitted = Submitted(
        workflow_id=workflow_id,
        definition=_DEFINITION,
        params={},
        created_at=1000.0,
        fingerprint="f",
    )
    state = RunState(workflow_id, len(_PLAN.tasks), 1000.0)
    return Created(submitted=submitted, plan=_PLAN, state=state, etag=etag)


def test_full_of_unwritten_copies_it_declines_a_new_one_and_drops_none() -> None:
    kept = Preloads(3)
    assert all(kept.keep(_created(f"w{i}", "")) for i in range(3))
    assert not kept.keep(_created("w3", ""))  # its submit writes the state itself
    assert not kept.keep(_created("w3", "e3"))  # written: still no room
    assert _ids(kept) == ["w0", "w1", "w2"]
    assert kept.unwritten == 3


def test_to_make_room_it_drops_the_oldest_written_copy() -> None:
    kept = Preloads(3)
    kept.keep(_created("w0", ""))
    kept.keep(_created("w1", "e1"))
    kept.keep(_created("w2", "e2"))
    assert kept.keep(_created("w3", ""))  # w1 goes: read back when loaded
    assert _ids(kept) == ["w0", "w2", "w3"]
    assert kept.keep(_created("w4", "e4"))  # w2 goes
    assert _ids(kept) == ["w0", "w3", "w4"]
    assert kept.keep(_created("w5", ""))  # w4 goes
    assert _ids(kept) == ["w0", "w3", "w5"]
    assert not kept.keep(_created("w6", "e6"))
    assert kept.unwritten == 3


def test_a_copy_taken_or_cleared_makes_room_again() -> None:
    kept = Preloads(2)
    kept.keep(_created("w0", ""))
    kept.keep(_created("w1", ""))
    taken = kept.take("w0")
    assert taken is not None and taken.submitted.workflow_id == "w0"
    assert kept.take("w0") is None
    assert kept.unwritten == 1
    assert kept.keep(_created("w2", ""))
    kept.clear()
    assert not kept and kept.unwritten == 0
    assert kept.keep(_created("w3", "")) and kept.keep(_created("w4", ""))


def test_a_namesakes_copy_is_replaced_not_counted_twice() -> None:
    kept = Preloads(2)
    kept.keep(_created("w0", ""))
    assert kept.keep(_created("w0", "e0"))  # purged and submitted again
    assert kept.unwritten == 0 and len(kept) == 1
    kept.keep(_created("w1", ""))
    assert kept.keep(_created("w2", ""))  # w0, written, made room
    assert _ids(kept) == ["w1", "w2"]


def _ids(kept: Preloads) -> list[str]:
    return [f"w{i}" for i in range(10) if f"w{i}" in kept]
