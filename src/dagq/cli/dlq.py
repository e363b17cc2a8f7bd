"""``dagq dlq``: dead-lettered messages — list, show, replay after a fix, purge."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import msgspec
from rich.text import Text

from dagq import dead_letters
from dagq.cli.confirmation import confirm
from dagq.cli.inspect import EXIT_OK, console, print_json, when, with_client
from dagq.cli.tables import Listing, plain_out, printable, printable_bytes
from dagq.client import Client
from dagq.errors import UsageError
from dagq.stores.base import DeadLetter, Store
from dagq.submission import local_actor

CLI = local_actor("cli")

_DONE = {"replay": "replayed", "purge": "purged"}


def run_list(store_url: str, queue: str | None, limit: int, *, as_json: bool) -> int:
    """``dagq dlq list``: oldest first."""

    async def body(client: Client) -> list[DeadLetter]:
        return await client.store.queues.dead_letters(queue, limit=limit)

    found = with_client(store_url, body)
    infos = [dead_letters.describe(d) for d in found]
    if as_json:
        print_json(infos)
        return EXIT_OK
    if not infos:
        console().print("no dead letters" + (f" in queue {queue!r}" if queue else ""))
        return EXIT_OK
    table = Listing(
        ["key", "queue", "kind", "what", "deliveries", "reason", "when"],
        right=frozenset({"deliveries"}),
    )
    for dead, info in zip(found, infos, strict=True):
        table.add_row(
            info.key,
            info.queue,
            Text(info.kind, style="red" if info.kind == "unreadable" else ""),
            _what(dead, info),
            str(info.deliveries),
            info.reason,
            when(info.dead_at),
        )
    table.print(console())
    return EXIT_OK


def _what(dead: DeadLetter, info: dead_letters.DeadLetterInfo) -> str:
    """What it carried; for an unreadable one its first bytes, each one that is not
    UTF-8 text shown as ``\\xNN``."""
    if info.kind != "unreadable":
        return info.summary
    return printable_bytes(dead.body[:60])


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
        ("what", _what(dead, info)),
        ("deliveries", str(info.deliveries)),
        ("reason", info.reason),
        ("dead since", when(info.dead_at)),
        ("size", f"{info.size} bytes"),
    ]:
        out.print(Text(f"{label}: ", style="bold") + Text(printable(value)))
    if isinstance(content, str):  # unreadable: its bytes, escaped where not text
        plain_out(out, printable_bytes(dead.body))
    else:
        plain_out(out, msgspec.json.format(msgspec.json.encode(content).decode(), indent=2))
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
    action: Callable[[Store, Sequence[DeadLetter], str], Awaitable[int]],
) -> int:
    _chosen(keys, every, queue, verb)

    async def body(client: Client) -> int:
        return await action(client.store, await _select(client, keys, every, queue), CLI)

    count = with_client(store_url, body)
    console().print(f"{_DONE[verb]} {count} dead letter(s)")
    return EXIT_OK
