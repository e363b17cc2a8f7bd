"""``dagq dlq``: dead-lettered messages — list, show, replay after a fix, purge."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from rich.table import Column, Table
from rich.text import Text

from dagq import dead_letters
from dagq.cli.confirmation import confirm
from dagq.cli.inspect import EXIT_OK, console, print_json, when, with_client
from dagq.client import Client
from dagq.errors import UsageError
from dagq.stores.base import DeadLetter, Store

_DONE = {"replay": "replayed", "purge": "purged"}


def run_list(store_url: str, queue: str | None, limit: int, *, as_json: bool) -> int:
    """``dagq dlq list``: oldest first."""

    async def body(client: Client) -> list[DeadLetter]:
        return await client.store.queues.dead_letters(queue, limit=limit)

    infos = [dead_letters.describe(d) for d in with_client(store_url, body)]
    if as_json:
        print_json(infos)
        return EXIT_OK
    if not infos:
        console().print("no dead letters" + (f" in queue {queue!r}" if queue else ""))
        return EXIT_OK
    table = Table(
        Column("key", no_wrap=True), "queue", "kind", "what", "deliveries", "reason", "when"
    )
    for info in infos:
        table.add_row(
            info.key,
            info.queue,
            Text(info.kind, style="red" if info.kind == "unreadable" else ""),
            info.summary,
            str(info.deliveries),
            info.reason,
            when(info.dead_at),
        )
    console().print(table)
    return EXIT_OK


def run_show(store_url: str, key: str, *, as_json: bool) -> int:
    """``dagq dlq show KEY``: where it was, why, and its content."""

    async def body(client: Client) -> DeadLetter:
        [found] = await dead_letters.find(client.store, [key])
        return found

    dead = with_client(store_url, body)
    info, content = dead_letters.describe(dead), dead_letters.body_of(dead)
    if as_json:
        print_json({"dead_letter": info, "body": content})
        return EXIT_OK
    out = console()
    for label, value in [
        ("key", info.key),
        ("queue", info.queue),
        ("message id", info.message_id),
        ("kind", info.kind),
        ("what", info.summary),
        ("deliveries", str(info.deliveries)),
        ("reason", info.reason),
        ("dead since", when(info.dead_at)),
        ("size", f"{info.size} bytes"),
    ]:
        out.print(Text(f"{label}: ", style="bold") + Text(value))
    if isinstance(content, str):  # unreadable: shown as text
        out.print(content)
    else:
        out.print_json(data=content)
    return EXIT_OK


def _chosen(keys: tuple[str, ...], every: bool, queue: str | None, verb: str) -> None:
    if keys and every:
        raise UsageError(f"give dead-letter keys or --all, not both, to {verb}")
    if not keys and not every:
        raise UsageError(f"give the keys of the dead letters to {verb}, or --all")
    if queue and not every:
        raise UsageError("--queue goes with --all")


async def _select(
    client: Client, keys: tuple[str, ...], every: bool, queue: str | None
) -> list[DeadLetter]:
    if every:
        return await client.store.queues.dead_letters(queue, limit=dead_letters.ALL_LIMIT)
    return await dead_letters.find(client.store, keys)


def run_replay(store_url: str, keys: tuple[str, ...], *, every: bool, queue: str | None) -> int:
    """``dagq dlq replay KEY... | --all``: back to their queues, then removed."""
    return _apply(store_url, keys, every, queue=queue, verb="replay", action=dead_letters.replay)


def run_purge(
    store_url: str, keys: tuple[str, ...], *, every: bool, queue: str | None, yes: bool = False
) -> int:
    """``dagq dlq purge KEY... | --all``: removed for good (``--all`` confirmed first)."""
    if every and not keys:
        which = f"of queue '{queue}' " if queue else ""
        confirm(f"remove every dead letter {which}from {store_url} for good", yes=yes)
    return _apply(store_url, keys, every, queue=queue, verb="purge", action=dead_letters.purge)


def _apply(
    store_url: str,
    keys: tuple[str, ...],
    every: bool,
    *,
    queue: str | None,
    verb: str,
    action: Callable[[Store, Sequence[DeadLetter]], Awaitable[int]],
) -> int:
    _chosen(keys, every, queue, verb)

    async def body(client: Client) -> int:
        return await action(client.store, await _select(client, keys, every, queue))

    count = with_client(store_url, body)
    console().print(f"{_DONE[verb]} {count} dead letter(s)")
    return EXIT_OK
