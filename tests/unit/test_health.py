"""counterctl health's rule: the freshness DAG's, with a family never compacted unhealthy."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from counters.config import Family
from counters.health import family_lag, unhealthy

pytestmark = pytest.mark.unit

NOW = datetime(2026, 11, 22, 10, 0)


def family(name: str) -> Family:
    return Family.model_validate(
        {"name": name, "keyspace": "ks", "raw_table": "r", "compact_table": "c", "lag": "1m"}
    )


def test_expect_fresh_and_late_healthy_stale_and_never_not() -> None:
    limit = timedelta(minutes=10)  # the default freshness
    at = NOW - timedelta(minutes=1)  # now - lag
    fresh = family_lag(family("a"), at - timedelta(minutes=2), NOW)
    late = family_lag(family("b"), at - timedelta(minutes=7), NOW)
    edge = family_lag(family("c"), at - limit, NOW)
    stale = family_lag(family("d"), at - limit - timedelta(seconds=1), NOW)
    never = family_lag(family("e"), None, NOW)
    states = [(lag.state.value, lag.healthy) for lag in (fresh, late, edge, stale, never)]
    assert states == [
        ("fresh", True),
        ("late", True),
        ("late", True),
        ("stale", False),
        ("never", False),
    ]
    assert [lag.family.name for lag in unhealthy([fresh, late, edge, stale, never])] == ["d", "e"]
    assert stale.as_dict()["behind_s"] == 601.0 and stale.as_dict()["limit_s"] == 600.0
    assert "never compacted" in never.line()
