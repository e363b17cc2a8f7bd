"""Trace and span ids that every process derives from a workflow id alone.

One run is one trace (docs/architecture.md §7): its trace id is a hash of the workflow
id, so the client, the server, the coordinator and every worker join the same trace
without passing context around, and a retry next week lands in it too. The spans that
others hang under — the submit and the run — have ids derived the same way. Pure: no
OpenTelemetry import here.
"""

from __future__ import annotations

import functools
import random

_FLAGS_SAMPLED = "01"
#: How a traceparent of a sampled span ends (after its span id).
SAMPLED_END = "-" + _FLAGS_SAMPLED


@functools.lru_cache(maxsize=8192)  # a run's ids are asked for at every step of it
def _digest(workflow_id: str, what: bytes, size: int) -> int:
    # Imported here: a pool process parses traceparents only, and hashlib loads OpenSSL.
    from hashlib import blake2b

    value = int.from_bytes(
        blake2b(workflow_id.encode(), digest_size=size, person=what).digest(), "big"
    )
    return value or 1  # zero is the invalid id


def trace_id(workflow_id: str) -> int:
    """The run's trace id: 16 bytes of a hash of the workflow id."""
    return _digest(workflow_id, b"dagq-trace", 16)


@functools.lru_cache(maxsize=8192)
def trace_hex(workflow_id: str) -> str:
    """The run's trace id as 32 hex digits (log lines, exemplars)."""
    return f"{trace_id(workflow_id):032x}"


def submit_span_id(workflow_id: str) -> int:
    """The id of the run's ``submit`` span (the trace's root)."""
    return _digest(workflow_id, b"dagq-submit", 8)


def run_span_id(workflow_id: str, epoch: int = 0) -> int:
    """The id of the run span of one epoch (a retry opens a new one)."""
    return _digest(workflow_id, b"dagq-run" + epoch.to_bytes(4, "big"), 8)


def new_span_id() -> int:
    """A random span id (for the spans only one process knows about)."""
    return random.getrandbits(64) or 1


def traceparent(trace: int, span: int) -> str:
    """The W3C ``traceparent`` header value naming a sampled span."""
    return traceparent_of(trace_part(trace), span)


def traceparent_of(head: str, span: int) -> str:
    """:func:`traceparent` from its trace's :func:`trace_part` (made once a run: two
    attempts' traceparents differ only by their span ids), the span id in hex by its
    bytes (a third of the time of a format)."""
    return head + span.to_bytes(8, "big").hex() + SAMPLED_END


@functools.lru_cache(maxsize=4096)  # one per run, for each of its attempts
def trace_part(trace: int) -> str:
    """A traceparent of ``trace`` up to its span id: ``00-TRACE-``."""
    return f"00-{trace:032x}-"


@functools.lru_cache(maxsize=4096)  # one per run, for each of its messages
def run_trace_part(workflow_id: str) -> str:
    """:func:`trace_part` of the run ``workflow_id``'s trace."""
    return trace_part(trace_id(workflow_id))


_random_bits = random.getrandbits


def new_traceparent(workflow_id: str) -> tuple[int, str]:
    """A new span id in the run ``workflow_id``'s trace and its traceparent (as
    :func:`new_span_id` and :func:`traceparent` make them, in one call: a coordinator
    makes one for each message it sends)."""
    span = _random_bits(64) or 1
    return span, run_trace_part(workflow_id) + span.to_bytes(8, "big").hex() + SAMPLED_END


def span_in(text: str, trace: int) -> int:
    """The span id of a ``traceparent`` made by :func:`traceparent` for ``trace``, or
    0 if it is not one (without parsing the trace id: a worker checks each message's)."""
    head = trace_part(trace)
    if len(text) != 55 or not text.startswith(head):
        return 0
    try:
        return int(text[36:52], 16)
    except ValueError:
        return 0


def parse_traceparent(text: str) -> tuple[int, int] | None:
    """(trace id, span id) of a W3C ``traceparent``, or None if it is not one."""
    parts = text.split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or len(parts[2]) != 16:
        return None
    try:
        trace, span = int(parts[1], 16), int(parts[2], 16)
    except ValueError:
        return None
    if not trace or not span:
        return None
    return trace, span
