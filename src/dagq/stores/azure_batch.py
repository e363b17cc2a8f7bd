"""Entity group transactions sent through the table SDK without the ``email`` package.

The SDK's ``TableClient.submit_transaction`` builds its multipart request with the
standard library's ``email`` generator and reads the answer with its parser: ~60 % of
a transaction's CPU in this process (13.6 ms for a transaction of three moves on the
2-core benchmark machine, against 2.2 ms for a single upsert). Here the SDK still
builds every operation's request (``TableBatchOperations``, as ``submit_transaction``
does) and sends the transaction through the client's own pipeline (signing, retries,
transport); only the two envelopes are joined as bytes, in the layout the SDK's
generator writes (``tests/unit/test_azure_batch.py`` compares the two byte for
byte), and a plain success — every part answered 2xx — is recognised from its status
lines.

Anything else is read by the SDK: :func:`submit` answers False, and the caller sends
the transaction again through ``submit_transaction``, which raises what it always
raised. An entity group transaction is atomic: one that did not succeed wrote
nothing, so sending it again is as sending it once. (A success this did not recognise
would be sent again too: its upserts change nothing, and a delete in it fails, which
makes the index look where the row is, as when another process moved it.)
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Sequence
from typing import Any
from wsgiref.handlers import format_date_time

from azure.core.rest import HttpRequest
from azure.data.tables._table_batch import TableBatchOperations  # submit_transaction's own
from azure.data.tables.aio import TableClient

_CRLF = b"\r\n"
_STATUS = re.compile(rb"^HTTP/1\.[01] (\d{3})\b", re.MULTILINE)


def stamp(request: HttpRequest, now: str) -> None:
    """The date headers the SDK's ``StorageHeadersPolicy`` puts on each part."""
    request.headers["x-ms-date"] = now
    request.headers["Date"] = now


def multipart(parts: Sequence[HttpRequest], changeset: str, batch: str) -> bytes:
    """The body of a ``$batch`` request holding one changeset of ``parts`` (each
    already stamped), as the SDK's ``email`` generator lays it out."""
    out = [b"--", batch.encode(), _CRLF]
    out += [b"Content-Type: multipart/mixed; boundary=", changeset.encode(), _CRLF, _CRLF]
    for index, part in enumerate(parts):
        out += [b"--", changeset.encode(), _CRLF]
        out.append(b"Content-Type: application/http\r\nContent-Transfer-Encoding: binary\r\n")
        out += [b"Content-ID: ", str(index).encode(), _CRLF, _CRLF]
        out += [part.serialize(), _CRLF]
    out += [b"--", changeset.encode(), b"--", _CRLF, _CRLF]
    out += [b"--", batch.encode(), b"--", _CRLF]
    return b"".join(out)


def succeeded(body: bytes, parts: int) -> bool:
    """Whether a ``$batch`` answer says every one of ``parts`` operations succeeded."""
    statuses = _STATUS.findall(body)
    return len(statuses) == parts and all(status.startswith(b"2") for status in statuses)


def operations_requests(table: TableClient, operations: Sequence[Any]) -> list[HttpRequest] | None:
    """The requests of ``operations`` as the SDK builds them for a transaction (None
    where this SDK does not build them the way :func:`submit` knows)."""
    try:
        built = TableBatchOperations(
            config=table._client._config,
            endpoint=f"{table.scheme}://{table._primary_hostname}",
            table_name=table.table_name,
            is_cosmos_endpoint=table._cosmos_endpoint,
        )
    except (AttributeError, TypeError):  # pragma: no cover - another SDK version
        return None
    for operation in operations:
        built.add_operation(operation)
    return list(built.requests)


async def submit(table: TableClient, operations: Sequence[Any]) -> bool:
    """Send ``operations`` as one entity group transaction; True if it succeeded, False
    if the answer is for the SDK to read (the transaction wrote nothing then, or it is
    not known to have: see the module's doc). Where the SDK's requests cannot be built
    here, the SDK's ``submit_transaction`` sends them (and raises what it raises)."""
    parts = operations_requests(table, operations)
    if not parts:  # nothing to send, or an SDK that builds them otherwise: its own call
        await table.submit_transaction(operations)
        return True
    now = format_date_time(time.time())
    for part in parts:
        stamp(part, now)
    changeset, batch = f"changeset_{uuid.uuid4()}", f"batch_{uuid.uuid4()}"
    request = HttpRequest(
        "POST",
        f"{table.scheme}://{table._primary_hostname}/$batch",
        headers={
            "x-ms-version": table.api_version,
            "DataServiceVersion": "3.0",
            "MaxDataServiceVersion": "3.0;NetFx",
            "Content-Type": f"multipart/mixed; boundary={batch}",
            "Accept": "application/json",
        },
        content=multipart(parts, changeset, batch),
    )
    response = await table._client.send_request(request, stream=True)
    try:
        body = await response.read()
    finally:
        await response.close()
    return response.status_code == 202 and succeeded(body, len(parts))
