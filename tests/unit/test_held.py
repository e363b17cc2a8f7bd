"""Both ends of a pool process's pipe hold the same stored inputs (dagq.runners.held):
a document is sent once, then left out; eviction happens alike on both ends."""

from __future__ import annotations

import msgspec
import pytest

from dagq.errors import DamagedData
from dagq.runners import StoredInputs
from dagq.runners.held import HELD_BYTES, HELD_DOCUMENTS, Held

pytestmark = pytest.mark.timeout(10)


def outputs(*documents: tuple[str, bytes]) -> StoredInputs:
    return StoredInputs(outputs=tuple((key, key, data) for key, data in documents))


def test_a_document_is_sent_once_then_left_out_and_filled_in() -> None:
    worker, process = Held(), Held()
    data = b"[1, 2, 3]"
    sent = [worker.leave_out(outputs(("a", data))) for _ in range(3)]
    assert [s.outputs[0][2] for s in sent] == [data, None, None]
    assert [process.fill_in(s).decode() for s in sent] == [{"a": [1, 2, 3]}] * 3


def test_the_same_key_with_other_bytes_is_sent_again() -> None:
    worker, process = Held(), Held()
    process.fill_in(worker.leave_out(outputs(("a", b"1"))))
    fresh = worker.leave_out(outputs(("a", b"2")))
    assert fresh.outputs[0][2] == b"2"
    assert process.fill_in(fresh).decode() == {"a": 2}


def test_both_ends_evict_alike() -> None:
    worker, process = Held(), Held()
    documents = [(f"k{i}", f"{i}".encode()) for i in range(HELD_DOCUMENTS + 3)]
    documents.append(("big", b'"' + b"7" * (HELD_BYTES // 2) + b'"'))  # too large to hold
    for key, data in documents + documents[::-1] + documents:
        request = worker.leave_out(outputs((key, data)))
        assert process.fill_in(request).decode() == {key: msgspec.json.decode(data)}
    assert len(worker) == len(process) <= HELD_DOCUMENTS


def test_a_document_left_out_that_is_not_held_is_refused() -> None:
    left_out = Held().leave_out(StoredInputs(document=b"{}", document_key="d"))
    assert left_out.document == b"{}"  # first time: sent
    with pytest.raises(DamagedData, match="d was left out of the request and is not held"):
        Held().fill_in(StoredInputs(document=None, document_key="d"))
