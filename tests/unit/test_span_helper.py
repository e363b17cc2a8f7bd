"""The span-exporting helper's parts (:mod:`dagq.observability.exporting`): the
exporter it posts with, and the queue between the pipe and its export thread."""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest

from dagq.observability import exporting, forwarding, tracing
from dagq.observability.tracing import Record

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def otlp_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> pytest.MonkeyPatch:
    for name in list(os.environ):
        if (
            name.startswith(("OTEL_", "REQUESTS_", "CURL_"))
            or name.lower().endswith("_proxy")
            or name == "NETRC"
        ):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    return monkeypatch


def _pool_settings(exporter: Any) -> dict[str, Any]:
    transport = exporter._client._transport
    assert type(transport).__name__ == "Urllib3HTTPTransport"
    return dict(transport._pool.connection_pool_kw)


def test_the_helper_posts_through_urllib3_with_the_tls_settings_of_the_environment(
    otlp_env: pytest.MonkeyPatch,
) -> None:
    exporter = exporting.lean_exporter()
    assert exporter is not None
    assert _pool_settings(exporter)["cert_reqs"] == "CERT_REQUIRED"
    assert "ca_certs" not in _pool_settings(exporter)
    exporter.shutdown()
    otlp_env.setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", "/etc/collector-ca.pem")
    otlp_env.setenv("OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE", "/etc/me.pem")
    otlp_env.setenv("OTEL_EXPORTER_OTLP_CLIENT_KEY", "/etc/me.key")
    exporter = exporting.lean_exporter()
    assert exporter is not None
    settings = _pool_settings(exporter)
    assert settings["ca_certs"] == "/etc/collector-ca.pem"
    assert (settings["cert_file"], settings["key_file"]) == ("/etc/me.pem", "/etc/me.key")
    exporter.shutdown()
    # As the requests session would: a CA bundle named for it wins.
    otlp_env.setenv("REQUESTS_CA_BUNDLE", "/etc/bundle.pem")
    exporter = exporting.lean_exporter()
    assert exporter is not None
    assert _pool_settings(exporter)["ca_certs"] == "/etc/bundle.pem"
    exporter.shutdown()
    direct = exporting.Direct.made("dagq-test")
    assert direct is not None and direct.exporter._client._transport is not None
    assert type(direct.exporter._client._transport).__name__ == "Urllib3HTTPTransport"
    direct.shutdown()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("HTTPS_PROXY", "http://proxy:3128"),
        ("http_proxy", "http://proxy:3128"),
        ("NETRC", "/etc/netrc"),
        ("OTEL_PYTHON_EXPORTER_OTLP_HTTP_TRACES_CREDENTIAL_PROVIDER", "vault"),
        ("OTEL_PYTHON_EXPORTER_OTLP_HTTP_CREDENTIAL_PROVIDER", "vault"),
    ],
)
def test_what_only_a_requests_session_follows_keeps_the_default_transport(
    otlp_env: pytest.MonkeyPatch, name: str, value: str
) -> None:
    otlp_env.setenv(name, value)
    assert exporting.lean_exporter() is None


