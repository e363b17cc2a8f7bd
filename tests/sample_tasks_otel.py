"""A Python task that makes a span of its own (the observability tests)."""

from __future__ import annotations

from opentelemetry import trace


def traced() -> str:
    """Does some "work" inside a span of its own; returns the span's trace id."""
    with trace.get_tracer("user").start_as_current_span("user-work") as span:
        return f"{span.get_span_context().trace_id:032x}"
