"""``dagq explain`` (why a task is in its state) and ``dagq summary`` (progress per layer)."""

from __future__ import annotations

from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from dagq.cli.display import STYLES, counts_text, first_line
from dagq.cli.inspect import EXIT_OK, console, print_json, when, with_client
from dagq.cli.styled import Styled
from dagq.cli.tables import Listing, Part, printable, show
from dagq.explanation import Explanation
from dagq.views import Layer, LayerSummary

#: How many of a task's events explain prints (all of them with --json).
EVENTS_SHOWN = 12


def run_explain(store_url: str, workflow_id: str, task: str, *, as_json: bool) -> int:
    """``dagq explain ID TASK``."""
    found = with_client(store_url, lambda c: c.explain(workflow_id, task))
    if as_json:
        print_json(found)
    else:
        show(console(), explanation_view(found))
    return EXIT_OK


def explanation_view(found: Explanation) -> list[Part]:
    """The explanation for people: the verdict first, then each part of the story."""
    parts: list[Part] = [
        Text.assemble(
            (found.task, "bold"),
            "  ",
            (found.status, STYLES.get(found.status, "bold")),
            "  ",
            (f"workflow {found.workflow_id} ({found.workflow_status})", "dim"),
            (f"  {found.semantics} semantics" if found.semantics else "", "dim"),
        ),
        Text(found.summary),
    ]
    deps = found.dependencies
    parts.append(_line("dependencies", f"dep_policy {deps.policy}: {deps.summary}"))
    if deps.parents:
        parts.append(
            Text(
                "    "
                + ", ".join(f"{p.name} ({p.status})" for p in deps.parents[:20])
                + (f" and {len(deps.parents) - 20} more" if len(deps.parents) > 20 else ""),
                style="dim",
            )
        )
    if found.condition is not None:
        cond = found.condition
        result = cond.result or "not evaluated yet"
        parts.append(_line("condition", f"{cond.expression}  →  {result}"))
        if cond.detail:
            parts.append(Text(f"    {cond.detail}", style="dim"))
    parts.append(_line("attempts", _attempts(found)))
    for attempt in found.retries.attempts:
        if attempt.kind in ("retried", "failed"):
            detail = first_line(attempt.detail, 160)
            parts.append(Text(f"    #{attempt.attempt} {attempt.kind}: {detail}", style="dim"))
    if found.error and found.status == "failed":
        parts.append(_line("error", first_line(found.error, 300)))
    for wait in found.waiting_for:
        parts.append(_line(f"waits for ({wait.kind})", wait.detail))
        if wait.fix:
            parts.append(Text(f"    → {wait.fix}", style="dim"))
    if found.events:
        table = Listing(["time", "event", "attempt", "detail", "by"])
        for event in found.events[-EVENTS_SHOWN:]:
            table.add_row(
                when(event.at),
                event.kind,
                str(event.attempt or ""),
                first_line(event.detail, 300),
                printable(event.actor or "", one_line=True),
            )
        parts.append(table)
    return parts


def _line(label: str, text: str) -> Text:
    return Text.assemble((f"{label}: ", "bold"), text)


def _attempts(found: Explanation) -> str:
    retries = found.retries
    text = f"{retries.attempts_used} of {retries.max_attempts} used"
    if retries.max_attempts > 1:
        text += (
            f"; backoff {retries.backoff_s:g}s x{retries.backoff_multiplier:g} "
            f"(at most {retries.backoff_max_s:g}s)"
        )
    if retries.retry_on:
        text += f"; only {', '.join(retries.retry_on)} retried"
    if retries.no_retry_on:
        text += f"; never {', '.join(retries.no_retry_on)}"
    if retries.non_retryable_exit_codes:
        codes = ", ".join(map(str, retries.non_retryable_exit_codes))
        text += f"; exit codes {codes} are final"
    return text


def run_summary(store_url: str, workflow_id: str, *, as_json: bool) -> int:
    """``dagq summary ID`` (and ``dagq status ID --by-layer``)."""
    found = with_client(store_url, lambda c: c.summary(workflow_id))
    if as_json:
        print_json(found)
    else:
        show(console(), summary_view(found, bars=console().is_terminal))
    return EXIT_OK


def summary_view(found: LayerSummary, *, bars: bool = True) -> list[Part]:
    """One row per layer: a progress bar (on a terminal), done/total, counts per state,
    a few names."""
    head = Text.assemble(
        (found.name, "bold"),
        "  ",
        (found.id, "dim"),
        "  ",
        (found.status, STYLES.get(found.status, "bold")),
        f"  {found.done:,}/{found.total:,} tasks done",
    )
    if not bars:
        table = Listing(["layer", "done", "states", "tasks"])
        for layer in found.layers:
            table.add_row(str(layer.layer), f"{layer.done}/{layer.total}", *_layer_cells(layer))
        return [head, table]
    grid = Table(box=None, title=None)
    for name in ("layer", "progress", "done", "states", "tasks"):
        grid.add_column(name, overflow="fold")  # never cut to an ellipsis
    for layer in found.layers:
        grid.add_row(
            str(layer.layer),
            ProgressBar(total=max(layer.total, 1), completed=layer.done, width=24),
            f"{layer.done:,}/{layer.total:,}",
            *_layer_cells(layer),
        )
    return [head, grid]


def _layer_cells(layer: Layer) -> tuple[Styled, str]:
    """A layer's counts per state, and its first task names (with how many more)."""
    more = layer.total - len(layer.tasks)
    names = ", ".join(layer.tasks) + (f" and {more} more" if more > 0 else "")
    return counts_text(layer.counts), names
