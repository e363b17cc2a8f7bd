"""Looking after the store: `dagq doctor`, `purge`, `quarantine`, `dlq`, `token`, `config`, `store`.

Imported only when the command runs or shows its help (see :mod:`dagq.cli`)."""

from __future__ import annotations

import click

from dagq.cli import (
    DEFAULT_STORE,
    _exit,
    json_option,
    store_option,
    yes_option,
)


@click.command()
@store_option
@json_option
def doctor(*, store_url: str, as_json: bool) -> None:
    """Check the store, coordinator, queues and workflows; suggest a fix for each problem."""
    from dagq.cli.admin import run_doctor

    _exit(lambda: run_doctor(store_url, as_json=as_json))


@click.command()
@click.argument("workflow_id", required=False)
@click.option(
    "--older-than",
    "older_than",
    type=click.FloatRange(0),
    default=None,
    metavar="DAYS",
    help="Purge every finished workflow older than this.",
)
@click.option("--force", is_flag=True, help="Also purge an unfinished workflow.")
@yes_option
@store_option
def purge(
    *, workflow_id: str | None, older_than: float | None, force: bool, yes: bool, store_url: str
) -> None:
    """Remove a workflow's state, outputs, logs and index row (finished ones only).

    --older-than asks for confirmation on a terminal, and needs --yes elsewhere.
    """
    from dagq.cli.admin import run_purge

    _exit(
        lambda: run_purge(store_url, workflow_id, older_than_days=older_than, force=force, yes=yes)
    )


@click.group(name="quarantine")
def quarantine_group() -> None:
    """Workflows the coordinator set aside after their work failed: list, release."""


@quarantine_group.command("list")
@store_option
@json_option
def quarantine_list(*, store_url: str, as_json: bool) -> None:
    """Quarantined workflows: since when, at which step, why, how many events are kept."""
    from dagq.cli.quarantine import run_list

    _exit(lambda: run_list(store_url, as_json=as_json))


@quarantine_group.command("release")
@click.argument("workflow_id")
@store_option
def quarantine_release(*, workflow_id: str, store_url: str) -> None:
    """Let the coordinator try WORKFLOW_ID again, once the cause is fixed."""
    from dagq.cli.quarantine import run_release

    _exit(lambda: run_release(store_url, workflow_id))


@click.group()
def dlq() -> None:
    """Dead-lettered messages: list, show, replay after a fix, purge."""


@dlq.command("list")
@click.option("--queue", default=None, help="Only this queue's dead letters.")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 100_000))
@store_option
@json_option
def dlq_list(*, queue: str | None, limit: int, store_url: str, as_json: bool) -> None:
    """Dead letters, oldest first: key, queue, what they carried, why they died."""
    from dagq.cli.dlq import run_list

    _exit(lambda: run_list(store_url, queue, limit, as_json=as_json))


@dlq.command("show")
@click.argument("key")
@store_option
@json_option
def dlq_show(*, key: str, store_url: str, as_json: bool) -> None:
    """One dead letter: where it was, why, and its decoded content."""
    from dagq.cli.dlq import run_show

    _exit(lambda: run_show(store_url, key, as_json=as_json))


@dlq.command("replay")
@click.argument("keys", nargs=-1)
@click.option("--all", "every", is_flag=True, help="Every dead letter (of --queue).")
@click.option("--queue", default=None, help="With --all: only this queue's.")
@store_option
def dlq_replay(*, keys: tuple[str, ...], every: bool, queue: str | None, store_url: str) -> None:
    """Send dead letters back to their queues (after a fix), then remove them."""
    from dagq.cli.dlq import run_replay

    _exit(lambda: run_replay(store_url, keys, every=every, queue=queue))


