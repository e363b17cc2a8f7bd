"""``python -m dagq.observability.exporting SERVICE ACK_FD``: the helper process that
exports the spans of a dagq process (:mod:`dagq.observability.forwarding`).

It reads length-prefixed pickled messages from its stdin — ``("spans", [record, ...])``,
``("flush",)`` and ``("ready",)`` — and exports the records to where the ``OTEL_*``
environment says, answers a flush with a byte on ``ACK_FD`` once everything is
exported and a ``ready`` at once (it is read once this process's imports are done and
its exporter is made), and at the end of its stdin exports what it has and exits.

With the OTLP exporter (the default), the records are encoded straight into the
request's protobuf (:mod:`dagq.observability.otlp`) and posted by the standard
exporter's HTTP client (its endpoint, headers, compression, timeout, TLS and retries,
all from the environment) in a thread of its own, as the SDK's batch processor posts
(:class:`Sending`: ``OTEL_BSP_MAX_EXPORT_BATCH_SIZE`` spans a request, at once when
there are as many, else once the oldest has waited ``OTEL_BSP_SCHEDULE_DELAY``, or at a
flush; a record may hold several spans, :func:`tracing.spans_of`); past
``OTEL_BSP_MAX_QUEUE_SIZE`` waiting
spans (default :data:`QUEUE_SIZE`), new ones are dropped, so a slow collector never
stops this process reading (nor the traced process writing). Otherwise (the console
exporter, or an exporter without that client) each record becomes an SDK span for a
BatchSpanProcessor.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import pickle
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import IO, Any, NoReturn

from dagq.observability import otlp, tracing
from dagq.observability.tracing import Emitted

log = logging.getLogger("dagq.observability")

#: The batch processor's queue when ``OTEL_BSP_MAX_QUEUE_SIZE`` does not say: larger
#: than the SDK's 2,048, since spans arrive here by the batch, as fast as they are read.
QUEUE_SIZE = 16384
#: Spans a request when ``OTEL_BSP_MAX_EXPORT_BATCH_SIZE`` does not say: more than the
#: SDK's 512, since a request costs about the same CPU whatever it carries (~0.3-0.9 ms
#: here: building it, the HTTP exchange) and this helper exports for a busy process
#: (~470 KB a request of attempts' spans; the OpenTelemetry Collector's OTLP/HTTP
#: receiver takes up to 20 MiB a request by default).
BATCH_SIZE = 2048
#: How much lower this helper's CPU priority is than its traced process's (added to its
#: nice value once its imports are done, and it is scheduled as a batch job): exporting
#: can wait (spans queue here for seconds), the work the spans describe should not. On
#: cores that are busy the helper, woken by a hand-over, would otherwise take one from a
#: task process or the event loop. Mildly: under sustained contention it still gets a
#: third of a process's share (it needs ~2 % of the CPU of the process it exports for),
#: so its queue does not fill and drop spans.
NICENESS = 5


def _messages(stream: IO[bytes]) -> Iterator[tuple[Any, ...]]:
    while True:
        head = stream.read(4)
        if len(head) < 4:
            return
        body = stream.read(int.from_bytes(head, "big"))
        yield pickle.loads(body)  # from the process that started this one


class Direct:
    """Encodes records into OTLP requests itself and posts them with the standard
    exporter's HTTP client."""

    def __init__(self, encoder: otlp.Encoder, post: Callable[[bytes], Any], exporter: Any) -> None:
        self.encoder = encoder
        self.post = post
        self.exporter = exporter
        self.batch_size = max(1, _setting("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", BATCH_SIZE))

    @classmethod
    def made(cls, service: str) -> Direct | None:
        """One for this environment, or None if the exporter is not OTLP/HTTP (or has no
        client to post bytes with: another version of it)."""
        if tracing.exporter_kind() != "otlp":
            return None
        exporter = lean_exporter() or tracing.span_exporter()
        post = getattr(getattr(exporter, "_client", None), "export", None)
        if not callable(post):
            exporter.shutdown()
            return None
        resource = tracing.resource(service)
        encoder = otlp.Encoder(resource.attributes, resource_schema_url=resource.schema_url or "")
        return cls(encoder, post, exporter)

    def export(self, records: list[Emitted]) -> None:
        size = self.batch_size
        for i in range(0, len(records), size):
            try:
                data = self.encoder.request(records[i : i + size])
            except Exception as exc:  # as the SDK's exporter: the batch is lost, said so
                log.error("cannot encode %d spans: %s", len(records[i : i + size]), exc)
                continue
            result = self.post(data)  # the client logs a failure itself
            if not getattr(result, "success", True):
                log.debug("an export of %d spans failed", len(records[i : i + size]))

    def shutdown(self) -> None:
        self.exporter.shutdown()


