"""``dagq quarantine``: the workflows the coordinator set aside, and releasing them."""

from __future__ import annotations

from dagq.cli.display import first_line
from dagq.cli.inspect import EXIT_OK, console, print_json, when, with_client
from dagq.cli.tables import Listing


def run_list(store_url: str, *, as_json: bool) -> int:
    """``dagq quarantine list``: why each one was set aside, since when, what it keeps."""
    found = with_client(store_url, lambda c: c.quarantined())
    if as_json:
        print_json(found)
        return EXIT_OK
    if not found:
        console().print("no quarantined workflows")
        return EXIT_OK
    table = Listing(["id", "since", "step", "kept events", "reason"])
    for item in found:
        table.add_row(
            item.id,
            when(item.since),
            "damaged record"
            if item.damaged
            else item.step + (" (released)" if item.released else ""),
            str(item.kept_events),
            first_line(item.reason, 200),
        )
    table.print(console())
    return EXIT_OK


def run_release(store_url: str, workflow_id: str) -> int:
    """``dagq quarantine release ID``: the coordinator tries the workflow again."""
    released = with_client(store_url, lambda c: c.release(workflow_id))
    if released.damaged:
        console().print(
            f"released {workflow_id}: its damaged quarantine record was deleted (the events "
            "it kept could not be read); the coordinator loads it again; if it fails again "
            "it is quarantined again (see dagq status)"
        )
        return EXIT_OK
    console().print(
        f"released {workflow_id}: the coordinator loads it again and applies its "
        f"{released.kept_events} kept event(s) first; if it fails again it is quarantined "
        "again (see dagq status)"
    )
    return EXIT_OK
