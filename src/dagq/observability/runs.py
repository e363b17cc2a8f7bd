"""The coordinator's side of telemetry: a run's spans and metrics as its state moves.

The coordinator calls :class:`RunTelemetry` at three points of a workflow's step —
before applying events, after applying them, after the commit — and once per batch.
It keeps in memory only what a span needs and the state does not hold: when the
current epoch began, and when each wait began (lost on a restart: such a span then
starts at its end).
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from dagq.dispatching import Outgoing
from dagq.observability import metrics, spans, tracing
from dagq.state import UNSET, WORKFLOW_ACTIVE, RunState
from dagq.transitions import Effects

#: History notes that end a wait, and the kind of wait.
_WAIT_ENDS = (("timer fired", "timer"), ("signal '", "signal"), ("no signal '", "signal"))
_WAIT_END_PREFIXES = tuple(prefix for prefix, _ in _WAIT_ENDS)


class Before(msgspec.Struct, frozen=True):
    """What a step started from."""

    epoch: int
    status: str


class RunTelemetry:
    """Spans and metrics of the runs one coordinator advances."""

    def __init__(self, store_url: str) -> None:
        self.store_url = store_url
        self._epoch_started: dict[tuple[str, int], float] = {}
        self._waits: dict[tuple[str, str], float] = {}

    @staticmethod
    def on() -> bool:
        """Is any telemetry on (so messages say when they are due)?"""
        return tracing.enabled() or metrics.current() is not None

    @staticmethod
    def traced() -> bool:
        """Is tracing on (so messages carry a traceparent and their workflow's name)?"""
        return tracing.enabled()

    def before(self, st: RunState) -> Before:
        """Note where a step starts."""
        return Before(st.epoch, st.status)

    def applied(self, name: str, st: RunState, before: Before, fx: Effects, now: float) -> None:
        """After the events are applied: an epoch closed by a new one (a retry, a
        compensation) ends its run span; waits that ended get their spans."""
        if not tracing.enabled():
            return
        workflow_id = st.workflow_id
        if st.epoch > before.epoch:
            if before.status in WORKFLOW_ACTIVE:  # still running: its span ends here
                self._end_run(name, st, before.epoch, before.status, now)
            self._epoch_started[(workflow_id, st.epoch)] = now
        for entry in fx.history:
            if entry.task is None:
                continue
            if entry.kind == "waiting":
                self._waits[(workflow_id, entry.task)] = entry.at
                continue
            detail = entry.detail
            if not detail or not detail.startswith(_WAIT_END_PREFIXES):
                continue  # most entries (one check each: a step notes several per task)
            for prefix, kind in _WAIT_ENDS:
                if detail.startswith(prefix):
                    began = self._waits.pop((workflow_id, entry.task), entry.at)
                    spans.waited(
                        kind,
                        workflow_id=workflow_id,
                        workflow_name=name,
                        epoch=st.epoch,
                        start_s=began,
                        end_s=entry.at,
                    )
                    break

    def committed(
        self, name: str, st: RunState, outgoing: Sequence[Outgoing], staged_at: float, now: float
    ) -> None:
        """After the commit: the sends are out, their spans are emitted."""
        if tracing.enabled() and outgoing:
            # Each queue's sends in one flat list (span id, name, attempt, ...), one
            # record a queue: most steps send on one.
            by_queue: dict[str, list[int | str]] = {}
            for o in outgoing:
                if o.span_id:
                    flat = by_queue.get(o.queue)
                    if flat is None:
                        flat = by_queue[o.queue] = []
                    flat += (o.span_id, o.name, o.attempt)
            for queue, flat in by_queue.items():
                spans.sent_flat(
                    self.store_url,
                    st.workflow_id,
                    st.epoch,
                    queue,
                    flat,
                    start_s=staged_at,
                    end_s=now,
                )

    def finished(self, name: str, st: RunState, now: float) -> None:
        """A run reached its final status."""
        recorder = metrics.current()
        if recorder is not None:
            recorder.workflow_finished(st.status, st.workflow_id)
        if tracing.enabled():
            self._end_run(name, st, st.epoch, st.status, now)
            self._forget(st.workflow_id)

    def _end_run(self, name: str, st: RunState, epoch: int, status: str, now: float) -> None:
        start = self._epoch_started.pop((st.workflow_id, epoch), st.created_at)
        end = st.finished_at if st.finished_at != UNSET and epoch == st.epoch else now
        spans.run_ended(
            st.workflow_id,
            name,
            epoch=epoch,
            status=status,
            start_s=start,
            end_s=max(end, start),
            error=None,
        )

    def _forget(self, workflow_id: str) -> None:
        for key in [k for k in self._waits if k[0] == workflow_id]:
            del self._waits[key]

    def batch(
        self, message_count: int, workflow_ids: Sequence[str], start: float, end: float
    ) -> None:
        """One batch of events handled."""
        recorder = metrics.current()
        if recorder is not None:
            recorder.batch_took(end - start)
        spans.batch(
            self.store_url, message_count, workflow_ids=workflow_ids, start_s=start, end_s=end
        )
