"""OpenTelemetry traces behind one small seam; nothing at all when they are off.

Tracing is on in a process when the ``otel`` extra is installed, ``OTEL_SDK_DISABLED``
is not true, and ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``)
is set or ``OTEL_TRACES_EXPORTER`` names an exporter (``otlp``: OTLP/HTTP protobuf, the
default; ``console``). Everything else is the standard ``OTEL_*`` configuration the
SDK reads itself (service name, resource attributes, batch processor, headers).

When it is off, :func:`enabled` is False and every function here returns at once; the
OpenTelemetry packages are not even imported.

dagq's spans are emitted once they have happened (:func:`emit`), with ids dagq chose
(:mod:`dagq.observability.ids`): the run's trace id comes from its workflow id, and a
span's id may be fixed before it exists, so a message can name it (a send's) or a task
can run inside it (a process span's). The parent is a span context built here from
those ids, not one carried from process to process. A process that turned tracing on
by its environment hands them to a helper process that exports them
(:mod:`dagq.observability.forwarding`); one given a provider (:func:`install`) hands
them to that provider's processors.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from dagq.observability import ids

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Tracer

log = logging.getLogger("dagq.observability")

Kind = Literal["internal", "producer", "consumer", "client", "server"]
Attributes = Mapping[str, str | int | float | bool]
#: A span named by (trace id, span id).
SpanRef = tuple[int, int]
#: A finished span as dagq emits it: name, trace id, span id, parent span id, kind,
#: attributes, links, start and end (ns since the epoch), error type.
Record = tuple[
    str, int, int, int | None, Kind, Attributes | None, Sequence[SpanRef], int, int, str | None
]
#: What the spans made by the thousand (an attempt's ``send``, ``wait`` and ``process``)
#: share on one run's queue, made once: name, kind, trace id, and the attributes before
#: the attempt's own (name → value pairs, in order).
Shape = tuple[str, Kind, int, tuple[tuple[str, str | int | float | bool], ...]]
#: One such span, given by its shape and what is its own: shape, span id, parent span id,
#: start and end (seconds since the epoch), ``dagq.task.name``, ``dagq.attempt``, the span
#: of the trace it links to (0: none), error type. The same span as the :data:`Record`
#: :func:`expand` makes of it; a tenth of the work to make, pickle and encode.
Shaped = tuple[Shape, int, int | None, float, float, str, int, int, str | None]
#: A run's ``send`` spans of one step on one queue in one record, as the coordinator
#: emits them: their shape, parent (the run's span), start and end, then each span's
#: id, ``dagq.task.name`` and ``dagq.attempt`` in a flat list.
Sends = tuple[Shape, int, float, float, list[int | str]]
#: Attempts of one run's epoch on one queue that ended, in one record, as a worker emits
#: them by the hundred: the ``process`` and ``wait`` spans' shapes, their parent (the
#: run's span), then :data:`RAN_FIELDS` values an attempt in a flat list — its
#: ``process`` span's id, the ``send`` span it links to (0: none), its start and end, its
#: ``dagq.task.name`` and ``dagq.attempt``, its error type (None), when its message was
#: due (0: unknown) and received. An attempt that names its send and when it was due
#: has a ``wait`` span too: its parent is that send, its id :func:`wait_span_id` of the
#: ``process`` span's. Far less work to make and to pickle than a tuple an attempt.
Ran = tuple[Shape, Shape, int, list[Any]]
#: Values an attempt in a :data:`Ran` record.
RAN_FIELDS = 9
#: Whatever :func:`emit` and :func:`emit_shaped` hand on: a span, or several in one.
Emitted = Record | Shaped | Sends | Ran


class _Installed:
    """The tracer and provider in use (None while tracing is off)."""

    tracer: Tracer | None = None
    provider: TracerProvider | None = None
    #: What :func:`emit` hands a finished span (a :data:`Record`) to, by its ``put``:
    #: the provider's processors, or the helper process that exports this process's
    #: spans.
    finished: Any = None
    #: That helper (started with the first span), when this process has one.
    forwarder: Any = None


_on = _Installed()
_TRUE = ("1", "true", "yes", "on")

#: What emits spans made but not emitted yet (:func:`dagq.observability.attempts.fold`):
#: called before spans are sent to the span helper, flushed or shut down.
before_export: list[Callable[[], None]] = []


def gather() -> None:
    """Emit the spans made but not emitted yet (:data:`before_export`)."""
    for emit_pending in before_export:
        emit_pending()


def enabled() -> bool:
    """Is tracing on in this process?"""
    return _on.tracer is not None


def forwarding() -> bool:
    """Does a span helper export this process's spans? (Its thread then calls
    :func:`gather` every moment: spans may wait for it.)"""
    return _on.forwarder is not None


def wanted(environ: Mapping[str, str] | None = None) -> bool:
    """Does the environment ask for traces (whether or not the extra is installed)?"""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() in _TRUE:
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter != "none"
    return bool(
        env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def configure(service: str, *, forward: bool = False) -> bool:
    """Turn tracing on if the environment asks for it (see the module's docstring);
    whether it is on. ``service`` is the default ``service.name`` (``OTEL_SERVICE_NAME``
    wins). With ``forward`` (a process making spans by the thousand: a coordinator, a
    worker), dagq's own spans are exported by a helper process, started now
    (:mod:`dagq.observability.forwarding`), and this process exports only the spans of
    user code, importing the exporter when the first one starts."""
    if _on.tracer is not None:
        return True
    if not wanted():
        return False
    try:
        provider = exporting_provider(service, lazily=forward)
    except ImportError:
        log.warning("OTEL_* asks for traces but dagq[otel] is not installed: tracing is off")
        return False
    install(provider)
    if forward:
        from dagq.observability.forwarding import Forwarder

        sampling = Sampling(provider.sampler)
        forwarder = Forwarder(service, None if sampling.all else sampling.keep, gather=gather)
        forwarder.start()
        _on.forwarder = _on.finished = forwarder
    return True


def exporting_provider(
    service: str, max_queue_size: int | None = None, *, lazily: bool = False
) -> TracerProvider:
    """A provider exporting by the ``OTEL_*`` environment through a BatchSpanProcessor
    (made with the first span if ``lazily``); ``service``: the default ``service.name``
    (``OTEL_SERVICE_NAME`` wins)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=resource(service))
    if lazily:
        provider.add_span_processor(_on_first_span())
    else:
        provider.add_span_processor(
            BatchSpanProcessor(span_exporter(), max_queue_size=max_queue_size)
        )
    return provider


