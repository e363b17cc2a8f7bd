"""``Idempotency-Key`` (the IETF httpapi draft): a retried POST acts once.

The first request with a key records itself in the store as *in flight*, runs, then
records its response. A request with the same key and the same fingerprint (method,
path, media type and body) gets that response again; with a different fingerprint it
is refused (422); while the first is still in flight, 409. The records live in the
store's documents (``server/idempotency/<digest>``), written with compare-and-swap,
so they hold across a restart and between any number of servers.

A record in flight for longer than :data:`IN_FLIGHT_S` belonged to a server that died
mid-request: the next request takes it over. A finished record is kept for
:data:`KEEP_S`; after that the key may be used afresh, and every server deletes such
records (:meth:`Keys.forget_expired`, every :data:`SWEEP_S`), so they do not pile up.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from dagq.errors import ConflictError
from dagq.server.problems import ProblemError
from dagq.stores.base import Store

log = logging.getLogger("dagq.server")

PREFIX = "server/idempotency/"
#: A record in flight longer than this was left by a server that died mid-request.
IN_FLIGHT_S = 60.0
#: How long a finished response is replayed for its key.
KEEP_S = 24 * 3600.0
MAX_KEY_CHARS = 255
#: How often a server deletes the records past their time.
SWEEP_S = 3600.0
#: Records a sweep reads per page of the listing.
_SWEEP_PAGE = 500


class Record(msgspec.Struct, frozen=True, kw_only=True):
    """What the store keeps for one key."""

    fingerprint: str
    started_at: float
    finished_at: float | None = None
    status: int = 0
    headers: dict[str, str] = msgspec.field(default_factory=dict)
    media_type: str | None = None
    body: bytes = b""


_decoder = msgspec.json.Decoder(Record)
#: The response headers a replay repeats.
_KEPT_HEADERS = ("location", "retry-after")


def parse_key(header: str) -> str:
    """The key of an ``Idempotency-Key`` header: a structured-field string (quoted), or
    the bare token many clients send; 400 if empty, too long or not printable ASCII."""
    key = header.strip()
    if len(key) >= 2 and key[0] == key[-1] == '"':
        key = key[1:-1].replace('\\"', '"').replace("\\\\", "\\")
    if not key or len(key) > MAX_KEY_CHARS or not all(" " <= c <= "~" for c in key):
        raise ProblemError(
            "bad-idempotency-key",
            f"Idempotency-Key must be 1-{MAX_KEY_CHARS} printable ASCII characters",
        )
    return key


def document_key(tenant: str, key: str) -> str:
    """Where the record of ``key`` lives: keys of different tenants never meet."""
    digest = hashlib.sha256(f"{tenant}\n{key}".encode()).hexdigest()
    return f"{PREFIX}{digest[:40]}"


def request_id(tenant: str, key: str) -> str:
    """A request id (cancel, retry, signal) derived from the key: the coordinator acts
    once on it even if the record were lost."""
    return hashlib.sha256(f"request\n{tenant}\n{key}".encode()).hexdigest()[:16]


class Keys:
    """The records of idempotency keys in one store."""

    def __init__(self, store: Store, *, clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self._clock = clock

    async def begin(self, doc: str, fingerprint: str) -> str | Record:
        """Claim ``doc`` for a new request (returns the etag to finish it with), or the
        finished record to replay; ProblemError 422 (another request) or 409 (in flight)."""
        while True:
            found = await self._store.documents.get(doc)
            fresh = Record(fingerprint=fingerprint, started_at=self._clock())
            try:
                if found is None:
                    return await self._store.documents.put(
                        doc, msgspec.json.encode(fresh), if_none_match=True
                    )
                record = _decoder.decode(found.data)
                if self._expired(record):
                    return await self._store.documents.put(
                        doc, msgspec.json.encode(fresh), if_match=found.etag
                    )
            except ConflictError:  # another request claimed it meanwhile: look again
                continue
            if record.fingerprint != fingerprint:
                raise ProblemError(
                    "idempotency-key-reused",
                    "this Idempotency-Key was first used with another request (method, path "
                    "or body); use a new key for a new request",
                )
            if record.finished_at is None:
                raise ProblemError(
                    "idempotency-key-in-use",
                    "the first request with this Idempotency-Key is still being processed; "
                    "retry later",
                    headers={"Retry-After": "1"},
                )
            return record

    async def forget_expired(self) -> int:
        """Delete the records past their time (finished over :data:`KEEP_S` ago, or in
        flight since long before that); returns how many. A record changed meanwhile
        (a request took the key over) is left; one that cannot be read is deleted."""
        forgotten = 0
        after: str | None = None
        while True:
            page = await self._store.documents.list(PREFIX, start_after=after, limit=_SWEEP_PAGE)
            for doc in page:
                found = await self._store.documents.get(doc)
                if found is None:
                    continue
                try:
                    record: Record | None = _decoder.decode(found.data)
                except msgspec.DecodeError:
                    record = None
                if record is not None and not self._expired(record, keep_s=KEEP_S):
                    continue
                with contextlib.suppress(ConflictError):
                    forgotten += await self._store.documents.delete(doc, if_match=found.etag)
            if len(page) < _SWEEP_PAGE:
                return forgotten
            after = page[-1]

    async def sweep_forever(self) -> None:
        """:meth:`forget_expired` every :data:`SWEEP_S` while the server runs; a store
        error is logged and tried again at the next sweep."""
        while True:
            try:
                forgotten = await self.forget_expired()
            except Exception as exc:  # the store may be away; the records wait
                log.warning("deleting expired idempotency records failed: %s", exc)
            else:
                if forgotten:
                    log.info("deleted %d expired idempotency record(s)", forgotten)
            await asyncio.sleep(SWEEP_S)

    def _expired(self, record: Record, *, keep_s: float | None = None) -> bool:
        now = self._clock()
        if record.finished_at is None:
            return now - record.started_at > (IN_FLIGHT_S if keep_s is None else keep_s)
        return now - record.finished_at > KEEP_S

    async def finish(self, doc: str, etag: str, fingerprint: str, answer: Response) -> None:
        """Record the response to replay for the key."""
        record = Record(
            fingerprint=fingerprint,
            started_at=self._clock(),
            finished_at=self._clock(),
            status=answer.status_code,
            headers={k: v for k, v in answer.headers.items() if k in _KEPT_HEADERS},
            media_type=answer.media_type,
            body=bytes(answer.body),
        )
        try:
            await self._store.documents.put(doc, msgspec.json.encode(record), if_match=etag)
        except ConflictError:  # we were too slow: another server took the key over
            log.warning("idempotency record %s was taken over before it was finished", doc)

    async def abandon(self, doc: str, etag: str) -> None:
        """Forget a claim whose request failed on the server's side: it may be retried."""
        with contextlib.suppress(ConflictError):
            await self._store.documents.delete(doc, if_match=etag)


