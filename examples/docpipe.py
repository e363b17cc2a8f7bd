"""Task functions of the document-pipeline example.

Each is an ordinary Python function: it gets its ``args``, the outputs of its
parents as ``inputs`` and, when it asks, a ``ctx`` with its attempt number and
idempotency key. What it returns (JSON-serialisable) is its output.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

from dagq import RetryAfter, TaskContext

KINDS = ("invoice", "contract", "letter")


def extract(count: int, language: str) -> dict[str, Any]:
    """Pretend to pull ``count`` documents out of an upload."""
    time.sleep(0.05)
    docs = []
    for n in range(count):
        digest = hashlib.sha256(f"doc-{n}".encode()).hexdigest()
        docs.append({"id": f"doc-{n:03d}", "kind": KINDS[int(digest, 16) % 3], "pages": 1 + n % 4})
    return {"language": language, "documents": docs}


def classify(inputs: dict[str, Any]) -> dict[str, Any]:
    """Count the documents of each kind; later branches run only when there are some."""
    time.sleep(0.05)
    docs = inputs["extract"]["documents"]
    return {kind + "s": sum(1 for d in docs if d["kind"] == kind) for kind in KINDS}


def ocr_shard(shard: int, shards: int, inputs: dict[str, Any]) -> dict[str, Any]:
    """Read the pages of one shard of the documents (the many parallel steps)."""
    docs = inputs["extract"]["documents"][shard::shards]
    time.sleep(0.02 * len(docs))
    return {"shard": shard, "pages": sum(d["pages"] for d in docs), "docs": len(docs)}


def enrich(inputs: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    """A flaky external service: the first attempt is asked to come back shortly."""
    if ctx.attempt == 1:
        raise RetryAfter(0.2, "enrichment service busy")
    return {"entities": 3 * inputs["classify"]["invoices"], "attempt": ctx.attempt}


def process_invoices(inputs: dict[str, Any]) -> dict[str, Any]:
    """Only runs when classify found invoices."""
    time.sleep(0.05)
    return {"booked": inputs["classify"]["invoices"]}


def review_contracts(inputs: dict[str, Any]) -> dict[str, Any]:
    """Only runs when classify found more contracts than a person can skim."""
    return {"flagged": inputs["classify"]["contracts"]}


def report(inputs: dict[str, Any]) -> dict[str, Any]:
    """Join everything that ran into one summary."""
    pages = sum(v["pages"] for k, v in inputs.items() if k.startswith("ocr-"))
    return {
        "pages": pages,
        "invoices_booked": (inputs.get("invoices") or {}).get("booked", 0),
        "contracts_flagged": (inputs.get("contracts") or {}).get("flagged", 0),
        "entities": inputs["enrich"]["entities"],
    }
