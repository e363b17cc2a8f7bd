"""Which runs a request is about: the filters a listing, a stream and a bulk action share.

``status``, ``name`` and ``tenant`` narrow the index query itself; labels
(``label=k=v``, every one must match) and the created range are checked on each row.
A caller bound to a tenant sees only that tenant's runs, whatever it asks for.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from dagq.client import WORKFLOW_STATUSES, WorkflowSummary
from dagq.errors import ValidationError
from dagq.server.access import Caller


@dataclass(frozen=True, slots=True, kw_only=True)
class RunFilter:
    """What a run must be to be included."""

    status: str | None = None
    name: str | None = None
    tenant: str | None = None
    labels: tuple[tuple[str, str], ...] = ()
    created_after: float | None = None
    created_before: float | None = None
    #: The caller's tenant does not match the tenant asked for: nothing is included.
    empty: bool = False

    def matches(self, run: WorkflowSummary) -> bool:
        """Whether a run (as listed) passes every filter."""
        if self.empty:
            return False
        if self.status is not None and run.status != self.status:
            return False
        if self.name is not None and run.name != self.name:
            return False
        if self.tenant is not None and run.tenant != self.tenant:
            return False
        return self.within(run) and all(run.labels.get(k) == v for k, v in self.labels)

    def within(self, run: WorkflowSummary) -> bool:
        """Whether a run was created in the range asked for."""
        after, before = self.created_after, self.created_before
        return (after is None or run.created_at >= after) and (
            before is None or run.created_at < before
        )


def run_filter(
    who: Caller,
    *,
    status: str | None = None,
    name: str | None = None,
    tenant: str | None = None,
    labels: list[str] | None = None,
    created_after: str | float | None = None,
    created_before: str | float | None = None,
) -> RunFilter:
    """The filter of a request (422 naming a bad value), bound to the caller's tenant."""
    if status is not None and status not in WORKFLOW_STATUSES:
        known = ", ".join(sorted(WORKFLOW_STATUSES))
        raise ValidationError(f"status={status[:40]!r} is not a workflow status (known: {known})")
    empty = bool(who.tenant) and tenant is not None and tenant != who.tenant
    return RunFilter(
        status=status,
        name=name,
        tenant=who.tenant or tenant,
        labels=tuple(_label(text) for text in labels or ()),
        created_after=moment(created_after, "created_after"),
        created_before=moment(created_before, "created_before"),
        empty=empty,
    )


def _label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValidationError(f"label={text[:40]!r} is not key=value")
    return key, value


def moment(text: str | float | None, field: str) -> float | None:
    """Epoch seconds from epoch seconds or an ISO 8601 time; 422 naming ``field``."""
    if text is None or isinstance(text, float | int):
        return None if text is None else float(text)
    try:
        return float(text)
    except ValueError:
        pass
    try:
        found = datetime.fromisoformat(text)
    except ValueError:
        raise ValidationError(
            f"{field}={text[:40]!r} is neither epoch seconds nor an ISO 8601 time"
        ) from None
    return found.timestamp()
