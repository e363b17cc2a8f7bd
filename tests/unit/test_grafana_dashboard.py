"""The Grafana dashboard in docs/grafana queries exactly the metrics dagq exports."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from dagq.observability.metrics import METRICS

pytestmark = pytest.mark.timeout(30)

DASHBOARD = Path(__file__).parents[2] / "docs" / "grafana" / "dagq.json"
#: The series a histogram adds to its name.
_HISTOGRAM_SERIES = ("_bucket", "_sum", "_count")


def expressions(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["expr"]] if isinstance(node.get("expr"), str) else []
        return found + [e for v in node.values() for e in expressions(v)]
    if isinstance(node, list):
        return [e for v in node for e in expressions(v)]
    return []


def exported(name: str) -> str | None:
    """The exported metric a series name belongs to, or None."""
    if name in METRICS:
        return name
    for suffix in _HISTOGRAM_SERIES:
        base = name.removesuffix(suffix)
        if base != name and base in METRICS and base.endswith("_seconds"):
            return base
    return None


def test_every_query_names_only_exported_metrics_and_every_metric_is_shown() -> None:
    queries = expressions(json.loads(DASHBOARD.read_text()))
    assert queries
    used = {m for q in queries for m in re.findall(r"\bdagq_[a-z_]+\b", q)}
    unknown = sorted(n for n in used if exported(n) is None)
    assert unknown == []
    assert sorted(set(METRICS) - {exported(n) for n in used}) == []


def test_histogram_panels_ask_for_exemplars() -> None:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    for panel in panels:
        for target in panel["targets"]:
            if "_bucket" in target["expr"]:
                assert target["exemplar"] is True, panel["title"]