def test_a_netrc_file_keeps_the_default_transport(
    otlp_env: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    (tmp_path / ".netrc").write_text("machine collector login me password secret\n")
    assert exporting.lean_exporter() is None


class Posted:
    """A :class:`exporting.Direct` that keeps how many spans each request carried."""

    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size
        self.requests: list[int] = []
        self.spans: list[Any] = []

    def export(self, records: list[Any]) -> None:
        self.requests.append(sum(map(tracing.span_count, records)))
        self.spans += [s for r in records for s in tracing.spans_of(r)]


def _records(count: int) -> list[Record]:
    return [("s", 1, n + 1, None, "internal", None, (), 1, 2, None) for n in range(count)]


def test_the_helper_keeps_what_fits_of_a_large_message_and_posts_it_by_the_batch() -> None:
    posted = Posted(batch_size=100)
    read, write = os.pipe()
    try:
        sending = exporting.Sending(posted, write, limit=250)  # type: ignore[arg-type]
        sending.add(_records(180))
        sending.add(_records(120))  # 70 fit
        sending.add(_records(5))  # none fit
        sending.flush()
        sending.end()
        sending.run()
        assert posted.requests == [100, 100, 50]
        assert sending.dropped == 55
        assert os.read(read, 8) == b"."  # the flush was answered once all was sent
    finally:
        os.close(read)
        os.close(write)


class Watched(Posted):
    """A :class:`Posted` whose requests can be awaited."""

    def __init__(self, batch_size: int) -> None:
        super().__init__(batch_size)
        self.posted = threading.Semaphore(0)

    def export(self, records: list[Any]) -> None:
        super().export(records)
        self.posted.release()


def test_the_helper_posts_a_full_batch_at_once_and_the_rest_when_due_or_flushed() -> None:
    """As the SDK's batch processor: a batch as soon as it is full; fewer spans once the
    oldest of them has waited the schedule delay, or at a flush."""
    posted = Watched(batch_size=100)
    read, write = os.pipe()
    sending = exporting.Sending(posted, write, limit=1000, delay_s=60)  # type: ignore[arg-type]
    thread = threading.Thread(target=sending.run, daemon=True)
    thread.start()
    try:
        sending.add(_records(50))
        sending.add(_records(60))
        assert posted.posted.acquire(timeout=10)
        assert posted.requests == [100]  # the other 10 wait: not due for a minute
        sending.flush()
        assert os.read(read, 8) == b"."
        assert posted.requests == [100, 10]
    finally:
        sending.end()
        thread.join(10)
        os.close(read)
        os.close(write)
    assert not thread.is_alive()
    soon = Watched(batch_size=100)
    sending = exporting.Sending(soon, -1, limit=1000, delay_s=0.05)  # type: ignore[arg-type]
    thread = threading.Thread(target=sending.run, daemon=True)
    thread.start()
    try:
        sending.add(_records(7))
        assert soon.posted.acquire(timeout=10)  # due after the delay, with no flush
        assert soon.requests == [7]
    finally:
        sending.end()
        thread.join(10)


def _ran(count: int, first: int = 1) -> tracing.Ran:
    """Attempts that ran (one record), each with a wait span: ``count`` x 2 spans."""
    process: Any = ("process q", "consumer", 1, ())
    wait: Any = ("wait q", "internal", 1, ())
    flat = [
        v for n in range(first, first + count) for v in (n, 3, 1.0, 2.0, "t", 1, None, 0.5, 1.0)
    ]
    return (process, wait, 9, flat)


def test_records_of_several_spans_are_counted_and_cut_by_their_spans() -> None:
    """A step's sends (one record) and attempts that ran (one record, two spans an
    attempt) count as the spans they hold, in the queue's limit and in a request's
    batch; both are cut where a request is full (an attempt's spans stay together)."""
    shape: Any = ("send q", "producer", 1, ())
    sends = (shape, 9, 1.0, 2.0, [v for n in range(1, 251) for v in (n, f"t{n}", 1)])
    posted = Posted(batch_size=100)
    read, write = os.pipe()
    try:
        sending = exporting.Sending(posted, write, limit=300)  # type: ignore[arg-type]
        sending.add([_ran(1, first=1000), sends])  # 252 spans
        sending.add([_ran(30)])  # 24 attempts fit (the rest of the room, 48 spans)
        sending.flush()
        sending.end()
        sending.run()
    finally:
        os.close(read)
        os.close(write)
    assert posted.requests == [100, 100, 100]
    assert sending.dropped == 12
    sent = [s for s in posted.spans if s[0][0] == "send q"]
    assert [s[1] for s in sent] == list(range(1, 251))  # each once, in order
    assert len(posted.spans) == 300
    processes = [s[1] for s in posted.spans if s[0][0] == "process q"]
    assert processes == [1000, *range(1, 25)]  # the first 24 of the 30, each once
    waits = [s for s in posted.spans if s[0][0] == "wait q"]
    assert [w[1] for w in waits] == [tracing.wait_span_id(p) for p in processes]
    assert {(w[2], w[3], w[4]) for w in waits} == {(3, 0.5, 1.0)}  # under the send


def test_a_record_that_does_not_fit_the_rest_of_a_request_waits_for_the_next() -> None:
    """An attempt's spans (two) that come after a request's room is down to one span go
    in the next request: the export thread once spun on it for ever, holding
    its lock (a client's run of a thousand tasks with telemetry on never ended)."""
    posted = Posted(batch_size=3)
    sending = exporting.Sending(posted, -1, limit=100)  # type: ignore[arg-type]
    for _ in range(3):
        sending.add([_ran(1)])
    sending.end()
    thread = threading.Thread(target=sending.run, daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive()
    assert posted.requests == [2, 2, 2]
    assert sending.waiting == 0


def test_a_request_carries_2048_spans_unless_the_environment_says(
    otlp_env: pytest.MonkeyPatch,
) -> None:
    direct = exporting.Direct.made("dagq-test")
    assert direct is not None and direct.batch_size == exporting.BATCH_SIZE == 2048
    direct.shutdown()
    otlp_env.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "100")
    direct = exporting.Direct.made("dagq-test")
    assert direct is not None and direct.batch_size == 100
    direct.shutdown()


def _nice(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[16])


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads /proc")
def test_the_helper_runs_at_a_lower_cpu_priority_as_a_batch_job_once_it_is_up(
    otlp_env: pytest.MonkeyPatch,
) -> None:
    from dagq.observability.forwarding import Forwarder

    forwarder = Forwarder("dagq-test")
    forwarder.start()
    try:
        assert forwarder.ready(30)  # imports done: sends nothing to the endpoint
        assert forwarder._helper is not None
        ours = _nice(os.getpid())
        assert _nice(forwarder._helper.pid) == min(ours + exporting.NICENESS, 19)
        if hasattr(os, "SCHED_BATCH"):
            assert os.sched_getscheduler(forwarder._helper.pid) == os.SCHED_BATCH
    finally:
        forwarder.close()


def test_a_forwarder_keeps_a_bounded_number_of_attempts_waiting_and_drops_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Attempts come by the hundred a record (tracing.Ran): the bound on what waits for
    a helper that does not keep up counts them, not the records; once what waited is
    taken, there is room again."""
    monkeypatch.setattr(forwarding, "MAX_PENDING_ATTEMPTS", 100)
    forwarder = forwarding.Forwarder("dagq-test")
    forwarder._thread = threading.current_thread()  # as if started (nothing sends: no helper)
    for _ in range(5):
        forwarder.put_ran(_ran(30))  # 3 fit (90 attempts)
    assert len(forwarder._pending) == 3
    assert forwarder.dropped == 2 * 30 * 2  # spans: each attempt's wait and process
    forwarder._send_pending()  # taken (and lost: there is no helper)
    forwarder.put_ran(_ran(30))
    assert len(forwarder._pending) == 1 and forwarder.dropped == 120


def test_attempts_a_sampler_drops_take_no_room_from_those_it_keeps() -> None:
    """With a ratio sampler, the attempts of unsampled runs are not queued, and not
    counted as waiting either: else, past the bound, every later attempt — of sampled
    runs too — was dropped for good (found in review)."""
    kept, left_out = _ran(1), _ran(256)
    left_out = (("process q", "consumer", 2, ()), left_out[1], 9, left_out[3])
    forwarder = forwarding.Forwarder("dagq-test", keep=lambda trace, _name: trace == 1)
    forwarder._thread = threading.current_thread()  # as if started (no helper)
    for _ in range(forwarding.MAX_PENDING_ATTEMPTS // 256 + 2):
        forwarder.put_ran(left_out)
        forwarder._send_pending()  # the sending thread's rounds meanwhile
    forwarder.put_ran(kept)
    assert list(forwarder._pending) == [kept] and forwarder.dropped == 0


def test_a_forwarder_whose_helper_is_gone_drops_attempts_without_counting_them() -> None:
    """Once its helper is gone (said then) or it is closed, attempts are neither queued
    nor counted against the bound (which no sending thread would free any more)."""
    forwarder = forwarding.Forwarder("dagq-test")
    forwarder._thread = threading.current_thread()  # as if started (no helper)
    forwarder._closing = True
    for _ in range(forwarding.MAX_PENDING_ATTEMPTS // 256 + 2):
        forwarder.put_ran(_ran(256))
    assert not forwarder._pending and forwarder.dropped == 0
    assert forwarder._ran_added == 0
