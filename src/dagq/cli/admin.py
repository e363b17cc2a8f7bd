"""Commands that look after a store: doctor and purge."""

from __future__ import annotations

from rich.text import Text

from dagq.cli.confirmation import confirm
from dagq.cli.inspect import EXIT_FAILED, EXIT_OK, console, print_json, with_client
from dagq.cli.tables import printable
from dagq.client import Client
from dagq.errors import StoreUnavailable, UsageError
from dagq.maintenance import Finding, diagnose, purge, purge_older_than

_MARKS = {"ok": ("✔", "green"), "warn": ("!", "yellow"), "fail": ("✘", "bold red")}


def run_doctor(store_url: str, *, as_json: bool) -> int:
    """``dagq doctor``: 0 when all is well, 1 when something needs a person."""

    async def body(client: Client) -> list[Finding]:
        return await diagnose(client.store)

    try:
        findings = with_client(store_url, body)
    except StoreUnavailable as exc:
        findings = [Finding("fail", "store", str(exc), "check --store or DAGQ_STORE")]
    if as_json:
        print_json(findings)
    else:
        out = console()
        for finding in findings:
            mark, style = _MARKS[finding.level]
            line = Text(f"{mark} ", style=style) + Text(f"{finding.check}: ", style="bold")
            line += Text(printable(finding.detail))
            out.print(line)
            if finding.fix:
                out.print(Text(f"    → {finding.fix}", style="dim"))
    return EXIT_OK if all(f.level == "ok" for f in findings) else EXIT_FAILED


def run_purge(
    store_url: str,
    workflow_id: str | None,
    *,
    older_than_days: float | None,
    force: bool,
    yes: bool = False,
) -> int:
    """``dagq purge ID`` or ``dagq purge --older-than DAYS`` (confirmed first)."""
    if (workflow_id is None) == (older_than_days is None):
        raise UsageError("give either a workflow ID or --older-than DAYS")
    if older_than_days is not None:
        confirm(
            f"purge every finished workflow older than {older_than_days:g} day(s) from {store_url}",
            yes=yes,
        )
    if workflow_id is not None:
        deleted = with_client(store_url, lambda c: purge(c.store, workflow_id, force=force))
        console().print(f"purged {workflow_id} ({deleted} document(s))")
        return EXIT_OK
    assert older_than_days is not None
    ids = with_client(store_url, lambda c: purge_older_than(c.store, older_than_days))
    console().print(f"purged {len(ids)} finished workflow(s) older than {older_than_days:g} day(s)")
    return EXIT_OK
