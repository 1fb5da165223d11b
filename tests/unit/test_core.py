"""The functional core: epochs, shards, fold plans, checks (no services)."""

import itertools
from datetime import UTC, datetime, timedelta

import pytest
from counters.core import (
    EMPTY_CHECKPOINT,
    MAX_TOKEN,
    MIN_TOKEN,
    Checkpoint,
    CommitRecord,
    RawRow,
    epoch_for,
    evaluate_commit_checks,
    plan_fold,
    shard_bounds,
    shard_of,
    truncate_ms,
)

T0 = datetime(2026, 11, 22, 12, 0)


def row(minute: float, inc: int | None, actor: str = "a", version: int = 1) -> RawRow:
    at = T0 + timedelta(minutes=minute)
    return RawRow((at, actor, version), at, inc)


class TestEpoch:
    def test_truncates_to_minute_then_subtracts_lag(self):
        scheduled = datetime(2026, 11, 22, 12, 0, 42, 123456, tzinfo=UTC)
        assert epoch_for(scheduled, timedelta(minutes=1)) == datetime(2026, 11, 22, 11, 59)
        assert epoch_for(scheduled, timedelta(seconds=90)) == datetime(2026, 11, 22, 11, 58, 30)

    def test_aware_non_utc_is_converted(self):
        from zoneinfo import ZoneInfo

        scheduled = datetime(2026, 11, 22, 13, 0, tzinfo=ZoneInfo("Europe/Paris"))
        assert epoch_for(scheduled, timedelta(minutes=1)) == datetime(2026, 11, 22, 11, 59)

    @pytest.mark.parametrize("lag", [timedelta(0), timedelta(seconds=-5)])
    def test_rejects_non_positive_lag(self, lag):
        with pytest.raises(ValueError, match="lag must be positive"):
            epoch_for(T0, lag)

    def test_truncate_ms_drops_microseconds(self):
        assert truncate_ms(datetime(2026, 1, 1, 0, 0, 0, 999999)).microsecond == 999000


