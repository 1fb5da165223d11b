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
from counters.metrics import OUTCOMES, Metric, family_metrics, for_backend, run_metrics

pytestmark = pytest.mark.unit

MONITORING = Path(__file__).resolve().parents[2] / "docs" / "monitoring"
NOW = datetime(2026, 11, 22, 10, 0)


def sent(family: str = "trades_2") -> list[Metric]:
    """Every metric the code sends for ``family``, by default (no legacy names), for every
    outcome."""
    metrics = []
    for outcome in (*OUTCOMES, "dry-run"):
        record = {
            "family": family,
            "outcome": outcome,
            "started_at": NOW - timedelta(seconds=3),
            "epoch_after": NOW - timedelta(minutes=1),
        }
        metrics += run_metrics(record, NOW, quarantined=1, stale_after=timedelta(minutes=11))
    metrics += family_metrics(family, NOW, NOW, stale_after=timedelta(minutes=2), clock_offset=0.25)
    return metrics


def mappings() -> list[dict]:
    return yaml.safe_load((MONITORING / "statsd_exporter.yml").read_text())["mappings"]


def mapped(name: str, mappings: list[dict]) -> tuple[dict, dict[str, str]] | None:
    """statsd_exporter's glob match (``*`` is one dotted component): the mapping and the labels
    it takes from the name (``$1``, ``$2``)."""
    for mapping in mappings:
        pattern = "^" + re.escape(mapping["match"]).replace(r"\*", r"([^.]+)") + "$"
        if match := re.match(pattern, name):
            labels = {
                k: re.sub(r"\$(\d)", lambda d: match[int(d[1])], v)
                for k, v in mapping.get("labels", {}).items()
            }
            return mapping, labels
    return None


def promql_metrics(expr: str) -> set[str]:
    return set(re.findall(r"\b(counters_[a-z_]+)\b", expr))


def series(metrics: list[Metric]) -> dict[str, set[frozenset[tuple[str, str]]]]:
    """Prometheus name -> the label sets (the mapping's and the tags) the exporter makes of
    ``metrics`` as sent (``airflow.`` the statsd prefix)."""
    found: dict[str, set[frozenset[tuple[str, str]]]] = {}
    for metric in metrics:
        hit = mapped(f"airflow.{metric.name}", mappings())
        assert hit is not None, f"airflow.{metric.name} has no mapping"
        mapping, labels = hit
        assert not set(labels) & set(metric.tags), f"{metric}: a label from the name and a tag"
        found.setdefault(mapping["name"], set()).add(frozenset({**labels, **metric.tags}.items()))
    return found


def test_expect_every_metric_sent_mapped_with_one_label_set_per_prometheus_name() -> None:
    """With tags and without (Airflow's default StatsD: the per-family names), the same
    Prometheus names and labels, so one dashboard and one set of rules fit both."""
    tagged = series(sent())
    for metric in sent():
        assert not mapped(f"airflow.{metric.name}", mappings())[1], "labels from tags only"
    untagged = series(for_backend(sent(), tags_reach=False, legacy=False))
    assert tagged == untagged
    label_names = {
        name: {frozenset(k for k, _ in labels) for labels in sets} for name, sets in tagged.items()
    }
    # statsd_exporter drops a sample whose label names differ from the metric's first one
    assert all(len(names) == 1 for names in label_names.values()), label_names
    outcomes = {dict(labels).get("outcome") for sets in tagged.values() for labels in sets}
    assert outcomes - {None} == {*OUTCOMES}
    # two families without tags: two series of each gauge (one, before: the stale alert could
    # not tell them apart)
    two = series(for_backend(sent("trades") + sent("likes"), tags_reach=False, legacy=False))
    epochs = two["counters_compacted_epoch_seconds"]
    assert epochs == {frozenset({("family", "trades")}), frozenset({("family", "likes")})}
    by_name: dict[str, list[dict]] = {}
    for mapping in mappings():  # one help text and one observer per Prometheus name
        by_name.setdefault(mapping["name"], []).append(mapping)
    for name, found in by_name.items():
        kept = {(m["help"], m.get("observer_type"), str(m.get("histogram_options"))) for m in found}
        assert len(kept) == 1, (name, kept)


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
    failing = exprs["CountersRunsFailing"]  # a failed or partial run, per family
    assert 'counters_runs_total{outcome=~"failed|partial"}' in failing
    assert failing.startswith("sum by (family) (increase(")
