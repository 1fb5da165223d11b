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


def test_a_family_the_cluster_knows_that_the_yaml_does_not_load_is_unconfigured() -> None:
    """Issue #49 item 4: a family known to the cluster is watched whether the YAML loads it
    or not: a broken entry (its error named, its own alerts kept), a missing one (retire to
    silence it), each only in its own keyspace."""
    from counters.config import Alerts, BrokenEntry
    from counters.health import unconfigured, watched_keyspaces
    from counters.store import KnownFamily

    loaded = [family("a")]
    typo = BrokenEntry("b", "ks", Alerts(webhook_url="http://b"), "field 'freshnes': extra")
    nameless = BrokenEntry(None, "other", None, "families[3]: field 'name': required")
    known = [
        KnownFamily("a", "ks", NOW),
        KnownFamily("a", "elsewhere", NOW),  # another keyspace's family of the same name
        KnownFamily("b", "ks", NOW),
        KnownFamily("c", "ks", None),
        KnownFamily("d", "ks", NOW, NOW, "ops@host"),
    ]
    found = {(u.keyspace, u.name): u for u in unconfigured(known, loaded, [typo], "f.yaml")}
    assert set(found) == {("elsewhere", "a"), ("ks", "b"), ("ks", "c"), ("ks", "d")}
    b = found["ks", "b"]
    assert b.entry is typo and "does not load" in b.problem and "'freshnes'" in b.problem
    assert not b.healthy and b.as_dict()["state"] == "unconfigured"
    c = found["ks", "c"]
    assert c.entry is None and "not in f.yaml" in c.problem and "counterctl retire" in c.problem
    d = found["ks", "d"]
    assert d.healthy and d.retired and "ops@host" in d.retired and d.as_dict()["state"] == "retired"
    # a retired family whose broken entry is back alerts all the same
    retyped = BrokenEntry("d", "ks", None, "field 'lag': bad")
    [again] = [u for u in unconfigured(known[4:], [], [retyped], "f.yaml")]
    assert again.retired is None and not again.healthy
    assert watched_keyspaces(loaded, [typo, nameless]) == ["ks", "other"]
