"""The Prometheus mapping and the Grafana dashboard in docs/monitoring match what the code
sends: every metric has a mapping, every dashboard query names a mapped metric."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import yaml
from counters.metrics import OUTCOMES, lag_metrics, run_metrics

pytestmark = pytest.mark.unit

MONITORING = Path(__file__).resolve().parents[2] / "docs" / "monitoring"
NOW = datetime(2026, 11, 22, 10, 0)


def sent_names() -> set[str]:
    """Every name the code sends, as StatsD receives it (Airflow's default prefix)."""
    names = set()
    for outcome in (*OUTCOMES, "dry-run"):
        record = {
            "family": "trades_2",
            "outcome": outcome,
            "started_at": NOW - timedelta(seconds=3),
            "epoch_after": NOW - timedelta(minutes=1),
        }
        names |= {m.name for m in run_metrics(record, 0, NOW)}
    names |= {m.name for m in lag_metrics("trades_2", NOW, NOW)}
    return {f"airflow.{name}" for name in names}


def mapped(name: str, mappings: list[dict]) -> tuple[str, dict[str, str]] | None:
    """statsd_exporter's glob match: ``*`` is one dotted component."""
    for mapping in mappings:
        pattern = "^" + re.escape(mapping["match"]).replace(r"\*", r"([^.]+)") + "$"
        found = re.match(pattern, name)
        if found:
            parts = found.groups()
            labels = {
                k: re.sub(r"\$(\d)", lambda g, parts=parts: parts[int(g.group(1)) - 1], v)
                for k, v in mapping.get("labels", {}).items()
            }
            return mapping["name"], labels
    return None


def test_expect_every_metric_sent_mapped_with_its_family_label() -> None:
    mappings = yaml.safe_load((MONITORING / "statsd_exporter.yml").read_text())["mappings"]
    prometheus = {}
    for name in sorted(sent_names()):
        result = mapped(name, mappings)
        assert result is not None, f"{name} has no mapping in statsd_exporter.yml"
        prometheus[name] = result
        assert result[1]["family"] == "trades_2", (name, result)
    outcomes = {r[1]["outcome"] for n, r in prometheus.items() if ".runs." in n}
    assert outcomes == {*OUTCOMES}


def test_expect_the_dashboard_to_query_only_mapped_metrics() -> None:
    mappings = yaml.safe_load((MONITORING / "statsd_exporter.yml").read_text())["mappings"]
    names = {m["name"] for m in mappings}
    histograms = {m["name"] for m in mappings if m.get("observer_type") == "histogram"}
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = set()
    for expr in exprs:
        for metric in re.findall(r"\b(counters_[a-z_]+)\b", expr):
            base = metric.removesuffix("_bucket")
            assert base in names, f"{metric} in {expr!r} is not a mapped metric"
            if metric != base:
                assert base in histograms, metric
            used.add(base)
    assert used == names, f"metrics without a panel: {sorted(names - used)}"