def resource(service: str) -> Any:
    """The SDK's resource for this process, by the ``OTEL_*`` environment (``service``:
    the default ``service.name``; ``OTEL_SERVICE_NAME`` wins)."""
    from opentelemetry.sdk.resources import Resource

    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": service}
    return Resource.create(attributes)


def exporter_kind() -> str:
    """``OTEL_TRACES_EXPORTER``: ``otlp`` (the default, and what dagq uses for any it
    does not support) or ``console``."""
    kind = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() or "otlp"
    return "console" if kind == "console" else "otlp"


def _on_first_span() -> Any:
    from opentelemetry.sdk.trace import SpanProcessor
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    class OnFirstSpan(SpanProcessor):
        """A BatchSpanProcessor made (and the exporter imported) when the first span
        starts: in a process whose own spans a helper exports, only user code's come
        here, and most processes make none."""

        def __init__(self) -> None:
            self.made: BatchSpanProcessor | None = None
            self.lock = threading.Lock()

        def batch(self) -> BatchSpanProcessor:
            with self.lock:
                if self.made is None:
                    self.made = BatchSpanProcessor(span_exporter())
                return self.made

        def on_start(self, span: Any, parent_context: Any = None) -> None:
            self.batch().on_start(span, parent_context=parent_context)

        def on_end(self, span: Any) -> None:
            self.batch().on_end(span)

        def shutdown(self) -> None:
            if self.made is not None:
                self.made.shutdown()  # type: ignore[no-untyped-call]

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return self.made is None or self.made.force_flush(timeout_millis)

    return OnFirstSpan()


def span_exporter() -> Any:
    """The span exporter the ``OTEL_*`` environment asks for (OTLP/HTTP or the console)."""
    kind = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() or "otlp"
    if exporter_kind() == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if kind != "otlp":
        log.warning("OTEL_TRACES_EXPORTER=%s is not supported by dagq; using otlp", kind)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def new_provider(**kwargs: Any) -> TracerProvider:
    """A tracer provider (for tests, and processes that set up their own exporters:
    pass it to :func:`install`)."""
    from opentelemetry.sdk.trace import TracerProvider

    return TracerProvider(**kwargs)