@dlq.command("purge")
@click.argument("keys", nargs=-1)
@click.option("--all", "every", is_flag=True, help="Every dead letter (of --queue).")
@click.option("--queue", default=None, help="With --all: only this queue's.")
@yes_option
@store_option
def dlq_purge(
    *, keys: tuple[str, ...], every: bool, queue: str | None, yes: bool, store_url: str
) -> None:
    """Remove dead letters for good.

    --all asks for confirmation on a terminal, and needs --yes elsewhere.
    """
    from dagq.cli.dlq import run_purge

    _exit(lambda: run_purge(store_url, keys, every=every, queue=queue, yes=yes))


@click.group(name="token")
def token_group() -> None:
    """Access tokens of 'dagq server': roles viewer, operator, admin; optional tenant."""


@token_group.command("create")
@click.option(
    "--role",
    required=True,
    metavar="ROLE",
    help="viewer (read), operator (also submit, cancel, retry, signal) or admin "
    "(also dead letters, purge, tokens).",
)
@click.option("--tenant", default="", help="See and act on only this tenant's workflows.")
@click.option(
    "--expires", default=None, metavar="DURATION", help="Expire after 90d, 12h, 30m, 1d12h..."
)
@click.option("--name", default="", help="Who or what holds it (shown in the audit trail).")
@store_option
@json_option
def token_create(
    *, role: str, tenant: str, expires: str | None, name: str, store_url: str, as_json: bool
) -> None:
    """Make a token and print it, once: the store keeps only its hash."""
    from dagq.cli.tokens import run_create

    _exit(
        lambda: run_create(
            store_url, role=role, tenant=tenant, expires=expires, name=name, as_json=as_json
        )
    )


@token_group.command("list")
@store_option
@json_option
def token_list(*, store_url: str, as_json: bool) -> None:
    """Every token: id, name, role, tenant, status (active, expired, revoked); no secrets."""
    from dagq.cli.tokens import run_list

    _exit(lambda: run_list(store_url, as_json=as_json))


@token_group.command("revoke")
@click.argument("token_id", metavar="ID")
@store_option
def token_revoke(*, token_id: str, store_url: str) -> None:
    """Revoke token ID: every server refuses it within 5 seconds."""
    from dagq.cli.tokens import run_revoke

    _exit(lambda: run_revoke(store_url, token_id))


@click.group(name="config")
def config_group() -> None:
    """The configuration file: store URL and defaults of run and worker."""


@config_group.command("init")
@click.option("--user", is_flag=True, help="Write the user's file, not ./dagq.yaml.")
@click.option("--force", is_flag=True, help="Replace an existing file.")
@click.option(
    "--store",
    "store_url",
    default=DEFAULT_STORE,
    show_default=True,
    help="The store URL to write into the file.",
)
def config_init(*, user: bool, force: bool, store_url: str) -> None:
    """Write a commented configuration file with the store URL and the defaults."""
    from dagq.cli.settings import run_init

    _exit(lambda: run_init(user=user, force=force, store=store_url))


@config_group.command("show")
@json_option
def config_show(*, as_json: bool) -> None:
    """The effective settings and where each comes from (default, a file, env)."""
    from dagq.cli.settings import run_show

    _exit(lambda: run_show(as_json=as_json))


@click.group(name="store")
def store_group() -> None:
    """The store as a whole: migrate its tables, copy it to another backend."""


@store_group.command("migrate")
@store_option
def store_migrate(*, store_url: str) -> None:
    """Create or upgrade a PostgreSQL store's tables (also done at first use), or
    convert an Azure store's index to this dagq's layout."""
    from dagq.cli.store_admin import run_migrate

    _exit(lambda: run_migrate(store_url))


@store_group.command("copy")
@click.argument("source_url", metavar="SRC")
@click.argument("destination_url", metavar="DST")
def store_copy(*, source_url: str, destination_url: str) -> None:
    """Copy the whole store SRC (definitions, states, history, index, pending messages,
    dead letters) into the new, empty store DST, e.g. a sqlite file into PostgreSQL.

    Stop the coordinator and the workers first; afterwards, point them at DST.
    """
    from dagq.cli.store_admin import run_copy

    _exit(lambda: run_copy(source_url, destination_url))
