"""The run plan (pure): when a family sweeps, and how families deployed together spread out."""

from __future__ import annotations

from datetime import datetime, timedelta
from itertools import pairwise

import pytest
from counters.compaction.plan import decide_plan, sweep_due
from counters.config import Family

pytestmark = pytest.mark.unit

T0 = datetime(2026, 11, 23, 12, 0)


def family(name: str, interval: str = "15m", **extra: str) -> Family:
    return Family.model_validate(
        {"name": name, "keyspace": "k", "raw_table": f"{name}_raw", "compact_table": f"{name}_c",
         "lag": "1m", "sweep_interval": interval, **extra}
    )  # fmt: skip


def sweeps(f: Family, start: datetime, minutes: int) -> list[datetime]:
    """The minutes at which per-minute runs from ``start`` sweep (the first run included)."""
    done: list[datetime] = []
    last = None
    for i in range(minutes):
        at = start + timedelta(minutes=i)
        if decide_plan(f, "r", at - f.lag, None, now=at, last_sweep=last, touched=0).sweep:
            done.append(at)
            last = at
    return done


def test_a_family_sweeps_first_then_once_per_interval_at_its_own_phase():
    f = family("trades")
    # pinned, not compared with this process's own value: the name's CRC-32 modulo the
    # interval, the same in every process (a per-process hash, e.g. Python's hash() of a str,
    # would move every family's sweeps at each restart of the scheduler)
    assert f.sweep_phase == timedelta(seconds=541)
    done = sweeps(f, T0, 120)
    # the first run, then the first run after each 12:09:01 + k * 15 min (T0 is 12:00)
    assert done == [T0 + timedelta(minutes=m) for m in (0, 10, 25, 40, 55, 70, 85, 100, 115)]
    assert all(b - a == f.sweep_interval for a, b in pairwise(done[1:]))
    assert not sweep_due(f, done[1] + timedelta(minutes=1), done[1])


def test_families_deployed_together_sweep_in_different_minutes_never_an_interval_apart():
    firsts, seconds = [], []
    for i in range(50):
        f = family(f"orch{i:03d}")
        done = sweeps(f, T0, 40)
        assert all(b - a <= f.sweep_interval for a, b in pairwise(done))
        firsts.append(done[0])
        seconds.append(done[1])
    assert set(firsts) == {T0}  # every family's first run sweeps
    per_minute = {s: seconds.count(s) for s in seconds}
    assert len(per_minute) >= 10 and max(per_minute.values()) <= 10, per_minute


def test_a_deployment_that_swept_in_lockstep_spreads_out_by_its_next_sweeps():
    """Families whose last sweeps were all in one minute (before phases existed)."""
    seconds = []
    for i in range(50):
        f = family(f"orch{i:03d}")
        last, at = T0, T0
        while not sweep_due(f, at, last):
            at += timedelta(minutes=1)
        assert at - last <= f.sweep_interval
        seconds.append(at)
    assert len(set(seconds)) >= 10


def test_a_sweep_offset_puts_the_sweeps_where_the_user_wants_them():
    """``sweep_interval: 1d`` with ``sweep_offset: 3h``: the first run after 03:00 UTC sweeps."""
    f = family("trades", "1d", sweep_offset="3h")
    assert f.sweep_phase == timedelta(hours=3)
    done = sweeps(f, datetime(2026, 11, 23, 0, 0), 2 * 24 * 60)
    assert done == [datetime(2026, 11, 23, 0, 0), datetime(2026, 11, 23, 3, 0),
                    datetime(2026, 11, 24, 3, 0)]  # fmt: skip


def test_a_family_whose_last_sweep_was_small_sweeps_every_run_in_one_task():
    from counters.compaction.plan import foreign_rows_bound

    f = family("tiny")  # sweep_every_run_below: 10,000 rows and counters by default
    at = T0 + timedelta(minutes=7)
    small = decide_plan(
        f, "r", at - f.lag, None, now=at, last_sweep=T0, touched=3, last_sweep_size=9_999
    )
    assert small.sweep and small.small  # one task does it all
    large = decide_plan(
        f, "r", at - f.lag, None, now=at, last_sweep=T0, touched=3, last_sweep_size=10_000
    )
    assert not large.sweep and large.small
    assert foreign_rows_bound(f, 9_999) == timedelta(minutes=2)  # the lag and one run
    assert foreign_rows_bound(f, 10_000) == timedelta(minutes=17)  # and the sweep interval
    assert foreign_rows_bound(f, None) == timedelta(minutes=17)  # not known yet
    off = family("tiny", sweep_every_run_below="0")
    assert not decide_plan(
        off, "r", at - f.lag, None, now=at, last_sweep=T0, touched=3, last_sweep_size=1
    ).sweep
