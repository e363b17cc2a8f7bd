"""Task functions of the research-digest example (durable patterns together)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from dagq import TaskContext

PUBLISHED = Path(os.environ.get("DIGEST_OUT", ".")) / "published"


def split(documents: int) -> list[dict[str, Any]]:
    """Cut the corpus into chunks; how many is known only now (the foreach list)."""
    return [{"id": f"paper-{n:03d}", "words": 500 + 37 * n} for n in range(documents)]


def summarise(item: dict[str, Any], index: int) -> dict[str, Any]:
    """One instance per chunk: summarise it."""
    time.sleep(0.01)
    return {"id": item["id"], "summary": f"{item['id']}: {item['words'] // 100} key points"}


def reduce(inputs: dict[str, Any]) -> dict[str, Any]:
    """The summaries arrive as one list, in chunk order."""
    summaries = inputs["summarise"]
    return {"draft": [s["summary"] for s in summaries], "quality": 0.5}


def refine(inputs: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    """Each iteration improves the previous draft until the validator is satisfied."""
    previous = ctx.previous or inputs["reduce"]
    quality = round(previous["quality"] + 0.2, 2)
    return {"draft": previous["draft"], "quality": quality, "valid": quality >= 0.9,
            "iteration": ctx.iteration}


def publish(inputs: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    """The side effect: write the digest. Idempotent by key, so a rerun changes nothing."""
    PUBLISHED.mkdir(parents=True, exist_ok=True)
    target = PUBLISHED / f"{ctx.idempotency_key.replace('/', '_')}.json"
    target.write_text(json.dumps({"digest": inputs["refine"]["draft"],
                                  "approved_by": inputs["review"].get("by")}))
    return {"path": str(target)}


def unpublish(inputs: dict[str, Any]) -> None:
    """The compensation of publish: take the digest down again."""
    Path(inputs["publish"]["path"]).unlink(missing_ok=True)


def announce(fail: bool) -> str:
    """The last step; if it fails, the published digest is taken down (the saga)."""
    if fail:
        raise RuntimeError("the mailing list rejected the announcement")
    return "announced"