def install(provider: TracerProvider | None) -> None:
    """Trace into ``provider`` from now on (None: tracing off). The provider becomes
    the global one too when none is set, so user code in this process joins."""
    if provider is None:
        gather()  # what ended meanwhile goes out while tracing is still on
        _on.tracer = _on.provider = _on.finished = None
        _close_forwarder()
        return
    from opentelemetry import trace

    _close_forwarder()
    _on.provider = provider
    _on.tracer = provider.get_tracer("dagq")
    _on.finished = Finished(provider)
    if type(trace.get_tracer_provider()).__name__ == "ProxyTracerProvider":
        trace.set_tracer_provider(provider)


def ready(timeout_s: float) -> bool:
    """Return once this process's span helper is up (its imports done; nothing is sent
    to the collector meanwhile), or after ``timeout_s``: False if it did not answer
    by then. True at once for a process without one."""
    forwarder = _on.forwarder
    return forwarder is None or bool(forwarder.ready(timeout_s))


def flush(timeout_ms: int = 5000) -> None:
    """Export what is buffered (before a process ends, or a pool process replies)."""
    gather()
    if _on.forwarder is not None:
        _on.forwarder.flush(timeout_ms / 1000)
    if _on.provider is not None:
        _on.provider.force_flush(timeout_ms)


def shutdown() -> None:
    """Flush and stop exporting."""
    gather()
    _close_forwarder()
    if _on.provider is not None:
        _on.provider.shutdown()
    _on.tracer = _on.provider = _on.finished = None


def _close_forwarder() -> None:
    forwarder, _on.forwarder = _on.forwarder, None
    if forwarder is not None:
        forwarder.close()


def _context(parent: SpanRef | None) -> Any:
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    if parent is None:
        return trace.set_span_in_context(trace.INVALID_SPAN, None)
    remote = SpanContext(parent[0], parent[1], is_remote=True, trace_flags=TraceFlags(1))
    return trace.set_span_in_context(NonRecordingSpan(remote))


def _links(links: Iterable[SpanRef]) -> list[Any]:
    from opentelemetry.trace import Link, SpanContext, TraceFlags

    return [Link(SpanContext(t, s, is_remote=True, trace_flags=TraceFlags(1))) for t, s in links]


def emit(
    name: str,
    *,
    trace: int,
    start_s: float,
    end_s: float,
    parent: int | None = None,
    span_id: int = 0,
    kind: Kind = "internal",
    attributes: Attributes | None = None,
    links: Sequence[SpanRef] = (),
    error: str | None = None,
) -> None:
    """Record a span that already happened (from ``start_s`` to ``end_s``).

    It is made finished and handed to the provider's processors at once: a span the
    runtime emits by the thousand (sends, waits) costs a tenth of one started and
    ended through the tracer (no sampler, context or attribute checks to run: dagq
    records every run, and its attributes are plain values).
    """
    finished = _on.finished
    if finished is None:
        return
    start_ns = int(start_s * 1e9)
    end_ns = int(end_s * 1e9)
    finished.put(
        (
            name,
            trace,
            span_id or ids.new_span_id(),
            parent,
            kind,
            attributes,
            links,
            start_ns,
            end_ns if end_ns > start_ns else start_ns,
            error,
        )
    )


def emit_shaped(span: Shaped | Sends) -> None:
    """Record a span that already happened, given as a :data:`Shaped` one: as
    :func:`emit` with its shape's name, kind, trace and attributes, then
    ``dagq.task.name`` and ``dagq.attempt`` (and ``error.type``), linked to a span of
    the same trace if it says so. Its span id is never 0. Or several such spans in one
    record (:data:`Sends`; attempts that ran: :func:`emit_ran`): they are told apart
    where they are exported (:func:`spans_of`), not here."""
    finished = _on.finished
    if finished is not None:
        finished.put(span)


def emit_ran(record: Ran) -> None:
    """Record the spans of attempts that ran (:data:`Ran`), as :func:`emit_shaped` does;
    a helper exporting them keeps a bound on the attempts waiting for it."""
    forwarder = _on.forwarder
    if forwarder is not None:
        forwarder.put_ran(record)
        return
    finished = _on.finished
    if finished is not None:
        finished.put(record)


def expand(shaped: Shaped) -> Record:
    """The :data:`Record` of a :data:`Shaped` span (as :func:`emit` makes it)."""
    shape, span_id, parent, start_s, end_s, task, attempt, linked, error = shaped
    name, kind, trace, common = shape
    attributes: dict[str, str | int | float | bool] = dict(common)
    attributes["dagq.task.name"] = task
    attributes["dagq.attempt"] = attempt
    start_ns = int(start_s * 1e9)
    end_ns = int(end_s * 1e9)
    return (
        name,
        trace,
        span_id,
        parent,
        kind,
        attributes,
        ((trace, linked),) if linked else (),
        start_ns,
        end_ns if end_ns > start_ns else start_ns,
        error,
    )