def lean_exporter() -> Any | None:
    """The standard OTLP/HTTP span exporter (its endpoint, headers, compression,
    timeout and retries from the ``OTEL_*`` environment) posting with its urllib3
    transport instead of its default, a ``requests`` session: ~0.4 ms of CPU a request
    instead of ~0.75 (the session reads the environment's proxy settings at each one),
    and ``requests`` is not imported. None when the environment says anything that only
    the session would follow — a proxy, a ``.netrc``, a credential provider (a session
    by its name) — or this exporter has no such transport: then the default is the one
    to use."""
    for name in os.environ:
        if name.lower().endswith("_proxy") or name == "NETRC":
            return None
        if name.startswith("OTEL_PYTHON_EXPORTER_OTLP_") and name.endswith("CREDENTIAL_PROVIDER"):
            return None
    if any(os.path.exists(os.path.expanduser(f"~/{name}")) for name in (".netrc", "_netrc")):
        return None
    try:
        from opentelemetry.exporter.http.transport._urllib3 import Urllib3HTTPTransport
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError:
        return None
    env = os.environ.get
    # TLS as the default transport has it: the session's CA bundle, which a bundle
    # the environment names for requests overrides; a client certificate.
    verify: bool | str = (
        env("REQUESTS_CA_BUNDLE")
        or env("CURL_CA_BUNDLE")
        or env("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE")
        or env("OTEL_EXPORTER_OTLP_CERTIFICATE")
        or True
    )
    key = env("OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY") or env("OTEL_EXPORTER_OTLP_CLIENT_KEY")
    certificate = env("OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE") or env(
        "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE"
    )
    cert = (certificate, key) if certificate and key else certificate
    try:
        transport = Urllib3HTTPTransport(verify=verify, cert=cert)
        return OTLPSpanExporter(_transport=transport)
    except TypeError:  # another version of the exporter, without that seam
        return None


def yield_cpu() -> None:
    """Lower this process's CPU priority by :data:`NICENESS`, and have it scheduled as
    a batch job (Linux: waking up, it does not preempt what runs), where the system
    allows. Threads started after this inherit both (on Linux they are a thread's)."""
    batch = getattr(os, "SCHED_BATCH", None)
    if batch is not None:
        with contextlib.suppress(OSError):
            os.sched_setscheduler(0, batch, os.sched_param(0))
    with contextlib.suppress(OSError):
        os.nice(NICENESS)


def _setting(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, "") or default)
    except ValueError:
        return default


def main(argv: list[str]) -> int:
    service, acks = argv[0], int(argv[1])
    direct = Direct.made(service)
    yield_cpu()  # the imports done (at the traced process's priority: it waits for them)
    if direct is None:
        return _through_the_sdk(service, acks)
    limit = _setting("OTEL_BSP_MAX_QUEUE_SIZE", QUEUE_SIZE)
    direct.batch_size = min(direct.batch_size, max(1, limit))  # a full batch must fit
    sending = Sending(direct, acks, limit)
    thread = threading.Thread(target=sending.run, name="dagq-span-export", daemon=True)
    thread.start()
    for message in _messages(sys.stdin.buffer):
        if message[0] == "spans":
            sending.add(message[1])
        elif message[0] == "flush":
            sending.flush()
        elif message[0] == "ready":  # up: answered at once, whatever waits to be sent
            os.write(acks, b".")
    sending.end()
    thread.join()
    direct.shutdown()
    return 0


