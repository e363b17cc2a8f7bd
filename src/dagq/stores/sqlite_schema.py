"""The tables and indexes of a sqlite store, as the script that creates them.

An open runs it when the file's ``user_version`` is below :data:`SCHEMA_VERSION` (a new
file, or one made before the version was recorded): it is idempotent (``IF NOT EXISTS``)
and runs in one ``BEGIN IMMEDIATE`` transaction, so processes opening the same file at
once do not trip over each other. Opening a file that has it already takes no write
lock, so ``dagq status`` never waits behind a coordinator's long commit. The queries
in :mod:`dagq.stores.sqlite` use these names; ``receive`` picks ``messages_overdue``
with ``INDEXED BY``.
"""

#: Recorded in the file's ``user_version`` by the script below.
SCHEMA_VERSION = 1

SCHEMA = """
BEGIN IMMEDIATE;
CREATE TABLE IF NOT EXISTS documents (
    key TEXT PRIMARY KEY, data BLOB NOT NULL, etag TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS messages (
    seq INTEGER PRIMARY KEY, queue TEXT NOT NULL, id TEXT NOT NULL, body BLOB NOT NULL,
    enqueued_at REAL NOT NULL, visible_at REAL NOT NULL, receipt TEXT,
    dequeue_count INTEGER NOT NULL DEFAULT 0, UNIQUE (queue, id)
);
CREATE INDEX IF NOT EXISTS messages_visible ON messages (queue, visible_at, seq);
CREATE INDEX IF NOT EXISTS messages_overdue ON messages (queue, dequeue_count, visible_at);
CREATE INDEX IF NOT EXISTS messages_receipt ON messages (receipt) WHERE receipt IS NOT NULL;
CREATE TABLE IF NOT EXISTS dead_letters (
    seq INTEGER PRIMARY KEY, queue TEXT NOT NULL, id TEXT NOT NULL, body BLOB NOT NULL,
    dequeue_count INTEGER NOT NULL, reason TEXT NOT NULL, dead_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS dead_letters_queue ON dead_letters (queue, seq);
CREATE TABLE IF NOT EXISTS index_rows (
    id TEXT PRIMARY KEY, name TEXT NOT NULL, status TEXT NOT NULL, tenant TEXT NOT NULL,
    created_at REAL NOT NULL, updated_at REAL NOT NULL, row BLOB NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS index_rows_created ON index_rows (created_at, id);
CREATE INDEX IF NOT EXISTS index_rows_status ON index_rows (status, created_at, id);
CREATE INDEX IF NOT EXISTS index_rows_name ON index_rows (name, created_at, id);
CREATE INDEX IF NOT EXISTS index_rows_tenant ON index_rows (tenant, created_at, id);
CREATE INDEX IF NOT EXISTS index_rows_updated ON index_rows (updated_at, id);
CREATE TABLE IF NOT EXISTS leases (
    name TEXT PRIMARY KEY, owner TEXT NOT NULL, token TEXT NOT NULL,
    acquired_at REAL NOT NULL, expires_at REAL NOT NULL
) WITHOUT ROWID;
PRAGMA user_version = 1;
COMMIT;
"""
