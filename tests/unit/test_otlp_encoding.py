"""The span-exporting helper's own OTLP encoder (:mod:`dagq.observability.otlp`) writes
the very request the SDK's exporter writes for the same spans: both are decoded with
the ``opentelemetry-proto`` classes and compared, for a real run's spans and for
generated ones."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from dagq import embedded
from dagq.observability import exporting, ids, otlp, spans, tracing
from dagq.observability.tracing import Emitted, Record, Shape
from dagq.stores.memory import open_memory_store
from tests.helpers import definition

pytestmark = pytest.mark.timeout(60)

RESOURCE = Resource.create({"service.name": "dagq-test", "deployment.environment": "ci"})


def through_the_sdk(
    records: Sequence[Emitted], resource: Resource = RESOURCE
) -> list[ReadableSpan]:
    """The SDK spans the records make (as the helper made them before it encoded)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    finished = tracing.Finished(provider)
    for record in records:
        finished.put(record)
    return list(exporter.get_finished_spans())


def decoded(records: Sequence[Emitted], resource: Resource = RESOURCE) -> ExportTraceServiceRequest:
    encoder = otlp.Encoder(resource.attributes, resource_schema_url=resource.schema_url)
    return ExportTraceServiceRequest.FromString(encoder.request(records))


def assert_same_as_the_sdk(records: Sequence[Emitted], resource: Resource = RESOURCE) -> None:
    expected = encode_spans(through_the_sdk(records, resource))
    found = decoded(records, resource)
    spans_made = sum(len(tracing.spans_of(r)) for r in records)
    assert len(found.resource_spans[0].scope_spans[0].spans) == spans_made
    # Compared span by span first, so a difference names its span.
    for want, got in zip(
        expected.resource_spans[0].scope_spans[0].spans,
        found.resource_spans[0].scope_spans[0].spans,
        strict=True,
    ):
        assert got == want
    assert found == expected


