"""Workers on record: who serves which queues, alive as of when.

Each worker keeps one small document, ``workers/{id}`` (:func:`dagq.keys.worker`),
which it writes when it starts (before it takes any work), rewrites every
``heartbeat_s`` with what it runs, and deletes when it stops cleanly. A worker that
was killed cannot delete its record: a record not rewritten for
``EXPIRY_BEATS`` heartbeats is dead. Readers (``dagq workers``, ``doctor``) leave dead
records out and delete them as they go (only if unchanged since they read them), and
so does every worker once it has started, so the ``workers/`` prefix does not grow.

The record is plain JSON on the documents primitive, so it works on every store.
Writing it is never allowed to stop a worker: a failure is logged and the next
heartbeat tries again.
"""

import asyncio
import contextlib
import logging
import re
from collections.abc import Callable

import msgspec

from dagq import keys
from dagq.errors import ConflictError, DagqError
from dagq.stores.base import Documents

log = logging.getLogger("dagq.worker")

#: How often a worker rewrites its record (seconds).
HEARTBEAT_S = 3.0
#: A record not rewritten for this many heartbeats belongs to a dead worker.
EXPIRY_BEATS = 3
#: How many running attempts a record names (it counts them all).
ATTEMPTS_LISTED = 100
#: How many records are read at once when listing.
_READ_AT_ONCE = 32
_UNSAFE = re.compile(r"[^A-Za-z0-9_.:-]")


class WorkerRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What a worker says about itself (the document under ``workers/``)."""

    id: str
    host: str
    pid: int
    queues: list[str]
    concurrency: int
    #: How many tasks it runs now, and the message ids of (up to ATTEMPTS_LISTED of)
    #: those attempts: ``workflow/task/attempt``.
    running: int = 0
    attempts: list[str] = msgspec.field(default_factory=list)
    #: Attempts it has finished since it started.
    completed: int = 0
    version: str = ""
    started_at: float
    last_seen: float
    heartbeat_s: float = HEARTBEAT_S
    #: "serving", or "stopping" once it drains.
    state: str = "serving"
    #: It runs the tasks of these workflows only (``dagq run``); None: of every one.
    workflows: list[str] | None = None

    @property
    def expires_at(self) -> float:
        """When the record, if not rewritten, stops counting as a live worker."""
        return self.last_seen + EXPIRY_BEATS * self.heartbeat_s

    def serves(self, queue: str, workflow_id: str | None = None) -> bool:
        """Does this worker take tasks of ``queue`` (of that workflow, if named)?"""
        if queue not in self.queues:
            return False
        return self.workflows is None or workflow_id is None or workflow_id in self.workflows


def record_key(worker_id: str) -> str:
    """The record's key: the id with anything unusual replaced."""
    return keys.worker(_UNSAFE.sub("_", worker_id)[:200])


class Registration:
    """A worker's record in the store, kept fresh while it runs.

    ``describe`` makes the current record (the worker's queues, what it runs, the
    time); it is called at each write.
    """

    def __init__(
        self,
        documents: Documents,
        describe: Callable[[], WorkerRecord],
        *,
        clock: Callable[[], float],
    ) -> None:
        self._documents = documents
        self._describe = describe
        self._clock = clock
        self._key = ""
        self._failing = False

    async def register(self) -> None:
        """Write the record for the first time (waiting at most a heartbeat)."""
        await self.beat()

    async def beat(self) -> None:
        """Write the record now (a failure is logged; the next beat tries again)."""
        record = self._describe()
        self._key = record_key(record.id)
        limit_s = max(1.0, record.heartbeat_s)
        try:
            await asyncio.wait_for(
                self._documents.put(self._key, msgspec.json.encode(record)), limit_s
            )
        except (DagqError, TimeoutError) as exc:
            if not self._failing:
                why = str(exc) or f"the store did not answer within {limit_s:g} s"
                log.warning("cannot write this worker's record (retrying): %s", why)
            self._failing = True
            return
        if self._failing:
            log.info("this worker's record is written again")
            self._failing = False

    async def keep(self) -> None:
        """Drop dead workers' records, then rewrite this one every heartbeat, until
        cancelled. Never raises."""
        try:
            await live_workers(self._documents, now=self._clock())
        except Exception as exc:  # tidying is a courtesy: a reader does it too
            log.debug("cannot tidy the workers' records: %s", exc)
        while True:
            await asyncio.sleep(self._describe().heartbeat_s)
            try:
                await self.beat()
            except Exception as exc:  # a fault here must not stop the worker
                log.error("this worker's record could not be made: %s", exc, exc_info=exc)

    async def withdraw(self) -> None:
        """Delete the record (the worker stops cleanly)."""
        if not self._key:
            return
        try:
            await asyncio.wait_for(self._documents.delete(self._key), 5.0)
        except (DagqError, TimeoutError) as exc:
            why = str(exc) or "the store did not answer within 5 s"
            log.warning("cannot delete this worker's record (it expires on its own): %s", why)


async def live_workers(documents: Documents, *, now: float) -> list[WorkerRecord]:
    """The records of live workers, oldest first; dead ones are deleted on the way.

    A record that cannot be decoded is left alone and left out.
    """
    names: list[str] = []
    after: str | None = None
    while page := await documents.list(keys.WORKERS_PREFIX, start_after=after, limit=1000):
        names += page
        after = page[-1]
    live: list[WorkerRecord] = []
    for start in range(0, len(names), _READ_AT_ONCE):
        chunk = names[start : start + _READ_AT_ONCE]
        found = await asyncio.gather(*(_read(documents, name, now) for name in chunk))
        live += [record for record in found if record is not None]
    return sorted(live, key=lambda r: (r.started_at, r.id))


async def _read(documents: Documents, key: str, now: float) -> WorkerRecord | None:
    doc = await documents.get(key)
    if doc is None:
        return None
    try:
        record = msgspec.json.decode(doc.data, type=WorkerRecord)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if record.expires_at >= now:
        return record
    # Dead: delete it, unless its worker rewrote it meanwhile (it lives after all).
    with contextlib.suppress(ConflictError, DagqError):
        await documents.delete(key, if_match=doc.etag)
    return None
