"""The stored inputs a pool process holds, kept in step on both ends of its pipe.

Every instance of a ``foreach`` task gets the same inputs: its parents' outputs, one
stored document each (the list it fans out over, often). A fan-out of a million over a
2 MB list would send those bytes down a pool process's pipe a million times. So the
worker sends a document to a process once; later requests leave its bytes out and the
process takes them from what it holds.

Both ends keep a :class:`Held` per process and apply the same steps in the same order
(a process runs one request at a time, and reads every request it is sent), so they
hold the same documents without telling each other. The worker's end holds the very
bytes objects it sent and leaves a document out only when it is about to send that
same object again: a document fetched anew from the store is sent anew.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import replace

from dagq.errors import DamagedData
from dagq.runners import StoredInputs

#: How many documents, and how many bytes in all, a pool process holds.
HELD_DOCUMENTS = 8
HELD_BYTES = 16 * 1024 * 1024


class Held:
    """The documents one pool process holds, least recently used first."""

    __slots__ = ("_bytes", "_documents")

    def __init__(self) -> None:
        self._documents: OrderedDict[str, bytes] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._documents)

    def leave_out(self, inputs: StoredInputs) -> StoredInputs:
        """The worker's end: ``inputs`` with the documents the process holds left out
        (``None`` in place of their bytes)."""
        document = inputs.document
        if document is not None:
            document = self._sending(inputs.document_key, document)
        outputs = tuple((n, k, self._sending(k, d)) for n, k, d in inputs.outputs)
        return replace(inputs, document=document, outputs=outputs)

    def fill_in(self, inputs: StoredInputs) -> StoredInputs:
        """The process's end: ``inputs`` with the documents left out taken from what it
        holds (DamagedData if one is not held: the ends fell out of step)."""
        document = inputs.document
        if document is not None or inputs.document_key:
            document = self._received(inputs.document_key, document)
        outputs = tuple((n, k, self._received(k, d)) for n, k, d in inputs.outputs)
        return replace(inputs, document=document, outputs=outputs)

    def _sending(self, key: str, data: bytes | None) -> bytes | None:
        if data is None:
            return None
        held = self._documents.get(key)
        if held is data:
            self._documents.move_to_end(key)
            return None
        self._keep(key, data)
        return data

    def _received(self, key: str, data: bytes | None) -> bytes:
        if data is not None:
            self._keep(key, data)
            return data
        held = self._documents.get(key)
        if held is None:
            raise DamagedData(f"{key} was left out of the request and is not held here")
        self._documents.move_to_end(key)
        return held

    def _keep(self, key: str, data: bytes) -> None:
        old = self._documents.pop(key, None)
        if old is not None:
            self._bytes -= len(old)
        if len(data) > HELD_BYTES // 2:
            return  # too large to hold: sent every time
        self._documents[key] = data
        self._bytes += len(data)
        while self._bytes > HELD_BYTES or len(self._documents) > HELD_DOCUMENTS:
            _, dropped = self._documents.popitem(last=False)
            self._bytes -= len(dropped)
