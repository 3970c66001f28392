"""The Grafana dashboard is valid JSON and only queries metrics loadshed exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

from loadshed.limiter import Limiter
from loadshed.metrics import LoadshedMetrics

DASHBOARD = Path(__file__).resolve().parent.parent / "dashboards" / "loadshed.json"


def test_dashboard_queries_exported_metrics() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["__inputs"][0]["type"] == "datasource"
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids)) >= 5
    metrics = LoadshedMetrics()
    metrics.track(Limiter(2, name="x"))
    exported: set[str] = set()
    for family in metrics.registry.collect():
        exported.update(sample.name for sample in family.samples)
        exported.add(family.name)
    exported.add("loadshed_malformed_headers_total")
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            for name in re.findall(r"\b(loadshed_[a-z_]+)", target["expr"]):
                assert name in exported, f"panel {panel['title']!r} queries unknown {name}"
