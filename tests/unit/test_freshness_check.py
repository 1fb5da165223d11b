"""The freshness check's verdict (pure): which families are stale, fresh, never compacted or
unreadable, and the failure that names them."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timedelta

import pytest
from counters.airflow.tasks import FreshnessSummary, FreshnessVerdict, stale_message
from counters.config import Family
from counters.core.codec import decode, encode
from counters.health import family_lag

pytestmark = pytest.mark.unit

NOW = datetime(2026, 11, 22, 10, 0)
AT = NOW - timedelta(minutes=1)  # now - lag


def family(name: str) -> Family:
    return Family.model_validate(
        {"name": name, "keyspace": "ks", "raw_table": "r", "compact_table": "c", "lag": "1m"}
    )


def test_verdict_names_each_stale_and_unreadable_family_and_keeps_every_family() -> None:
    lags = (
        family_lag(family("a"), AT - timedelta(minutes=2), NOW),
        family_lag(family("b"), AT - timedelta(minutes=7), NOW),  # late: still healthy
        family_lag(family("c"), AT - timedelta(minutes=11), NOW),
        family_lag(family("d"), None, NOW),
        replace(family_lag(family("e"), None, NOW), problem="OperationTimedOut: boom"),
        family_lag(family("f"), AT - timedelta(hours=2), NOW),
    )
    verdict = FreshnessVerdict(lags, NOW)

    assert verdict.stale == ["c", "f"]
    assert verdict.fresh == ["a", "b"]
    assert verdict.never_compacted == ["d"]
    assert verdict.unreadable == {"e": "OperationTimedOut: boom"}
    summary = verdict.summary()
    assert set(summary.families) == {"a", "b", "c", "d", "e", "f"}
    assert summary.families["c"].behind_s == 660.0
    assert decode(FreshnessSummary, json.loads(json.dumps(encode(summary)))) == summary
    assert verdict.failure() == (
        "6 families checked, 2 stale: c, f; 1 unreadable: e (OperationTimedOut: boom)"
    )


def test_no_failure_when_every_family_is_fresh_or_never_compacted() -> None:
    lags = (
        family_lag(family("a"), AT, NOW),
        family_lag(family("d"), None, NOW),
    )
    assert FreshnessVerdict(lags, NOW).failure() is None


def test_stale_message_names_family_epoch_lag_and_limit() -> None:
    lag = family_lag(family("trades"), AT - timedelta(minutes=30), NOW)
    message = stale_message(lag, NOW)
    assert message.startswith("family 'trades' is stale: compacted epoch 2026-11-22T09:29:00")
    assert "0:30:00 behind now - lag (2026-11-22T09:59:00.000Z)" in message
    assert "more than its freshness 0:10:00; check the compact_trades DAG" in message


def test_the_xcom_and_health_json_write_every_time_in_the_one_format() -> None:
    """The freshness XCom (``FreshnessSummary`` through the codec; its families' lines are
    what ``counterctl health --json`` prints): every time in it, a retired family's included,
    is ``to_text``'s (UTC, ms, Z)."""
    import re

    from counters.health import unconfigured
    from counters.store import KnownFamily

    retired_at = datetime(2026, 11, 20, 8, 30, 15, 250_000)
    gone = unconfigured([KnownFamily("z", "ks", AT, retired_at, "ops@host")], [], [], "f.yaml")
    broken = unconfigured([KnownFamily("y", "ks", AT)], [], [], "f.yaml")
    lags = (family_lag(family("a"), AT - timedelta(minutes=2, microseconds=7), NOW),)
    verdict = FreshnessVerdict(lags, NOW, unconfigured=(*gone, *broken))
    text = json.dumps([encode(verdict.summary()), [u.as_dict() for u in (*gone, *broken)]])
    times = re.findall(r"\d{4}-\d\d-\d\d[T ][\d:.+Z-]*", text)
    assert times and all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", t) for t in times)
    assert "retired 2026-11-20T08:30:15.250Z by ops@host" in text
    assert encode(verdict.summary())["checked_at"] == "2026-11-22T10:00:00.000Z"  # type: ignore[typeddict-item]
    assert encode(verdict.summary()).keys() >= {"v", "families", "stale", "unalerted"}
