"""Entity group transactions built without the ``email`` package
(:mod:`dagq.stores.azure_batch`): the same bytes as the SDK's own builder, and only a
plain success read as one. No network: the requests are built, not sent."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("azure.data.tables")

from azure.core.rest import HttpRequest
from azure.data.tables import UpdateMode
from azure.data.tables.aio import TableClient

from dagq.stores import azure_batch
from dagq.stores.azure_auth import AZURITE_KEY

CONNECTION = (
    "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
    f"AccountKey={AZURITE_KEY};TableEndpoint=http://127.0.0.1:1/devstoreaccount1;"
)


def _operations() -> list[Any]:
    replace = {"mode": UpdateMode.REPLACE}
    return [
        (
            "upsert",
            {"PartitionKey": "x:03", "RowKey": "r|running|00ff-9e~", "r0": b"\x00\xff\r\n"},
            replace,
        ),
        (
            "upsert",
            {"PartitionKey": "x:03", "RowKey": "w|~7769", "status": "a\r\nb", "f": 1.5},
            replace,
        ),
        ("delete", {"PartitionKey": "x:03", "RowKey": "r|pending|0001-9e~"}, {}),
        ("upsert", {"PartitionKey": "x:03", "RowKey": "é ü/?#", "n": 3, "t": "From x"}, {}),
    ]


def _sdk_body(parts: list[HttpRequest], changeset: str, batch: str) -> bytes:
    """The body the SDK's pipeline builds for these parts (its ``email`` generator)."""
    inner = HttpRequest("POST", "")
    inner.set_multipart_mixed(*parts, policies=[], boundary=changeset)
    outer = HttpRequest("POST", "http://127.0.0.1:1/$batch")
    outer.set_multipart_mixed(inner, policies=[], enforce_https=False, boundary=batch)
    outer.prepare_multipart_body()
    assert outer.headers["Content-Type"] == f"multipart/mixed; boundary={batch}"
    return outer.content


async def test_the_body_is_the_sdks_byte_for_byte() -> None:
    async with TableClient.from_connection_string(CONNECTION, "dagqtable") as table:
        for count in (1, 2, 4):
            parts = azure_batch.operations_requests(table, _operations()[:count])
            assert parts is not None and len(parts) == count
            for part in parts:
                azure_batch.stamp(part, "Wed, 02 Dec 2026 06:00:00 GMT")
            ours = azure_batch.multipart(parts, "changeset_c1", "batch_b1")
            assert ours == _sdk_body(parts, "changeset_c1", "batch_b1")


def _answer(*statuses: str) -> bytes:
    parts = b"".join(
        b"--changesetresponse_c\r\nContent-Type: application/http\r\n"
        b"Content-Transfer-Encoding: binary\r\n\r\nHTTP/1.1 " + s.encode() + b"\r\n"
        b"DataServiceVersion: 3.0;\r\n\r\n"
        b'{"odata.error":{"message":{"value":"0:x\\nHTTP/1.1 204 No Content"}}}\r\n'
        for s in statuses
    )
    return (
        b"--batchresponse_b\r\nContent-Type: multipart/mixed; boundary=changesetresponse_c"
        b"\r\n\r\n" + parts + b"--changesetresponse_c--\r\n--batchresponse_b--\r\n"
    )


def test_only_an_answer_of_every_part_succeeding_is_a_success() -> None:
    assert azure_batch.succeeded(_answer("204 No Content", "204 No Content"), 2)
    assert azure_batch.succeeded(_answer("201 Created"), 1)
    assert azure_batch.succeeded(_answer("204", "200 OK"), 2)  # no reason phrase: still read
    # the service answers a failed transaction with the failed part alone
    assert not azure_batch.succeeded(_answer("404 Not Found"), 3)
    assert not azure_batch.succeeded(_answer("409 Conflict"), 1)
    assert not azure_batch.succeeded(_answer("204 No Content", "412 Precondition Failed"), 2)
    assert not azure_batch.succeeded(_answer("204 No Content"), 2)
    assert not azure_batch.succeeded(b"", 1)


async def test_where_the_sdk_builds_them_otherwise_its_own_call_sends_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def other_signature(**_: Any) -> None:
        raise TypeError("unexpected keyword argument 'config'")

    monkeypatch.setattr(azure_batch, "TableBatchOperations", other_signature)
    sent: list[Any] = []
    async with TableClient.from_connection_string(CONNECTION, "dagqtable") as table:

        async def submit_transaction(operations: Any) -> list[Any]:
            sent.append(list(operations))
            return []

        monkeypatch.setattr(table, "submit_transaction", submit_transaction)
        assert await azure_batch.submit(table, _operations())
    assert sent == [_operations()]