def replay(record: Record) -> Response:
    """The recorded response, marked as a replay."""
    headers = {**record.headers, "Idempotent-Replayed": "true"}
    return Response(
        record.body, status_code=record.status, headers=headers, media_type=record.media_type
    )


async def fingerprint(request: Request) -> str:
    """What makes two requests the same request: method, path, query, media type, body."""
    digest = hashlib.sha256()
    for part in (
        request.method,
        request.url.path,
        request.url.query,
        request.headers.get("content-type", ""),
    ):
        digest.update(part.encode() + b"\0")
    digest.update(await request.body())
    return digest.hexdigest()


async def once(
    keys: Keys,
    request: Request,
    tenant: str,
    run: Callable[[str | None], Awaitable[Response]],
    render: Callable[[Exception], Response | None],
) -> Response:
    """Answer ``request`` through its ``Idempotency-Key``, if it has one.

    ``run`` gets the request id derived from the key (None without a key) and returns
    the response; ``render`` turns an error it raised into the response to record
    (None: an error of the server's own, not recorded, so a retry may go ahead).
    """
    header = request.headers.get("idempotency-key")
    if header is None:
        return await run(None)
    key = parse_key(header)
    doc, print_ = document_key(tenant, key), await fingerprint(request)
    claimed = await keys.begin(doc, print_)
    if isinstance(claimed, Record):
        return replay(claimed)
    try:
        answer = await run(request_id(tenant, key))
    except Exception as exc:
        rendered = render(exc)
        if rendered is None or rendered.status_code >= 500:
            await keys.abandon(doc, claimed)
            raise
        answer = rendered
    if answer.status_code >= 500:
        await keys.abandon(doc, claimed)
    else:
        await keys.finish(doc, claimed, print_, answer)
    return answer