class TestShards:
    @pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 16, 256])
    def test_bounds_cover_ring_without_gaps(self, n):
        bounds = shard_bounds(n)
        assert len(bounds) == n
        assert bounds[0][0] == MIN_TOKEN and bounds[-1][1] == MAX_TOKEN
        for (_, end), (start, _) in itertools.pairwise(bounds):
            assert end == start

    @pytest.mark.parametrize("n", [1, 3, 4, 16])
    def test_shard_of_agrees_with_bounds(self, n):
        bounds = shard_bounds(n)
        probes = [MIN_TOKEN + 1, MAX_TOKEN, 0, -1, 1]
        for lo, hi in bounds:
            probes += [lo + 1, hi, (lo + hi) // 2]
        for token in probes:
            index = shard_of(token, n)
            lo, hi = bounds[index]
            assert lo < token <= hi, (token, index, bounds[index])

    def test_rejects_zero_shards(self):
        with pytest.raises(ValueError, match="shards must be >= 1"):
            shard_bounds(0)


class TestPlanFold:
    def test_first_fold_sums_rows_at_or_below_epoch(self):
        rows = [row(0, 5), row(1, 7), row(1.5, 100)]
        plan = plan_fold(("IBM",), EMPTY_CHECKPOINT, rows, T0 + timedelta(minutes=1))
        assert plan.commit
        assert (plan.value, plan.folded_rows, plan.folded_sum) == (12, 2, 12)
        assert plan.newer_rows == 1
        assert set(plan.pending) == {rows[0].clustering, rows[1].clustering}
        assert plan.late_rows == 0

    def test_epoch_is_inclusive(self):
        plan = plan_fold(("x",), EMPTY_CHECKPOINT, [row(1, 3)], T0 + timedelta(minutes=1))
        assert plan.folded_sum == 3

    def test_pending_rows_are_not_counted_twice(self):
        counted = row(0, 5)
        base = Checkpoint(5, T0, "c1", frozenset({counted.clustering}))
        plan = plan_fold(("x",), base, [counted, row(1, 2)], T0 + timedelta(minutes=1))
        assert plan.value == 7
        assert plan.folded_rows == 1 and plan.counted_present == 1
        assert set(plan.pending) == {counted.clustering, row(1, 2).clustering}

    def test_nothing_new_means_no_commit_but_cleanup(self):
        counted = row(0, 5)
        base = Checkpoint(5, T0, "c1", frozenset({counted.clustering}))
        plan = plan_fold(("x",), base, [counted], T0 + timedelta(minutes=1))
        assert not plan.commit and plan.needs_cleanup

    def test_late_row_is_folded_and_reported(self):
        base = Checkpoint(10, T0 + timedelta(minutes=5), "c1", frozenset())
        late = row(2, 4)  # at or below the compacted epoch, not counted
        plan = plan_fold(("x",), base, [late, row(6, 1)], T0 + timedelta(minutes=6))
        assert plan.value == 15
        assert (plan.late_rows, plan.late_sum) == (1, 4)
        assert plan.max_lateness_ms == 3 * 60_000

    def test_older_epoch_never_moves_the_counter_back(self):
        base = Checkpoint(10, T0 + timedelta(minutes=5), "c1", frozenset())
        plan = plan_fold(("x",), base, [row(3, 2)], T0 + timedelta(minutes=1))
        assert plan.epoch == T0 + timedelta(minutes=5)
        assert plan.value == 12 and plan.late_rows == 1

    def test_null_increment_refuses_the_counter(self):
        plan = plan_fold(("x",), EMPTY_CHECKPOINT, [row(0, None), row(0.5, 2)], T0 + timedelta(1))
        assert plan.refused and not plan.commit
        assert plan.bad_rows == (row(0, None).clustering,)

    def test_negative_increments_are_summed(self):
        plan = plan_fold(
            ("x",), EMPTY_CHECKPOINT, [row(0, 5), row(0.5, -7, "b")], T0 + timedelta(1)
        )
        assert plan.value == -2


class TestChecks:
    def record(self, **changes):
        base = dict(
            counter=("x",),
            commit_id="c1",
            base_value=5,
            folded_sum=3,
            new_value=8,
            new_epoch=T0,
            current_commit_id="c1",
            current_value=8,
            current_epoch=T0,
        )
        base.update(changes)
        return CommitRecord(**base)

    def outcome(self, records, name):
        return next(o for o in evaluate_commit_checks(records) if o.name == name)

    def test_all_pass(self):
        assert all(o.success for o in evaluate_commit_checks([self.record()]))

    def test_tampered_value_names_counter_and_amounts(self):
        result = self.outcome(
            [self.record(current_value=9)], "compact_value_equals_before_plus_folded"
        )
        assert not result.success
        assert "x: compact value 9 (expected 8 = 5 + 3)" in result.counters

    def test_superseded_commit_passes_when_epoch_moved_forward(self):
        rec = self.record(
            current_commit_id="c2", current_value=100, current_epoch=T0 + timedelta(minutes=1)
        )
        assert all(o.success for o in evaluate_commit_checks([rec]))

    def test_superseded_commit_with_older_epoch_fails(self):
        rec = self.record(current_commit_id="c2", current_epoch=T0 - timedelta(minutes=1))
        assert not self.outcome([rec], "epoch_never_regresses").success

    def test_missing_compact_row_fails(self):
        rec = self.record(current_commit_id=None, current_value=None, current_epoch=None)
        assert not self.outcome([rec], "compact_row_present").success


@pytest.mark.parametrize("shards", [1, 2, 3, 4, 7])
def test_finer_shards_nest_inside_shards(shards):
    """The touched index splits each shard into finer ranges; every finer range must lie in
    the shard that owns its tokens."""
    import random

    rng = random.Random(shards)
    probes = [MIN_TOKEN + 1, MAX_TOKEN, 0, -1, 1] + [
        rng.randint(MIN_TOKEN + 1, MAX_TOKEN) for _ in range(2000)
    ]
    for lo, hi in shard_bounds(shards * 16):
        probes += [lo + 1, hi]
    for token in probes:
        assert shard_of(token, shards * 16) // 16 == shard_of(token, shards)