def record_of(record: Record | Shaped) -> Record:
    """A span as a :data:`Record`, whichever way it was emitted."""
    if type(record[0]) is str:
        return record
    return expand(record)  # type: ignore[arg-type]


_MIX = 0x9E3779B97F4A7C15  # odd: multiplying by it is a bijection of 64-bit ids


def wait_span_id(process_span_id: int) -> int:
    """The id of an attempt's ``wait`` span, from its ``process`` span's (random, never
    0): a bijection, so distinct process spans give distinct wait spans, and every
    process that expands a :data:`Ran` record gives the same one."""
    return process_span_id * _MIX & 0xFFFFFFFFFFFFFFFF


def spans_of(record: Emitted) -> Sequence[Record | Shaped]:
    """The spans one emitted record stands for (itself, unless it holds several)."""
    if type(record[0]) is str:
        return (record,)
    size = len(record)
    if size == 9:
        return (record,)  # type: ignore[return-value]
    if size == 4:
        return ran(record)  # type: ignore[arg-type]
    return sends(record)  # type: ignore[arg-type]


def span_count(record: Emitted) -> int:
    """How many spans a record stands for (:func:`spans_of`), without making them."""
    if type(record[0]) is str:
        return 1
    size = len(record)
    if size == 9:
        return 1
    if size == 4:
        return ran_span_count(record[3])  # type: ignore[arg-type]
    return len(record[4]) // 3  # type: ignore[arg-type,misc]


def ran_span_count(flat: Sequence[Any]) -> int:
    """How many spans the attempts of a :data:`Ran` record's flat list stand for: one
    each, two with a ``wait`` span."""
    return ran_cut(flat, len(flat))[1]  # room for all: at most 2 spans in 9 values


def ran_cut(flat: Sequence[Any], room: int) -> tuple[int, int]:
    """Where to cut a :data:`Ran` record's flat list so that its first part holds
    ``room`` spans at most (an attempt's two spans stay together), and how many spans
    that part holds."""
    spans = 0
    for i in range(0, len(flat), RAN_FIELDS):
        count = 2 if flat[i + 1] and flat[i + 7] else 1
        if spans + count > room:
            return i, spans
        spans += count
    return len(flat), spans


def ran(record: Ran) -> list[Shaped]:
    """The spans of a :data:`Ran` record, attempt by attempt: its ``wait`` span (if it
    has one), then its ``process`` span."""
    process, wait, parent, flat = record
    out: list[Shaped] = []
    for i in range(0, len(flat), RAN_FIELDS):
        span_id, sent, start_s, end_s, task, attempt, error, due_s, received_s = flat[
            i : i + RAN_FIELDS
        ]
        if sent and due_s:
            out.append(
                (wait, wait_span_id(span_id), sent, due_s, received_s, task, attempt, 0, None)
            )
        out.append((process, span_id, parent, start_s, end_s, task, attempt, sent, error))
    return out


def sends(record: Sends) -> list[Shaped]:
    """The ``send`` spans of a :data:`Sends` record."""
    shape, parent, start_s, end_s, flat = record
    return [
        (shape, flat[i], parent, start_s, end_s, flat[i + 1], flat[i + 2], 0, None)  # type: ignore[misc]
        for i in range(0, len(flat), 3)
    ]


class Sampling:
    """A sampler's decisions, asked once per trace: a run is kept or dropped whole, as
    its trace id decides (``OTEL_TRACES_SAMPLER=traceidratio``)."""

    def __init__(self, sampler: Any) -> None:
        from opentelemetry.sdk.trace.sampling import ALWAYS_ON, DEFAULT_ON, Decision

        self.sampler = sampler
        self.sampled = Decision.RECORD_AND_SAMPLE
        self.decisions: dict[int, bool] = {}
        #: The sampler keeps every span dagq emits (the default, or ``always_on``; dagq's
        #: spans have no parent context, so a parent-based one asks its root sampler).
        self.all = sampler is DEFAULT_ON or sampler is ALWAYS_ON

    def keep(self, trace: int, name: str) -> bool:
        """Is a span of ``trace`` recorded?"""
        if self.all:
            return True
        decision = self.decisions.get(trace)
        if decision is None:
            result = self.sampler.should_sample(None, trace, name)
            decision = result.decision == self.sampled
            if len(self.decisions) >= 4096:
                self.decisions.clear()
            self.decisions[trace] = decision
        return decision


