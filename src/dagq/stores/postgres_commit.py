"""A batch of the PostgreSQL store as one statement: no BEGIN, no COMMIT.

A coordinator's step (a fence on its lease, compare-and-swaps of states, plain writes,
sends to one queue, the delete of the events it handled, index rows), a worker's
report (a send and the delete of the task messages it reports on) and a submit
(creates of the definition and the state, the index row, the send) are each one
statement of data-modifying CTEs, committed alone: one statement is atomic, and a
failed condition (a lost lease, a stale etag) raises in it (:data:`FAILED
<dagq.stores.postgres_schema.FAILED>`, the guard as its message), which undoes the
whole of it. The pipelined transaction (BEGIN, a statement per kind, COMMIT) took
five statements for a chain's step, six for a submit. Other batches (deletes of
documents, a key written twice, sends to several queues, a delete of messages of a
queue sent to: one snapshot would not see the rows inserted beside it) keep the
transaction.

The statement's text depends only on which parts a batch has (cached: at most a few
dozen, each prepared once per connection).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dagq.errors import DagqError
from dagq.stores.base import AckOp, BatchOp, FenceOp, PutOp, SendOp, UpsertOp
from dagq.stores.common import conflict, new_token
from dagq.stores.postgres_arrays import bytea_array, float8_array, text_array
from dagq.stores.postgres_index import row_args
from dagq.stores.postgres_leases import fence_lost
from dagq.stores.postgres_queues import ACKED, send_args, send_parts

_HELD = """
held AS (SELECT 1 FROM {s}.leases WHERE name = %(lease)s AND token = %(token)s FOR SHARE)"""
_SWAPS = """
v AS (
    SELECT * FROM unnest(%(s_keys)b::text[], %(s_data)b::bytea[], %(s_etags)b::text[],
        %(s_match)b::text[], %(s_guards)b::text[]) AS v (key, data, etag, if_match, guard)
), swapped AS (
    UPDATE {s}.documents d SET data = v.data, etag = v.etag
    FROM v WHERE d.key = v.key AND d.etag = v.if_match
    RETURNING d.key
)"""
_CREATES = """
cv AS (
    SELECT * FROM unnest(%(c_keys)b::text[], %(c_data)b::bytea[], %(c_etags)b::text[],
        %(c_guards)b::text[]) AS cv (key, data, etag, guard)
), created AS (
    INSERT INTO {s}.documents (key, data, etag) SELECT key, data, etag FROM cv
    ON CONFLICT (key) DO NOTHING
    RETURNING key
)"""
_REPLACES = """
replaced AS (
    INSERT INTO {s}.documents (key, data, etag)
    SELECT * FROM unnest(%(r_keys)b::text[], %(r_data)b::bytea[], %(r_etags)b::text[])
    ON CONFLICT (key) DO UPDATE SET data = excluded.data, etag = excluded.etag
)"""
_INDEXED = """
indexed AS (
    INSERT INTO {s}.index_rows (id, name, status, tenant, created_at, updated_at, row)
    SELECT * FROM unnest(%(i_id)b::text[], %(i_name)b::text[], %(i_status)b::text[],
        %(i_tenant)b::text[], %(i_created)b::float8[], %(i_updated)b::float8[],
        %(i_row)b::bytea[])
    ON CONFLICT (id) DO UPDATE SET name = excluded.name, status = excluded.status,
        tenant = excluded.tenant, created_at = excluded.created_at,
        updated_at = excluded.updated_at, row = excluded.row
)"""
_INDEX_COLUMNS = ("i_id", "i_name", "i_status", "i_tenant", "i_created", "i_updated", "i_row")


@dataclass
class Plan:
    """One batch as the parameters of its statement, and what to report back."""

    parts: frozenset[str]
    args: dict[str, Any] = field(default_factory=dict)
    #: The new etag of each write, in the batch's order.
    etags: list[str] = field(default_factory=list)
    #: The error each guard stands for.
    failures: dict[str, DagqError] = field(default_factory=dict)
    ack: AckOp | None = None
    queue: str | None = None


def plan(ops: Sequence[BatchOp], now: float, schema: str, changes: str | None) -> Plan | None:
    """``ops`` as one statement's parameters; None for a batch the statement cannot
    take (it goes as a transaction). ``changes``: the payload announcing what the batch
    changed, if anything (on the store's changes channel, ``args["channel"]``)."""
    if not _fits(ops):
        return None
    found = Plan(frozenset())
    parts = _writes(found, ops)
    args = found.args
    rows = [op.row for op in ops if isinstance(op, UpsertOp)]
    if rows:
        parts.add("index")
        last = {row.id: row for row in rows}  # one statement may not change a row twice
        ids, names, statuses, tenants, created, updated, encoded = zip(
            *(row_args(row) for row in last.values()), strict=True
        )
        args.update(
            i_id=text_array(ids),
            i_name=text_array(names),
            i_status=text_array(statuses),
            i_tenant=text_array(tenants),
            i_created=float8_array(created),
            i_updated=float8_array(updated),
            i_row=bytea_array(encoded),
        )
    sends = [op for op in ops if isinstance(op, SendOp)]
    if sends:
        parts.add("send")
        messages = [m for op in sends for m in op.messages]
        found.queue = sends[0].queue
        args.update(send_args(SendOp(found.queue, messages), now, schema))
        if args["hand"]:
            parts.add("hand")
    for op in ops:
        if isinstance(op, AckOp):
            parts.add("ack")
            found.ack = op
            args["acked"], args["receipts"] = op.queue, text_array(op.receipts)
    if changes is not None:
        parts.add("changes")
        args["also"] = changes
    found.parts = frozenset(parts)
    return found


def _fits(ops: Sequence[BatchOp]) -> bool:
    """Whether one statement can take ``ops``: at most one fence, writes of different
    keys, sends to one queue, at most one delete of received messages (of another
    queue), index rows."""
    fences = sum(isinstance(op, FenceOp) for op in ops)
    puts = [op for op in ops if isinstance(op, PutOp)]
    queues = {op.queue for op in ops if isinstance(op, SendOp)}
    acks = [op for op in ops if isinstance(op, AckOp)]
    keys = [op.key for op in puts]
    known = all(isinstance(op, FenceOp | PutOp | SendOp | AckOp | UpsertOp) for op in ops)
    return (
        known
        and fences <= 1
        and len(queues) <= 1
        and len(acks) <= 1
        and len(set(keys)) == len(keys)
        and not (acks and acks[0].queue in queues)
    )


def _writes(found: Plan, ops: Sequence[BatchOp]) -> set[str]:
    """The fence's and the documents' parameters of ``ops`` into ``found``; the parts
    they need."""
    parts: set[str] = set()
    args = found.args
    swaps: list[tuple[PutOp, str, str]] = []
    creates: list[tuple[PutOp, str, str]] = []
    replaces: list[tuple[PutOp, str]] = []
    for n, op in enumerate(ops):
        guard = f"dagq batch operation {n}"
        if isinstance(op, FenceOp):
            parts.add("fence")
            found.failures[guard] = fence_lost(op.name)
            args.update(lease=op.name, token=op.token, fence_guard=guard)
        elif isinstance(op, PutOp):
            found.etags.append(new_token())
            if op.if_none_match:
                found.failures[guard] = conflict(op.key, None)
                creates.append((op, found.etags[-1], guard))
            elif op.if_match is None:
                replaces.append((op, found.etags[-1]))
            else:
                found.failures[guard] = conflict(op.key, op.if_match)
                swaps.append((op, found.etags[-1], guard))
    if swaps:
        parts.add("swap")
        args["s_keys"] = text_array([op.key for op, _, _ in swaps])
        args["s_data"] = bytea_array([op.data for op, _, _ in swaps])
        args["s_etags"] = text_array([etag for _, etag, _ in swaps])
        args["s_match"] = text_array([op.if_match for op, _, _ in swaps])
        args["s_guards"] = text_array([guard for _, _, guard in swaps])
    if creates:
        parts.add("create")
        args["c_keys"] = text_array([op.key for op, _, _ in creates])
        args["c_data"] = bytea_array([op.data for op, _, _ in creates])
        args["c_etags"] = text_array([etag for _, etag, _ in creates])
        args["c_guards"] = text_array([guard for _, _, guard in creates])
    if replaces:
        parts.add("replace")
        args["r_keys"] = text_array([op.key for op, _ in replaces])
        args["r_data"] = bytea_array([op.data for op, _ in replaces])
        args["r_etags"] = text_array([etag for _, etag in replaces])
    return parts


@functools.lru_cache(maxsize=128)
def statement(parts: frozenset[str]) -> str:
    """The statement of a batch with ``parts`` (``{s}`` for the schema): its row starts
    with how many received messages went, when it deletes some."""
    ctes: list[str] = []
    columns: list[str] = []
    if "fence" in parts:  # first: a lost lease is what a batch failing both reports
        ctes.append(_HELD)
        columns.append(
            "CASE WHEN NOT EXISTS (SELECT 1 FROM held) THEN {s}.fail(%(fence_guard)s) END"
        )
    if "swap" in parts:
        ctes.append(_SWAPS)
        columns.append(
            "(SELECT {s}.fail(min(v.guard)) FROM v "
            "WHERE v.key NOT IN (SELECT key FROM swapped) HAVING count(*) > 0)"
        )
    if "create" in parts:
        ctes.append(_CREATES)
        columns.append(
            "(SELECT {s}.fail(min(cv.guard)) FROM cv "
            "WHERE cv.key NOT IN (SELECT key FROM created) HAVING count(*) > 0)"
        )
    if "replace" in parts:
        ctes.append(_REPLACES)
    if "index" in parts:
        ctes.append(_INDEXED)
    if "ack" in parts:
        ctes.append(ACKED)
        columns.insert(0, "(SELECT count(*) FROM acked)")
    if "send" in parts:
        sent, woken, wake = send_parts({"hand": "hand" in parts})
        ctes += [sent, woken]
        columns.append(wake)
    if "changes" in parts:
        columns.append("pg_notify(%(channel)s, %(also)s)")
    head = "WITH" + ",".join(ctes) + "\n" if ctes else ""
    return head + "SELECT " + (", ".join(columns) or "1") + "\n"
