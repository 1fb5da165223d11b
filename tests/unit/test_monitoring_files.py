"""The Prometheus mapping, the alert rules and the Grafana dashboard in docs/monitoring match
what the code sends: every metric has a mapping whose labels are its tags, the dashboard and
the rules query only mapped metrics, and the staleness alert cannot freeze with the scheduler."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import yaml
from counters.metrics import OUTCOMES, Metric, family_metrics, run_metrics

pytestmark = pytest.mark.unit

MONITORING = Path(__file__).resolve().parents[2] / "docs" / "monitoring"
NOW = datetime(2026, 11, 22, 10, 0)


def sent() -> list[Metric]:
    """Every metric the code sends, by default (no legacy names), for every outcome."""
    metrics = []
    for outcome in (*OUTCOMES, "dry-run"):
        record = {
            "family": "trades_2",
            "outcome": outcome,
            "started_at": NOW - timedelta(seconds=3),
            "epoch_after": NOW - timedelta(minutes=1),
        }
        metrics += run_metrics(record, NOW, quarantined=1, stale_after=timedelta(minutes=11))
    metrics += family_metrics(
        "trades_2", NOW, NOW, stale_after=timedelta(minutes=2), clock_offset=0.25
    )
    return metrics


def mappings() -> list[dict]:
    return yaml.safe_load((MONITORING / "statsd_exporter.yml").read_text())["mappings"]


def mapped(name: str, mappings: list[dict]) -> dict | None:
    """statsd_exporter's glob match (``*`` is one dotted component); tags become labels."""
    for mapping in mappings:
        pattern = "^" + re.escape(mapping["match"]).replace(r"\*", r"([^.]+)") + "$"
        if re.match(pattern, name):
            return mapping
    return None


def promql_metrics(expr: str) -> set[str]:
    return set(re.findall(r"\b(counters_[a-z_]+)\b", expr))


def test_expect_every_metric_sent_mapped_with_one_label_set_per_prometheus_name() -> None:
    labels: dict[str, set[frozenset[str]]] = {}
    outcomes = set()
    for metric in sent():
        mapping = mapped(f"airflow.{metric.name}", mappings())
        assert mapping is not None, f"airflow.{metric.name} has no mapping"
        assert not mapping.get("labels"), "names carry no data: labels come from the tags"
        assert metric.tags["family"] == "trades_2", metric
        labels.setdefault(mapping["name"], set()).add(frozenset(metric.tags))
        outcomes.add(metric.tags.get("outcome"))
    # statsd_exporter drops a sample whose label names differ from the metric's first one
    assert all(len(sets) == 1 for sets in labels.values()), labels
    assert outcomes - {None} == {*OUTCOMES}


def test_expect_the_dashboard_to_query_only_mapped_metrics() -> None:
    names = {m["name"] for m in mappings()}
    histograms = {m["name"] for m in mappings() if m.get("observer_type") == "histogram"}
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = set()
    for expr in exprs:
        for metric in promql_metrics(expr):
            base = metric.removesuffix("_bucket")
            assert base in names, f"{metric} in {expr!r} is not a mapped metric"
            if metric != base:
                assert base in histograms, metric
            used.add(base)
    assert used == names, f"metrics without a panel: {sorted(names - used)}"


def test_expect_alerts_on_the_epoch_timestamp_and_on_its_absence_never_on_the_lag() -> None:
    """The lag gauge freezes at its last small value when the scheduler dies (the exporter's
    ttl 0 keeps it): an alert on it never fires. ``time() -`` the epoch keeps growing."""
    names = {m["name"] for m in mappings()}
    rules = yaml.safe_load((MONITORING / "prometheus-rules.yml").read_text())
    exprs = {r["alert"]: " ".join(r["expr"].split()) for g in rules["groups"] for r in g["rules"]}
    for alert, expr in exprs.items():
        assert promql_metrics(expr) <= names, f"{alert}: {expr!r} names an unmapped metric"
        assert "counters_lag_seconds" not in expr, f"{alert} alerts on the lag, which freezes"
    stale = exprs["CountersFamilyStale"]
    assert stale.startswith("time() - max by (family) (counters_compacted_epoch_seconds)")
    assert "> on (family) max by (family) (counters_stale_after_seconds)" in stale
    assert "absent(counters_compacted_epoch_seconds)" in exprs.values()