class Finished:
    """Hands finished spans to a provider's processors."""

    def __init__(self, provider: TracerProvider) -> None:
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope
        from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

        self.readable = ReadableSpan
        self.context = SpanContext
        self.sampled = TraceFlags(TraceFlags.SAMPLED)
        self.kinds = {k.name.lower(): k for k in SpanKind}
        self.ok, self.failed = Status(StatusCode.UNSET), Status(StatusCode.ERROR)
        self.scope = InstrumentationScope("dagq")
        self.resource = _hashed_once(provider.resource)
        # The provider's own multi-processor: what its tracers end spans into.
        self.processor = provider._active_span_processor
        # Its sampler (OTEL_TRACES_SAMPLER), asked once per trace.
        self.keep = Sampling(provider.sampler).keep

    def emit(
        self,
        name: str,
        *,
        trace: int,
        span_id: int,
        parent: int | None,
        kind: Kind,
        attributes: Attributes | None,
        links: Sequence[SpanRef],
        start_ns: int,
        end_ns: int,
        error: str | None,
    ) -> None:
        if not self.keep(trace, name):
            return
        context, flags = self.context, self.sampled
        if error is not None:
            attributes = {**(attributes or {}), "error.type": error}
        span = self.readable(
            name,
            context=context(trace, span_id, False, flags),
            parent=None if parent is None else context(trace, parent, True, flags),
            resource=self.resource,
            attributes=attributes,
            links=_links(links) if links else (),
            kind=self.kinds[kind],
            status=self.ok if error is None else self.failed,
            start_time=start_ns,
            end_time=end_ns,
            instrumentation_scope=self.scope,
        )
        self.processor.on_end(span)

    def put(self, record: Emitted) -> None:
        """Emit the spans of a record from :func:`emit` or :func:`emit_shaped` (or from
        a forwarding process)."""
        for span in spans_of(record):
            name, trace, span_id, parent, kind, attributes, links, start_ns, end_ns, error = (
                record_of(span)
            )
            self.emit(
                name,
                trace=trace,
                span_id=span_id,
                parent=parent,
                kind=kind,
                attributes=attributes,
                links=links,
                start_ns=start_ns,
                end_ns=end_ns,
                error=error,
            )


def _hashed_once(resource: Any) -> Any:
    """``resource``, hashed once: the OTLP encoder groups spans by resource, and a
    resource's hash encodes its attributes as JSON, at every span (~10 µs each)."""
    from opentelemetry.sdk.resources import Resource

    class Hashed(Resource):
        def __init__(self) -> None:
            super().__init__(resource.attributes, resource.schema_url)
            self.hashed = super().__hash__()

        def __hash__(self) -> int:
            return self.hashed

        def __eq__(self, other: object) -> bool:
            return super().__eq__(other)

    return Hashed()


def joined(traceparent: str, service: str = "dagq-task") -> contextlib.AbstractContextManager[None]:
    """The context a task's own code runs in: inside the span ``traceparent`` names,
    if the task's code uses OpenTelemetry at all (its module imported it: otherwise
    nothing is imported or set up, and the task pays nothing). A process without a
    tracer provider of its own (a pool process) gets one that sets up the SDK from
    the ``OTEL_*`` environment the first time the task asks for a tracer."""
    if not traceparent or "opentelemetry" not in sys.modules:
        return contextlib.nullcontext()
    _provide_lazily(service)
    return within(traceparent)


def _provide_lazily(service: str) -> None:
    from opentelemetry import trace

    if type(trace.get_tracer_provider()).__name__ != "ProxyTracerProvider" or not wanted():
        return

    class LazyProvider(trace.TracerProvider):
        """Sets up the SDK on first use; until then, costs nothing."""

        def get_tracer(self, *args: Any, **kwargs: Any) -> Tracer:
            configure(service)
            if _on.provider is None:
                return trace.NoOpTracer()
            return _on.provider.get_tracer(*args, **kwargs)

    trace.set_tracer_provider(LazyProvider())


@contextlib.contextmanager
def within(traceparent: str) -> Iterator[None]:
    """Make the span ``traceparent`` names the current one while the block runs, so
    spans made by user code (with any tracer) become its children. Needs only the
    OpenTelemetry API; nothing happens without it or without a traceparent."""
    parsed = ids.parse_traceparent(traceparent) if traceparent else None
    if parsed is None:
        yield
        return
    try:
        from opentelemetry import context
    except ImportError:
        yield
        return
    token = context.attach(_context(parsed))
    try:
        yield
    finally:
        context.detach(token)