class Recording:
    """Keeps the records dagq emits (and hands them on)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.records: list[Emitted] = []

    def put(self, record: Emitted) -> None:
        self.records.append(record)
        self.inner.put(record)


@pytest.fixture
def recording(monkeypatch: pytest.MonkeyPatch) -> Iterator[Recording]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    # Not made the global provider, which is set once a process: the tests of user
    # code's spans (test_observability) need theirs to be it, whichever runs first.
    monkeypatch.setattr(trace, "set_tracer_provider", lambda _provider: None)
    tracing.install(provider)
    tee = Recording(tracing._on.finished)
    tracing._on.finished = tee
    try:
        yield tee
    finally:
        tracing.install(None)


async def test_a_runs_spans_encode_as_the_sdk_encodes_them(recording: Recording) -> None:
    result = await embedded.run_async(
        definition(
            [
                {"name": "a", "cmd": "true"},
                {"name": "b", "cmd": "exit 3", "depends_on": ["a"]},
            ]
        ),
        store=open_memory_store(),
        workers=2,
    )
    assert result.status == "failed"
    now = time.time()
    spans.batch("sqlite:///x.db", 3, workflow_ids=["w-1", "w-2"], start_s=now, end_s=now)
    spans.waited("timer", workflow_id="w-1", workflow_name="w", epoch=0, start_s=now, end_s=now)
    records = [tracing.record_of(s) for r in recording.records for s in tracing.spans_of(r)]
    names = {r[0] for r in records}
    assert {"submit", "run", "send default", "wait default", "process default"} <= names
    assert {"process _completions", "wait timer"} <= names
    assert any(r[9] for r in records)  # a failure (status, error.type)
    assert any(r[6] for r in records)  # links
    # An attempt's spans are emitted by their shape, a step's sends and an attempt's
    # wait and process spans in one record each; the rest as records.
    assert {type(r[0]) for r in recording.records} == {str, tuple}
    assert {len(r) for r in recording.records if type(r[0]) is tuple} == {4, 5}
    assert_same_as_the_sdk(recording.records)
    assert_same_as_the_sdk(records)


def test_lengths_over_one_byte_and_every_kind_of_value() -> None:
    trace = ids.trace_id("long")
    long_text = "é" * 300  # 600 bytes: a two-byte length
    records: list[Record] = [
        (
            "x" * 200,
            trace,
            0xFFFFFFFFFFFFFFFF,
            None,
            kind,
            {
                "text": long_text,
                "empty": "",
                "zero": 0,
                "negative": -5,
                "big": 2**63 - 1,
                "most negative": -(2**63),
                "yes": True,
                "no": False,
                "float": -0.25,
                "float zero": 0.0,
            },
            [(trace, 1), (ids.trace_id("other"), 2**64 - 1)],
            0,
            2**64 - 1,
            "boom" if kind == "client" else None,
        )
        for kind in ("internal", "server", "client", "producer", "consumer")
    ]
    records.append(("bare", trace, 7, 9, "internal", None, (), 1, 2, None))
    records.append(("empty attributes", trace, 8, 9, "internal", {}, (), 1, 2, "failed"))
    # A request over 2**14 bytes: a three-byte length around the whole.
    assert_same_as_the_sdk(records * 20)


def test_the_resource_and_its_schema_are_the_ones_configured() -> None:
    resource = Resource(
        {"service.name": "s", "host.cores": 2, "tags": ("a", "b"), "ratio": 0.5, "on": True},
        schema_url="https://opentelemetry.io/schemas/1.21.0",
    )
    record: Record = ("one", 5, 6, None, "internal", {"k": "v"}, (), 1, 2, None)
    assert_same_as_the_sdk([record], resource)
    found = decoded([record], resource)
    assert found.resource_spans[0].schema_url == "https://opentelemetry.io/schemas/1.21.0"
    assert found.resource_spans[0].scope_spans[0].scope.name == "dagq"


_ids = st.integers(min_value=1, max_value=2**64 - 1)
_values = (
    st.text(max_size=40)
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False)
)
_records = st.tuples(
    st.text(min_size=1, max_size=30),
    st.integers(min_value=1, max_value=2**128 - 1),
    _ids,
    st.none() | _ids,
    st.sampled_from(["internal", "server", "client", "producer", "consumer"]),
    st.none() | st.dictionaries(st.text(min_size=1, max_size=12), _values, max_size=6),
    st.lists(st.tuples(st.integers(min_value=1, max_value=2**128 - 1), _ids), max_size=3),
    st.integers(min_value=0, max_value=2**63),
    st.integers(min_value=0, max_value=2**63),
    st.none() | st.text(min_size=1, max_size=20),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_records, min_size=1, max_size=8))
def test_any_records_encode_as_the_sdk_encodes_them(records: list[Any]) -> None:
    assert_same_as_the_sdk(records)


_OWN = ("dagq.task.name", "dagq.attempt", "error.type")  # what a shaped span adds itself
_shapes = st.tuples(
    st.text(min_size=1, max_size=30),
    st.sampled_from(["internal", "server", "client", "producer", "consumer"]),
    st.integers(min_value=1, max_value=2**128 - 1),
    st.lists(
        st.tuples(st.text(min_size=1, max_size=12).filter(lambda k: k not in _OWN), _values),
        max_size=6,
        unique_by=lambda pair: pair[0],
    ).map(tuple),
)
_seconds = st.floats(min_value=0, max_value=1.8e10)
_shaped = st.tuples(
    _shapes,
    _ids,
    st.none() | _ids,
    _seconds,
    _seconds,
    st.text(max_size=40),
    st.integers(min_value=-(2**63), max_value=2**63 - 1) | st.integers(0, 70),
    st.just(0) | _ids,
    st.none() | st.text(min_size=1, max_size=20),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_shaped | _records, min_size=1, max_size=8), st.data())
def test_shaped_spans_encode_as_the_sdk_encodes_the_spans_they_stand_for(
    records: list[Any], data: st.DataObject
) -> None:
    # Spans of one shape, as an attempt's are (the encoder keeps a shape's blocks).
    shaped = [r for r in records if not isinstance(r[0], str)]
    if shaped:
        again = data.draw(_shaped)
        records.append((shaped[0][0], *again[1:]))
    assert_same_as_the_sdk(records)
    assert_same_as_the_sdk([tracing.record_of(r) for r in records])


_task_names = st.text(max_size=40)
_attempt_numbers = st.integers(min_value=-(2**63), max_value=2**63 - 1) | st.integers(0, 70)
#: Attempts that ran (tracing.Ran): with or without a send to link to, and a due time
#: (both: a wait span too).
_ran = st.tuples(
    _shapes,
    _shapes,
    _ids,
    st.lists(
        st.tuples(
            _ids,
            st.just(0) | _ids,
            _seconds,
            _seconds,
            _task_names,
            _attempt_numbers,
            st.none() | st.text(min_size=1, max_size=20),
            st.just(0.0) | _seconds,
            _seconds,
        ),
        min_size=1,
        max_size=4,
    ).map(lambda attempts: [value for attempt in attempts for value in attempt]),
)
_sends = st.tuples(
    _shapes,
    _ids,
    _seconds,
    _seconds,
    st.lists(st.tuples(_ids, _task_names, _attempt_numbers), min_size=1, max_size=5).map(
        lambda sends: [value for send in sends for value in send]
    ),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_ran | _sends | _shaped | _records, min_size=1, max_size=6))
def test_records_of_several_spans_encode_as_the_sdk_encodes_the_spans_they_hold(
    records: list[Any],
) -> None:
    """A worker's attempts (their wait and process spans) and a coordinator's step (its
    sends) each travel as one record; the helper writes the spans they stand for."""
    assert_same_as_the_sdk(records)
    assert_same_as_the_sdk([s for r in records for s in tracing.spans_of(r)])


def test_an_attempts_wait_span_has_an_id_of_its_own_under_the_send() -> None:
    trace = ids.trace_id("attempted")
    process: Shape = ("process q", "consumer", trace, (("dagq.queue", "q"),))
    wait: Shape = ("wait q", "internal", trace, ())
    # Two attempts that ran: one with a wait span under its send, one without (no send).
    record = (process, wait, 3, [7, 5, 2.0, 3.0, "t", 1, None, 1.0, 1.5])
    record[3].extend([8, 0, 2.0, 3.0, "u", 2, "Boom", 1.0, 1.5])
    found = decoded([record]).resource_spans[0].scope_spans[0].spans
    assert [s.name for s in found] == ["wait q", "process q", "process q"]
    waited, processed, alone = found
    assert int.from_bytes(alone.span_id, "big") == 8 and not alone.links
    assert int.from_bytes(waited.parent_span_id, "big") == 5  # the send
    assert int.from_bytes(processed.parent_span_id, "big") == 3  # the run
    assert [int.from_bytes(link.span_id, "big") for link in processed.links] == [5]
    ids_made = {tracing.wait_span_id(n) for n in range(1, 10_000)}
    assert len(ids_made) == 9_999 and 0 not in ids_made  # distinct, never 0
    assert int.from_bytes(waited.span_id, "big") == tracing.wait_span_id(7) != 7


def test_the_helper_encodes_itself_for_otlp_and_leaves_the_console_to_the_sdk(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in [k for k in os.environ if k.startswith("OTEL_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    direct = exporting.Direct.made("dagq-test")
    assert direct is not None  # the exporter still has a client that posts bytes
    try:
        record: Record = ("one", 5, 6, None, "internal", None, (), 1, 2, None)
        request = ExportTraceServiceRequest.FromString(direct.encoder.request([record]))
        attributes = {a.key: a.value for a in request.resource_spans[0].resource.attributes}
        assert attributes["service.name"].string_value == "dagq-test"
        assert "telemetry.sdk.version" in attributes  # the SDK's own resource detection
    finally:
        direct.shutdown()
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    assert exporting.Direct.made("dagq-test") is None


def test_a_negative_zero_after_a_zero_keeps_its_sign() -> None:
    """0.0 and -0.0 are equal (and hash alike) but not the same double: a value
    encoded once and kept must not stand for the other."""
    trace = ids.trace_id("zeros")
    records: list[Record] = [
        ("s", trace, n, None, "internal", {"v": value}, (), 1, 2, None)
        for n, value in ((1, 0.0), (2, -0.0), (3, 0.0))
    ]
    found = decoded(records).resource_spans[0].scope_spans[0].spans
    signs = [math.copysign(1.0, span.attributes[0].value.double_value) for span in found]
    assert signs == [1.0, -1.0, 1.0]
    expected = encode_spans(through_the_sdk(records)).resource_spans[0].scope_spans[0].spans
    assert [s.SerializeToString() for s in found] == [s.SerializeToString() for s in expected]
    # The same for shapes holding them, one request after the other.
    encoder = otlp.Encoder({})
    for value in (0.0, -0.0, 0.0):
        shape: Shape = ("s", "internal", trace, (("v", value),))
        request = encoder.request([(shape, 1, None, 1.0, 2.0, "t", 1, 0, None)])
        (span,) = (
            ExportTraceServiceRequest.FromString(request).resource_spans[0].scope_spans[0].spans
        )
        assert math.copysign(1.0, span.attributes[0].value.double_value) == math.copysign(
            1.0, value
        )
