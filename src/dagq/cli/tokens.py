"""``dagq token``: access tokens of ``dagq server`` — create, list, revoke."""

from __future__ import annotations

import sys

from dagq.cli.inspect import EXIT_OK, console, print_json, when, with_client
from dagq.cli.tables import Listing, printable
from dagq.errors import UsageError
from dagq.submission import local_actor
from dagq.tokens import TokenInfo, create_token, list_tokens, parse_duration, revoke_token


def run_create(
    store_url: str, *, role: str, tenant: str, expires: str | None, name: str, as_json: bool
) -> int:
    """``dagq token create``: the token on stdout (once: the store keeps only its hash),
    what it grants on stderr."""
    try:
        expires_in_s = None if expires is None else parse_duration(expires)
    except UsageError as exc:
        raise UsageError(f"--expires: {exc}") from None
    made = with_client(
        store_url,
        lambda c: create_token(
            c.store,
            role=role,
            tenant=tenant,
            expires_in_s=expires_in_s,
            name=name,
            created_by=local_actor("cli"),
        ),
        create=True,
    )
    if as_json:
        print_json(made)
        return EXIT_OK
    print(made.token, flush=True)
    print(f"{_describe(made.info)}; shown once, keep it secret", file=sys.stderr)
    return EXIT_OK


def _describe(info: TokenInfo) -> str:
    scope = f"tenant {info.tenant}" if info.tenant else "every tenant"
    until = f"until {when(info.expires_at)}" if info.expires_at is not None else "no expiry"
    return f"token {info.id} ({printable(info.name)}): {info.role}, {scope}, {until}"


def run_list(store_url: str, *, as_json: bool) -> int:
    """``dagq token list``: every token, oldest first; never a secret."""
    found = with_client(store_url, lambda c: list_tokens(c.store))
    if as_json:
        print_json(found)
        return EXIT_OK
    if not found:
        console().print("no tokens (make one with 'dagq token create --role ROLE')")
        return EXIT_OK
    table = Listing(["id", "name", "role", "tenant", "status", "created", "by", "expires"])
    for t in found:
        table.add_row(
            t.id,
            printable(t.name, one_line=True),
            t.role,
            t.tenant or "*",
            t.status,
            when(t.created_at),
            printable(t.created_by, one_line=True),
            when(t.expires_at),
        )
    table.print(console())
    return EXIT_OK


def run_revoke(store_url: str, token_id: str) -> int:
    """``dagq token revoke ID``: servers refuse it within seconds (their cache)."""
    revoked = with_client(store_url, lambda c: revoke_token(c.store, token_id))
    console().print(f"revoked token {revoked.id} ({printable(revoked.name)})")
    return EXIT_OK
