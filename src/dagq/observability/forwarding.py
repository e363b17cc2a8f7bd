"""dagq's own spans, exported by a helper process (docs/architecture.md §7).

Encoding a span for OTLP costs more than the work it describes (~100 µs a span in
the standard exporter, three spans an attempt), and an exporter thread takes that time
from the event loop: they share the interpreter lock. So a process that traces by its
``OTEL_*`` environment hands its spans, as plain tuples (:data:`tracing.Emitted`), to a
helper process (:mod:`dagq.observability.exporting`) that makes them SDK spans and
exports them with the standard BatchSpanProcessor and OTLP exporter, configured by the
same environment. The event loop pays a tuple and an append per span; a thread of this
process pickles batches into the helper's stdin.

The helper is started when tracing is turned on (:meth:`Forwarder.start`), exports
what it has and exits when its stdin closes: :meth:`Forwarder.close`, or this process
ending however it ends.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import logging
import os
import pickle
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import IO, cast

from dagq.observability.tracing import RAN_FIELDS, Emitted, Ran, ran_span_count

log = logging.getLogger("dagq.observability")

#: Records waiting for the helper at most (a span each, or a step's sends, or the
#: attempts of a run that ran); more are dropped (and said so, once).
MAX_PENDING = 16384
#: Attempts (in :data:`tracing.Ran` records) waiting for the helper at most; the spans of
#: more are dropped (and said so, once).
MAX_PENDING_ATTEMPTS = 16384
#: How often spans go to the helper at most (``OTEL_BSP_SCHEDULE_DELAY`` if shorter).
SEND_INTERVAL_S = 0.25
#: How long :meth:`Forwarder.close` waits for the helper to export what it has.
CLOSE_TIMEOUT_S = 30.0


def _setting(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, "") or default)
    except ValueError:
        return default


class Forwarder:
    """Hands this process's finished spans to its exporting helper process."""

    def __init__(
        self,
        service: str,
        keep: Callable[[int, str], bool] | None = None,
        *,
        gather: Callable[[], None] | None = None,
    ) -> None:
        """``keep(trace id, span name)``: is the span sampled (None: every one is).
        ``gather``: emits the spans made but not emitted yet (called by the sending
        thread before it sends, and before a flush)."""
        self.service = service
        self.keep = keep
        self.gather = gather
        # The batch processor's delay, applied to the hop to the helper too (up to 1 s)...
        delay_s = min(_setting("OTEL_BSP_SCHEDULE_DELAY", 5000), 1000) / 1000
        #: ...or less: how often the thread sends what waits (a span is out within this,
        #: or at a flush); spans are not counted as they come, which would cost each one.
        self.interval_s = min(delay_s, SEND_INTERVAL_S)
        self.dropped = 0
        # Bounded: the fast ``put`` (the deque's own append) drops the oldest itself
        # while the sending thread is blocked on a helper that does not read.
        self._pending: collections.deque[Emitted] = collections.deque(maxlen=MAX_PENDING)
        self._wake = threading.Event()
        self._lock = threading.Lock()  # the pipe: one writer at a time
        self._closing = False
        self._helper: subprocess.Popen[bytes] | None = None
        self._acks = -1
        #: Requests that the helper answers on the acknowledgement pipe, and its answers.
        self._asked = self._acked = 0
        self._thread: threading.Thread | None = None
        #: Attempts in the Ran records put so far (only :meth:`put_ran` adds, under the
        #: lock of whoever folds), and so many as were pending when the sending thread
        #: last took everything (only it sets it): the difference is what waits.
        self._ran_added = self._ran_taken = 0
        self._pid = os.getpid()

    def put(self, record: Emitted) -> None:
        """Queue a finished span for the helper (as :meth:`tracing.Finished.put`).

        Once the helper is started, and while every span is kept (the default sampler),
        this is the queue's own ``append`` (set on the instance): nothing else is
        checked a span; the thread that sends them drops what is over
        :data:`MAX_PENDING`."""
        if self._closing:
            return
        if self.keep is not None:
            head = record[0]
            if isinstance(head, str):  # a Record: its name, then its trace
                name, trace = head, cast(int, record[1])
            else:  # its shape's name and trace
                name, trace = head[0], head[2]
            if not self.keep(trace, name):
                return
        pending = self._pending
        if len(pending) >= MAX_PENDING:
            self._drop()
            return
        pending.append(record)
        if self._thread is None:
            self.start()

    def put_ran(self, record: Ran) -> None:
        """Queue the spans of attempts that ran (:data:`tracing.Ran`), unless
        :data:`MAX_PENDING_ATTEMPTS` wait already (the helper does not keep up, or is
        stuck): then they are dropped."""
        if self._closing:  # closed, or its helper is gone (said then): nothing waits
            return
        if self.keep is not None:  # not sampled: not waiting either
            process = record[0]
            if not self.keep(process[2], process[0]):
                return
        attempts = len(record[3]) // RAN_FIELDS
        if self._ran_added - self._ran_taken + attempts > MAX_PENDING_ATTEMPTS:
            self._drop(ran_span_count(record[3]))
            return
        self._ran_added += attempts
        self.put(record)

    def flush(self, timeout_s: float) -> None:
        """Return once the helper has exported every span made so far (or after
        ``timeout_s``)."""
        if self._helper is None:
            return
        with self._lock:
            self._send_pending()
            if self._write(("flush",)):
                self._answered(timeout_s)

    def ready(self, timeout_s: float) -> bool:
        """Return once the helper is up — its imports done and its exporter made, which
        sends nothing: no wait on the collector — or after ``timeout_s``. False if it
        did not answer by then, or ended first; True at once without one (its start
        failed, and said so)."""
        if self._helper is None:
            return True
        with self._lock:
            return self._write(("ready",)) and self._answered(timeout_s)

    def _answered(self, timeout_s: float) -> bool:
        """Wait for the helper's answers to every request so far (a byte each on the
        acknowledgement pipe; one that came too late for its request is counted at
        the next); whether they came within ``timeout_s``."""
        self._asked += 1
        deadline = time.monotonic() + timeout_s
        while self._acked < self._asked:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._acks], [], [], left)[0]:
                return False
            got = os.read(self._acks, 64)
            if not got:  # the helper is gone: no answer will come
                return False
            self._acked += len(got)
        return True

    def close(self) -> None:
        """Send what is pending, and wait for the helper to export it and exit."""
        if self._closing or os.getpid() != self._pid:  # a fork's copy owns nothing
            return
        self._gather()  # what this process made goes too
        self._closing = True
        vars(self).pop("put", None)  # the method again: it drops what comes now
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
        helper = self._helper
        if helper is None:
            return
        with self._lock:
            self._send_pending()
            stdin: IO[bytes] | None = helper.stdin
            if stdin is not None:
                with contextlib.suppress(OSError):
                    stdin.close()
        try:
            helper.wait(CLOSE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            log.warning("the span exporter did not finish in %.0f s: stopped", CLOSE_TIMEOUT_S)
            helper.kill()
            helper.wait()
        os.close(self._acks)
        self._acks = -1

    def start(self) -> None:
        """Start the helper (at once; else with the first span): its start-up (it
        imports the SDK and the exporter) then overlaps this process's own."""
        if self._thread is not None or self._closing:
            return
        acks, acks_out = os.pipe()
        try:
            self._helper = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "dagq.observability.exporting",
                    self.service,
                    str(acks_out),
                ],
                stdin=subprocess.PIPE,
                pass_fds=(acks_out,),
                # Its own session: a Ctrl-C meant for this process does not cut it short
                # (it exports what it has once this process is gone).
                start_new_session=True,
            )
        except OSError as exc:
            os.close(acks)
            log.warning("cannot start the span exporter: %s; spans are dropped", exc)
            self._closing = True  # emit stops trying
            return
        finally:
            os.close(acks_out)
        self._acks, self._pid = acks, os.getpid()
        self._thread = threading.Thread(target=self._run, name="dagq-span-forwarder", daemon=True)
        self._thread.start()
        if self.keep is None:
            self.put = self._pending.append  # type: ignore[method-assign,assignment]
        atexit.register(self.close)

    def _run(self) -> None:
        while not self._closing:
            self._wake.wait(self.interval_s)
            if not self._closing:
                self._gather()
            with self._lock:
                self._send_pending()

    def _gather(self) -> None:
        if self.gather is not None:
            try:
                self.gather()
            except Exception:  # a fault there must not stop the spans already made
                log.exception("emitting the spans made meanwhile failed")

    def _send_pending(self) -> None:
        """Send what waits, in one message (the helper posts it by the batch)."""
        pending = self._pending
        if len(pending) >= MAX_PENDING and not self.dropped:  # full: the oldest went
            self._drop(1)  # at least: how many is not counted a span
        # Everything is taken (one fold's, coming meanwhile, may count as taken: the
        # bound is off by that much at most, and never for good).
        self._ran_taken = self._ran_added
        if pending:
            spans = [pending.popleft() for _ in range(len(pending))]
            if not self._write(("spans", spans)):
                pending.clear()

    def _write(self, message: tuple[object, ...]) -> bool:
        helper = self._helper
        if helper is None or helper.stdin is None or helper.stdin.closed:
            return False
        if os.getpid() != self._pid:  # a forked copy: the pipe is its parent's
            return False
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            helper.stdin.write(len(data).to_bytes(4, "big") + data)
            helper.stdin.flush()
        except (OSError, ValueError) as exc:
            log.warning("the span exporter is gone (%s): spans are dropped from now on", exc)
            self._closing = True
            return False
        return True

    def _drop(self, count: int = 1) -> None:
        if not self.dropped:
            log.warning(
                "spans are made faster than they are exported: dropping some (more than %d "
                "records or %d attempts wait)",
                MAX_PENDING,
                MAX_PENDING_ATTEMPTS,
            )
        self.dropped += count
