"""The run plan (pure): when a family sweeps, and how families created together spread out."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from counters.compaction import decide_plan, sweep_stagger
from counters.config import Family

pytestmark = pytest.mark.unit

T0 = datetime(2026, 11, 23, 12, 0)


def family(name: str, interval: str = "15m") -> Family:
    return Family.model_validate(
        {"name": name, "keyspace": "k", "raw_table": f"{name}_raw", "compact_table": f"{name}_c",
         "lag": "1m", "sweep_interval": interval}
    )  # fmt: skip


def next_sweep(f: Family, last_sweep: datetime) -> datetime:
    """The first minute after ``last_sweep`` at which a run sweeps."""
    at = last_sweep
    while True:
        at += timedelta(minutes=1)
        plan = decide_plan(f, "r", at - f.lag, None, at, last_sweep, touched=0)
        if plan.sweep:
            return at


def test_a_first_sweep_is_recorded_earlier_by_a_stable_offset_within_the_interval():
    f = family("trades")
    plan = decide_plan(f, "r", T0 - f.lag, None, T0, None, touched=0)
    assert plan.sweep and plan.swept_at == T0 - sweep_stagger(f)
    assert timedelta(0) <= sweep_stagger(f) < f.sweep_interval
    assert sweep_stagger(f) == sweep_stagger(family("trades"))  # not Python's salted hash
    later = decide_plan(f, "r", T0, None, T0 + timedelta(minutes=20), T0, touched=0)
    assert later.sweep and later.swept_at == T0 + timedelta(minutes=20)  # later sweeps: as run


def test_families_created_together_sweep_in_different_minutes_never_later_than_the_interval():
    families = [family(f"orch{i:03d}") for i in range(50)]
    seconds = []
    for f in families:
        first = decide_plan(f, "r", T0 - f.lag, None, T0, None, touched=0)
        second = next_sweep(f, first.swept_at)
        assert T0 < second <= T0 + f.sweep_interval
        seconds.append(second)
    per_minute = {s: seconds.count(s) for s in seconds}
    assert len(per_minute) >= 10 and max(per_minute.values()) <= 10, per_minute