class Sending:
    """Records waiting for the export thread, posted as the SDK's batch processor
    posts them: a full batch (``OTEL_BSP_MAX_EXPORT_BATCH_SIZE``) as soon as it is
    there, and what is less once the oldest of it has waited the schedule delay
    (``OTEL_BSP_SCHEDULE_DELAY``, 5 s by default), at a flush, or at the end. A request
    costs about the same whether it carries 50 spans or 512 (~0.3 ms of CPU here), and the
    traced process hands spans over every quarter second: posting each hand-over at
    once made a busy process's helper post several small requests a second.

    Reading the pipe never waits for an export (a slow or unreachable collector):
    past ``limit`` waiting spans, the new ones are dropped (said once), as the SDK's
    batch processor drops them."""

    def __init__(self, direct: Direct, acks: int, limit: int, delay_s: float | None = None) -> None:
        self.direct, self.acks, self.limit = direct, acks, limit
        if delay_s is None:
            delay_s = max(0, _setting("OTEL_BSP_SCHEDULE_DELAY", 5000)) / 1000
        self.delay_s = delay_s
        #: Lists of records as they came, with when they came and how many spans they
        #: hold, and flush marks (None) to answer once what came before is sent.
        self.queue: collections.deque[tuple[float, list[Emitted] | None, int]] = collections.deque()
        self.waiting = 0
        self.marks = 0
        self.ended = False
        self.dropped = 0
        self.ready = threading.Condition()

    def add(self, records: list[Emitted]) -> None:
        count = sum(map(tracing.span_count, records))
        with self.ready:
            room = self.limit - self.waiting
            if count > room:  # what does not fit is dropped
                if not self.dropped:
                    log.warning("spans come faster than they are exported: dropping some")
                records, kept, _ = split(records, max(room, 0))
                self.dropped += count - kept
                count = kept
                if not records:
                    return
            first = not self.waiting
            self.queue.append((time.monotonic(), records, count))
            self.waiting += count
            # The export thread is woken when there is a batch to post, or to learn
            # when the first of a new lot came (it waits for it to be due).
            if first or self.waiting >= self.direct.batch_size:
                self.ready.notify()

    def flush(self) -> None:
        with self.ready:
            self.queue.append((0.0, None, 0))
            self.marks += 1
            self.ready.notify()

    def end(self) -> None:
        with self.ready:
            self.ended = True
            self.ready.notify()

    def _due(self) -> bool:
        """Is there something to post or answer now? (Waits until there is, or until the
        oldest waiting record is due; called holding the lock.)"""
        queue = self.queue
        while True:
            if self.ended or self.marks or self.waiting >= self.direct.batch_size:
                return True
            if not queue:
                self.ready.wait()
                continue
            left = queue[0][0] + self.delay_s - time.monotonic()
            if left <= 0:
                return True
            self.ready.wait(left)

    def run(self) -> None:
        """Export what is due, as many records a request as wait (up to a batch)."""
        size = self.direct.batch_size
        queue = self.queue
        while True:
            with self.ready:
                self._due()
                if not queue:  # ended, all sent
                    return
                batch: list[Emitted] = []
                taken = 0
                flush = False
                while queue and taken < size:
                    came, records, count = queue.popleft()
                    if records is None:
                        self.marks -= 1
                        flush = True
                        break
                    if taken + count > size:  # the rest waits for the next request
                        records, part, rest = split(records, size - taken, at_least_one=not batch)
                        queue.appendleft((came, rest, count - part))
                        batch += records
                        taken += part
                        break  # this request is as full as it can be
                    batch += records
                    taken += count
                self.waiting -= taken
            if batch:
                self.direct.export(batch)
            if flush:
                os.write(self.acks, b".")


def split(
    records: list[Emitted], room: int, *, at_least_one: bool = False
) -> tuple[list[Emitted], int, list[Emitted]]:
    """The first records holding ``room`` spans at most, how many spans they hold, and
    the rest. A record of sends is cut where ``room`` ends; another that does not fit
    waits for the next request, unless ``at_least_one`` (a request must carry
    something)."""
    taken = 0
    for i, record in enumerate(records):
        count = tracing.span_count(record)
        if taken + count <= room:
            taken += count
            continue
        left = room - taken
        if left > 0 and len(record) == 5:  # sends (the only records of five)
            shape, parent, start_s, end_s, flat = record
            head: Emitted = (shape, parent, start_s, end_s, flat[: 3 * left])
            tail: Emitted = (shape, parent, start_s, end_s, flat[3 * left :])
            return [*records[:i], head], room, [tail, *records[i + 1 :]]
        if left > 0 and len(record) == 4:  # attempts that ran (the only records of four)
            cut, spans = tracing.ran_cut(record[3], left)
            if cut:
                process, wait, parent, flat = record
                head = (process, wait, parent, flat[:cut])
                tail = (process, wait, parent, flat[cut:])
                return [*records[:i], head], taken + spans, [tail, *records[i + 1 :]]
        if i == 0 and at_least_one:
            return records[:1], count, records[1:]
        return records[:i], taken, records[i:]
    return records, taken, []


def _through_the_sdk(service: str, acks: int) -> int:
    queue_size = None if os.environ.get("OTEL_BSP_MAX_QUEUE_SIZE") else QUEUE_SIZE
    provider = tracing.exporting_provider(service, max_queue_size=queue_size)
    finished = tracing.Finished(provider)
    for message in _messages(sys.stdin.buffer):
        if message[0] == "spans":
            for record in message[1]:
                finished.put(record)
        elif message[0] == "flush":
            provider.force_flush()
            os.write(acks, b".")
        elif message[0] == "ready":
            os.write(acks, b".")
    provider.shutdown()
    return 0


def ended(code: int) -> NoReturn:
    """End the process at once, its work done (what it had exported, its exporter shut
    down, its output flushed): the interpreter's teardown — freeing the SDK, the
    exporter and their HTTP stack, 0.1-0.3 s — would only keep the traced process
    waiting longer at its own end (:meth:`~dagq.observability.forwarding.Forwarder.close`
    waits for this process to exit)."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    ended(main(sys.argv[1:]))
