"""The tables of a PostgreSQL store and the versioned migrations that make them.

Each migration is a list of statements, applied in one transaction under an advisory
lock (so processes opening a new store at once do not trip over each other) and
recorded in ``meta.schema_version``; every statement is idempotent, so applying
migrations again is harmless. A store whose version is newer than :data:`VERSION` was
written by a newer dagq and is refused. Everything lives in one schema (``?schema=``
of the URL, default ``dagq``).

Against bloat (docs/architecture.md, stores): messages are deleted, never marked done;
the queue and lease tables leave room on each page (``fillfactor``) so the updates of
a receive or a renewal stay on their page (HOT), and autovacuum visits the queue table
after a small fraction of it changed rather than the default fifth.
"""

from __future__ import annotations

#: The SQLSTATE of :func:`fail`: a guarded statement of a batch found its condition false.
FAILED = "DQ001"

#: The schema version this dagq writes; a newer store is refused.
VERSION = 4

#: Statements per version; ``{s}`` is the quoted schema name.
MIGRATIONS: dict[int, list[str]] = {
    1: [
        """CREATE TABLE IF NOT EXISTS {s}.documents (
            key text COLLATE "C" PRIMARY KEY, data bytea NOT NULL, etag text NOT NULL
        ) WITH (fillfactor = 90)""",
        """CREATE TABLE IF NOT EXISTS {s}.messages (
            seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, queue text NOT NULL,
            id text NOT NULL, body bytea NOT NULL, enqueued_at float8 NOT NULL,
            visible_at float8 NOT NULL, receipt text, dequeue_count integer NOT NULL DEFAULT 0,
            UNIQUE (queue, id)
        ) WITH (fillfactor = 70, autovacuum_vacuum_scale_factor = 0.01,
                autovacuum_vacuum_insert_scale_factor = 0.01,
                autovacuum_analyze_scale_factor = 0.02,
                autovacuum_vacuum_cost_delay = 0)""",
        "CREATE INDEX IF NOT EXISTS messages_visible ON {s}.messages (queue, visible_at, seq)",
        # Partial: only messages delivered before, among which a receive looks for the
        # ones delivered too often; a range of it is almost always empty, and a receive
        # that takes messages cannot use it (so it walks messages_visible in order).
        """CREATE INDEX IF NOT EXISTS messages_redelivered
            ON {s}.messages (queue, visible_at) WHERE dequeue_count > 0""",
        """CREATE INDEX IF NOT EXISTS messages_receipt ON {s}.messages (queue, receipt)
            WHERE receipt IS NOT NULL""",
        """CREATE TABLE IF NOT EXISTS {s}.dead_letters (
            seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, queue text NOT NULL,
            id text NOT NULL, body bytea NOT NULL, dequeue_count integer NOT NULL,
            reason text NOT NULL, dead_at float8 NOT NULL
        )""",
        "CREATE INDEX IF NOT EXISTS dead_letters_queue ON {s}.dead_letters (queue, seq)",
        """CREATE TABLE IF NOT EXISTS {s}.index_rows (
            id text COLLATE "C" PRIMARY KEY, name text NOT NULL, status text NOT NULL,
            tenant text NOT NULL, created_at float8 NOT NULL, updated_at float8 NOT NULL,
            row bytea NOT NULL
        ) WITH (fillfactor = 80)""",
        """CREATE INDEX IF NOT EXISTS index_rows_created
            ON {s}.index_rows (created_at DESC, id DESC)""",
        """CREATE INDEX IF NOT EXISTS index_rows_status
            ON {s}.index_rows (status, created_at DESC, id DESC)""",
        """CREATE INDEX IF NOT EXISTS index_rows_name
            ON {s}.index_rows (name, created_at DESC, id DESC)""",
        """CREATE INDEX IF NOT EXISTS index_rows_tenant
            ON {s}.index_rows (tenant, created_at DESC, id DESC)""",
        # What changed since a moment (the server's stream of every run).
        """CREATE INDEX IF NOT EXISTS index_rows_updated
            ON {s}.index_rows (updated_at, id)""",
        # Raised by a batch's guarded statements (a lost condition, a lost lease), so a
        # whole batch goes out in one round trip and fails as one transaction.
        """CREATE OR REPLACE FUNCTION {s}.fail(message text) RETURNS boolean
            LANGUAGE plpgsql AS $$
            BEGIN RAISE EXCEPTION USING ERRCODE = 'DQ001', MESSAGE = message; END $$""",
        """CREATE TABLE IF NOT EXISTS {s}.leases (
            name text PRIMARY KEY, owner text NOT NULL, token text NOT NULL,
            acquired_at float8 NOT NULL, expires_at float8 NOT NULL
        ) WITH (fillfactor = 50)""",
    ],
    # A receive finds the overdue messages in its walk of messages_visible: the partial
    # index only cost every receive a write, and a scan of its dead entries.
    2: ["DROP INDEX IF EXISTS {s}.messages_redelivered"],
    # Waiters (:mod:`.postgres_wakeups`): a receive that found fewer messages than it
    # asked for registers its process's own channel until ``until``; a send takes as
    # many registered waiters as it sends messages and notifies only them.
    3: [
        """CREATE TABLE IF NOT EXISTS {s}.waiters (
            queue text NOT NULL, channel text NOT NULL, until float8 NOT NULL,
            PRIMARY KEY (queue, channel)
        ) WITH (fillfactor = 50, autovacuum_vacuum_scale_factor = 0.01,
                autovacuum_vacuum_cost_delay = 0)"""
    ],
    # A waiter says how many messages it would take (``want``), how long they hide once
    # taken (``hide``), and the advisory lock its listening connection holds while it
    # listens (``key``): a send hands a live waiter its message in the notification.
    4: [
        """ALTER TABLE {s}.waiters ADD COLUMN IF NOT EXISTS want integer NOT NULL DEFAULT 0,
            ADD COLUMN IF NOT EXISTS hide float8 NOT NULL DEFAULT 0,
            ADD COLUMN IF NOT EXISTS key bigint"""
    ],
}


def quote_ident(name: str) -> str:
    """``name`` as a quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'
