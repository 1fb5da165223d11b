"""The functional core: epochs, shards, fold plans, checks (no services)."""

import itertools
from dataclasses import FrozenInstanceError, fields, replace
from datetime import UTC, datetime, timedelta

import pytest
from counters.core import (
    BIGINT_MAX,
    BIGINT_MIN,
    BUCKETS,
    EMPTY_CHECKPOINT,
    MAX_TOKEN,
    MIN_TOKEN,
    NAMED_MAX,
    Checkpoint,
    Committed,
    Evidence,
    RunningTally,
    Tally,
    bucket_bounds,
    bucket_of,
    check_committed,
    chunks,
    counted_rows_gone,
    epoch_for,
    evaluate_evidence,
    fold_counter,
    fold_recount,
    grown_population,
    high_water,
    lowest_floor,
    needs_closer_look,
    needs_pending,
    next_version,
    pack_state,
    read_floor,
    readers_base,
    shard_bounds,
    shard_of,
    shared_floor,
    split_refused_range,
    spread,
    state_commit,
    table_time,
    to_millis,
    unpack_state,
    whole_bucket,
)

pytestmark = pytest.mark.unit

T0 = datetime(2026, 11, 22, 12, 0)
T0_MS = to_millis(T0)


def ms(minute: float) -> int:
    return T0_MS + int(minute * 60_000)


def row(minute: float, inc: int | None, actor: str = "a", version: int = 1):
    at = ms(minute)
    return (at, (at, actor, version), inc)


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

    def test_table_time_drops_microseconds(self):
        assert table_time(datetime(2026, 1, 1, 0, 0, 0, 999999)).microsecond == 999000


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


class TestFold:
    def test_first_fold_sums_rows_at_or_below_epoch(self):
        rows = [row(0, 5), row(1, 7), row(1.5, 100)]
        fold = fold_counter(("IBM",), EMPTY_CHECKPOINT, rows, ms(1))
        assert fold.commit
        assert (fold.value, fold.folded_rows, fold.folded_sum) == (12, 2, 12)
        assert fold.newer_rows == 1
        assert set(fold.pending) == {rows[0][1], rows[1][1]}
        assert (fold.pending_sum, fold.late_rows) == (12, 0)

    def test_epoch_is_inclusive(self):
        assert fold_counter(("x",), EMPTY_CHECKPOINT, [row(1, 3)], ms(1)).folded_sum == 3

    def test_pending_rows_are_not_counted_twice(self):
        counted = row(0, 5)
        base = Checkpoint(5, T0_MS, "c1", frozenset({counted[1]}), 5)
        fold = fold_counter(("x",), base, [counted, row(1, 2)], ms(1))
        assert fold.value == 7
        assert fold.folded_rows == 1 and fold.counted_present == 1
        assert set(fold.pending) == {counted[1], row(1, 2)[1]}
        assert fold.pending_sum == 7

    def test_counted_rows_still_present_are_committed_again_to_be_verified(self):
        counted = row(0, 5)
        base = Checkpoint(5, T0_MS, "c1", frozenset({counted[1]}), 5)
        fold = fold_counter(("x",), base, [counted], ms(1))
        assert fold.commit and fold.value == 5 and fold.folded_rows == 0

    def test_late_row_is_folded_and_reported(self):
        base = Checkpoint(10, ms(5), "c1")
        late = row(2, 4)  # at or below the compacted epoch, not counted
        fold = fold_counter(("x",), base, [late, row(6, 1)], ms(6))
        assert fold.value == 15
        assert (fold.late_rows, fold.late_sum) == (1, 4)
        assert fold.max_lateness_ms == 3 * 60_000

    def test_older_epoch_never_moves_the_counter_back(self):
        base = Checkpoint(10, ms(5), "c1")
        fold = fold_counter(("x",), base, [row(3, 2)], ms(1))
        assert fold.epoch_ms == ms(5)
        assert fold.value == 12 and fold.late_rows == 1

    def test_null_increment_refuses_the_counter(self):
        fold = fold_counter(("x",), EMPTY_CHECKPOINT, [row(0, None), row(0.5, 2)], ms(60))
        assert fold.refused and not fold.commit
        assert fold.bad_rows == (row(0, None)[1],)

    def test_overflow_refuses_the_counter(self):
        base = Checkpoint(BIGINT_MAX - 1, T0_MS, "c1")
        fold = fold_counter(("x",), base, [row(1, 5)], ms(2))
        assert fold.overflow and fold.refused and not fold.commit

    def test_a_folded_sum_past_a_bigint_refuses_the_counter_though_its_value_fits(self):
        half = BIGINT_MAX // 2 + 3
        base = Checkpoint(-10, T0_MS, "c1")
        fold = fold_counter(("x",), base, [row(1, half), row(1.5, half, "b")], ms(2))
        assert BIGINT_MIN <= fold.value <= BIGINT_MAX
        assert fold.folded_sum > BIGINT_MAX and fold.pending_sum > BIGINT_MAX
        assert fold.overflow and fold.refused and not fold.commit

    def test_negative_increments_are_summed(self):
        fold = fold_counter(("x",), EMPTY_CHECKPOINT, [row(0, 5), row(0.5, -7, "b")], ms(60))
        assert fold.value == -2

    def test_backlog_is_capped_and_the_counters_epoch_stops_at_the_last_row_that_fits(self):
        rows = [row(i, 1, version=i) for i in range(10)]
        fold = fold_counter(("x",), EMPTY_CHECKPOINT, rows, ms(20), max_rows=4)
        assert fold.capped and fold.epoch_ms == ms(3)
        assert (fold.value, len(fold.pending), fold.newer_rows) == (4, 4, 6)
        again = fold_counter(
            ("x",),
            Checkpoint(fold.value, fold.epoch_ms, "c1", frozenset(fold.pending), 4),
            rows[4:],
            ms(20),
            max_rows=4,
        )
        assert again.value == 8 and again.late_rows == 0

    def test_keys_of_counted_rows_are_needed_only_for_rows_at_or_below_the_epoch(self):
        unloaded = Checkpoint(5, ms(5), "c1", pending_rows=1, pending_loaded=False)
        assert not needs_pending(unloaded, [row(6, 1)])  # after the epoch: never counted yet
        assert needs_pending(unloaded, [row(6, 1), row(5, 5)])
        assert not needs_pending(replace(unloaded, pending_rows=0), [row(5, 5)])
        fold = fold_counter(("x",), unloaded, [row(6, 1)], ms(7))  # cleaned up: no keys read
        assert (fold.value, fold.late_rows) == (6, 0)
        with pytest.raises(ValueError, match="not loaded"):
            fold_counter(("x",), unloaded, [row(5, 5)], ms(7))

    def test_unique_member_counts_once(self):
        rows = [(ms(0), (ms(0), "u1"), 1), (ms(1), (ms(1), "u1"), 1), (ms(2), (ms(2), "u2"), 1)]
        fold = fold_counter(("m",), EMPTY_CHECKPOINT, rows, ms(5), member_index=1)
        assert (fold.value, fold.duplicates, len(fold.pending)) == (2, 1, 3)

    def test_rows_counted_before_are_told_apart_by_count_and_sum(self):
        rows = [(ms(0), "a", 2), (ms(1), "b", 3), (ms(2), "c", 4)]
        base = Checkpoint(5, ms(1), "c0", frozenset({"a", "b"}))
        fold = fold_counter(("x",), base, rows, ms(3))
        assert (fold.counted_present, fold.counted_sum) == (2, 5)
        assert (fold.pending_sum - fold.counted_sum, fold.folded_sum, fold.value) == (4, 4, 9)

    def test_a_rows_recount_counts_the_rows_that_exist(self):
        """The value becomes the recount: deleted rows leave it, late rows join it, and the
        fold commits even when only deletions changed it (all rows of a counter gone)."""
        base = Checkpoint(5, ms(5), "c0")
        gone = fold_recount(("x",), base, 0, 0, ms(10))
        assert (gone.value, gone.gone_rows, gone.late_rows, gone.commit) == (0, 5, 0, True)
        assert gone.base.value + gone.folded_sum == gone.value  # conservation holds
        mixed = fold_recount(("x",), base, 1, 4 + 1, ms(10))  # 2 deleted, 1 late, 1 new
        assert (mixed.value, mixed.gone_rows, mixed.late_rows, mixed.folded_rows) == (5, 1, 0, 1)
        late = fold_recount(("x",), base, 1, 7, ms(10))  # 1 late, 1 new
        assert (late.value, late.gone_rows, late.late_rows, late.folded_rows) == (7, 0, 1, 2)
        running = RunningTally()
        for fold in (gone, mixed, late):
            running.add_fold(fold)
        tally = running.tally()
        assert (tally.rows_gone, tally.late_rows) == (6, 1)
        assert tally.merge(Tally(rows_gone=1)).rows_gone == 7

    def test_a_rows_checkpoint_past_the_sweep_epoch_is_not_recounted(self):
        """A reset point after the sweep's epoch: the recount would not reach it, and its
        shortfall is no deletion."""
        fold = fold_recount(("x",), Checkpoint(3, ms(20), "c0"), 0, 1, ms(10))
        assert (fold.value, fold.gone_rows, fold.commit) == (3, 0, False)


class TestTally:
    def test_a_running_tally_counts_what_a_tally_holds_and_freezes_to_it(self):
        """A step counts into a ``RunningTally`` and takes its ``Tally`` once: the two have
        the same fields, the tally is frozen, and counting on does not change a tally taken."""
        assert [f.name for f in fields(RunningTally)] == [f.name for f in fields(Tally)]
        running = RunningTally()
        committed = fold_counter(("x",), Checkpoint(1, ms(1), "c0"), [(ms(2), ("k",), 5)], ms(3))
        running.add_fold(committed)
        running.add_quarantined(("q",), rows_left=4)
        running.add_windowed([("w",)])
        running.rows_read += 3
        tally = running.tally()
        assert tally == Tally(
            rows_read=3,
            counters_seen=1,
            counters_committed=1,
            counters_quarantined=1,
            rows_folded=1,
            sum_folded=5,
            windowed_reads=1,
            rows_left=4,
            quarantined=("q",),
            windowed_counters=("w",),
        )
        running.add_quarantined(("r",))
        assert tally.quarantined == ("q",) and running.tally().quarantined == ("q", "r")
        with pytest.raises(FrozenInstanceError):
            tally.rows_read = 4  # type: ignore[misc]
        assert (tally + tally).sum_folded == 10 and (tally + tally).quarantined == ("q", "q")

    def test_a_merged_tally_names_at_most_twenty_counters(self):
        many = Tally(quarantined=tuple(str(i) for i in range(NAMED_MAX)), counters_quarantined=20)
        merged = many.merge(Tally(quarantined=("late",), counters_quarantined=1))
        assert merged.counters_quarantined == 21 and len(merged.quarantined) == NAMED_MAX
        assert merged.as_dict()["quarantined"] == list(many.quarantined)  # JSON's form


class TestCommitChecks:
    def record(self, **changes):
        base = dict(
            counter=("x",),
            commit_id="c1",
            base_value=5,
            folded_sum=3,
            value=8,
            epoch_ms=T0_MS,
            pending_rows=2,
            pending_sum=3,
            ledger_commit_id="c1",
            ledger_value=8,
            ledger_epoch_ms=T0_MS,
            copy_commit_id="c1",
            copy_value=8,
            copy_epoch_ms=T0_MS,
            recount_rows=2,
            recount_sum=3,
        )
        base.update(changes)
        return Committed(**base)

    def test_all_pass(self):
        assert check_committed(self.record()) is None

    def test_tampered_copy_names_counter_and_amounts(self):
        problem = check_committed(self.record(copy_value=9))
        assert problem == "x: compact value 9 (expected 8 = 5 + 3)"

    def test_superseded_commit_is_left_to_the_later_one(self):
        assert check_committed(self.record(ledger_commit_id="c2", ledger_value=100)) is None

    def test_recount_short_of_the_counted_rows_fails(self):
        assert "recount" in check_committed(self.record(recount_rows=1, recount_sum=1))

    def test_recount_with_another_sum_fails(self):
        assert "recount" in check_committed(self.record(recount_sum=4))

    def test_more_rows_present_asks_for_a_closer_look(self):
        record = self.record(recount_rows=3, recount_sum=10)
        assert check_committed(record) is None and needs_closer_look(record)

    def test_only_a_short_recount_of_a_sound_commit_may_be_rows_counted_before(self):
        assert counted_rows_gone(self.record(recount_rows=0, recount_sum=0))
        assert counted_rows_gone(self.record(recount_sum=4))
        assert not counted_rows_gone(self.record())
        assert not counted_rows_gone(self.record(recount_rows=0, recount_sum=0, copy_value=9))
        assert not counted_rows_gone(self.record(recount_rows=0, ledger_value=9))
        assert not counted_rows_gone(self.record(recount_rows=3, recount_sum=10))

    def test_ledger_value_other_than_before_plus_folded_fails(self):
        assert "ledger value 9" in check_committed(self.record(ledger_value=9))


class TestEvidence:
    def evidence(self, **changes):
        base = dict(
            shard=0,
            bucket=1,
            counters=2,
            rows_folded=4,
            sum_folded=10,
            value_delta=10,
            pending_rows=4,
            pending_sum=10,
            recount_rows=4,
            recount_sum=10,
            late_arrivals=0,
            quarantined=0,
        )
        base.update(changes)
        return Evidence(**base)

    def test_all_pass(self):
        assert all(o.success for o in evaluate_evidence([self.evidence()]))

    def test_value_change_other_than_folded_fails_and_names_the_bucket(self):
        outcomes = {o.name: o for o in evaluate_evidence([self.evidence(value_delta=11)])}
        assert not outcomes["value_change_equals_folded_sum"].success
        assert outcomes["value_change_equals_folded_sum"].counters == ("shard 0 bucket 1",)
        assert not outcomes["family_total_conserved"].success

    def test_recount_difference_fails(self):
        outcomes = {o.name: o for o in evaluate_evidence([self.evidence(recount_sum=9)])}
        assert not outcomes["recount_equals_counted_rows"].success


class TestBuckets:
    @pytest.mark.parametrize("shards", [1, 2, 4])
    def test_bucket_bounds_agree_with_bucket_of(self, shards):
        for shard in range(shards):
            for bucket in range(BUCKETS):
                low, high = bucket_bounds(shards, shard, bucket)
                for token in (low + 1, high, (low + high) // 2):
                    assert bucket_of(token, shards) == (shard, bucket)

    def test_versions_grow_even_when_the_clock_does_not(self):
        assert next_version(100, None) == 100
        assert next_version(100, 100) == 101
        assert next_version(100, 500) == 501

    def test_spread_keeps_every_group_under_both_limits_in_order(self):
        items = [(1, 10, "a"), (1, 10, "b"), (3, 5, "c"), (1, 30, "d"), (1, 1, "e")]
        assert spread(items, most_rows=4, most_bytes=25) == [
            (20, ["a", "b"]),  # c's rows would make 5
            (5, ["c"]),  # d's bytes would make 35
            (30, ["d"]),  # over the bytes alone: a group of its own
            (1, ["e"]),
        ]
        assert spread([(600, 1, "x"), (1, 1, "y")], most_rows=500, most_bytes=100) == [
            (1, ["x"]),
            (1, ["y"]),
        ]
        assert spread([], most_rows=1, most_bytes=1) == []

    def test_chunks(self):
        assert chunks([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]
        with pytest.raises(ValueError, match="chunk size"):
            chunks([1], 0)


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


def test_a_refused_range_is_read_around_known_partitions_then_in_halves():
    # around the known tokens 10 and 20 (their partitions left out), the rest kept
    assert split_refused_range(0, 100, [20, 10, 500]) == [(0, 9), (10, 19), (20, 100)]
    assert split_refused_range(0, 100, [100]) == [(0, 99)]
    assert split_refused_range(0, 100, [1]) == [(1, 100)]  # (0, 0] is empty: dropped
    # no known partition inside: halves that cover the range exactly
    assert split_refused_range(-7, 8, [50]) == [(-7, 0), (0, 8)]
    with pytest.raises(ValueError, match="token 5 cannot be read"):
        split_refused_range(4, 5, [])


def test_a_bucket_is_read_whole_once_its_touched_counters_are_a_quarter_of_it():
    assert whole_bucket(25, 100) and whole_bucket(40, 0)
    assert not whole_bucket(24, 100)
    assert not whole_bucket(10_000, None)  # unknown: a ledger from before the count


def test_the_population_grows_by_the_counters_new_to_the_bucket():
    known = Checkpoint(5, 1_000, "c1", frozenset(), 0, 1)
    folds = [
        fold_counter(("a",), EMPTY_CHECKPOINT, [(500, "k1", 2)], 2_000),
        fold_counter(("b",), known, [(1_500, "k2", 3)], 2_000),
        # a compact row from before the ledger: counted with the compact rows already
        fold_counter(("c",), Checkpoint(7, 900), [(1_600, "k3", 1)], 2_000),
    ]
    assert grown_population(10, folds) == 11
    assert grown_population(10, []) == 10
    assert grown_population(None, folds) is None


def test_a_fold_knows_its_earliest_counted_row():
    base = Checkpoint(10, ms(5), "c1", frozenset({(ms(4), "a", 1)}), 3, 1)
    rows = [row(4, 3), row(6, 1), row(2, 5, "late"), row(9, 7)]  # counted, new, late, newer
    fold = fold_counter(("x",), base, rows, ms(8))
    assert fold.low_ms == ms(2)  # the late row: below the base's epoch and its counted row
    assert fold_counter(("x",), base, [row(6, 1), row(7, 1)], ms(8)).low_ms == ms(6)
    assert fold_counter(("x",), base, [row(9, 1)], ms(8)).low_ms is None  # nothing to count


def test_a_bucket_is_recounted_above_the_floor_its_counters_share():
    e = ms(60)
    steady = {(f"c{i}",): e for i in range(20)}
    assert shared_floor(steady) == (e, list(steady), [])
    # a floor a few minutes lower joins the shared read (it lowers the floor for all) ...
    near = {**steady, ("near",): ms(55)}
    assert shared_floor(near) == (ms(55), list(near), [])
    # ... one far below it, or an unknown one, is recounted by name
    far = {**steady, ("far",): ms(5), ("unknown",): None}
    floor, inside, outside = shared_floor(far)
    assert (floor, inside, outside) == (e, list(steady), [("far",), ("unknown",)])
    assert lowest_floor(far[c] for c in [("far",)]) == ms(5)
    assert lowest_floor(far[c] for c in outside) is None  # any unknown: the whole partition
    assert shared_floor({("a",): None}) == (None, [], [("a",)])


def test_a_marked_counter_is_read_down_to_its_counted_rows_and_announced_minutes():
    cp = Checkpoint(10, ms(60), "c1", frozenset(), 30, 1, pending_rows=3, low_ms=ms(59.5))
    assert read_floor(cp, ms(61)) == ms(59.5) - 1  # its counted rows reach below the epoch
    assert read_floor(replace(cp, pending_rows=0), ms(61)) == ms(60)  # nothing counted: epoch
    assert read_floor(cp, ms(30)) == ms(30) - 1  # a writer announced a row half an hour back
    # unknown, so read whole: never folded, a commit without low_ms, a mark without minutes
    assert read_floor(None, ms(61)) is None
    assert read_floor(EMPTY_CHECKPOINT, ms(61)) is None
    assert read_floor(replace(cp, low_ms=None), ms(61)) is None
    assert read_floor(cp, None) is None


@pytest.mark.parametrize("low_ms", [None, 1_700_000_000_123])
@pytest.mark.parametrize("pending_rows", [0, 9])
@pytest.mark.parametrize("high_ms", [None, 1_700_000_060_000])
def test_a_checkpoint_packed_into_one_cell_reads_back_whole(low_ms, pending_rows, high_ms):
    import uuid

    commit = uuid.uuid1()
    state = pack_state(
        commit.bytes,
        -(2**63) + 1,
        1_700_000_000_000,
        2**63 - 1,
        pending_rows,
        low_ms,
        5,
        -7,
        1_700_000_000_000_001,
        1_700_000_000_000,
        "scheduled__2026-11-25T10:00:00+00:00",
        high_ms,
    )
    assert state[0] == (1 if high_ms is None else 2)  # format 2 only while a backlog drains
    assert state_commit(state) == commit.bytes
    assert unpack_state(state, commit) == Checkpoint(
        value=-(2**63) + 1,
        epoch_ms=1_700_000_000_000,
        commit_id=commit,
        pending_sum=2**63 - 1,
        version=1_700_000_000_000_001,
        run_id="scheduled__2026-11-25T10:00:00+00:00",
        pending_rows=pending_rows,
        low_ms=low_ms,
        pending_loaded=not pending_rows,  # the keys are in the run log
        high_ms=high_ms,
    )


def test_a_state_cell_of_no_known_format_names_no_commit():
    state = pack_state(b"c" * 16, 1, 2, 3, 4, None, 5, 6, 7, 8, "r")
    assert state_commit(None) is None
    assert state_commit(state[:20]) is None  # cut short
    assert state_commit(b"\x03" + state[1:]) is None  # a later format
    assert state_commit(b"\x02" + state[1:]) is None  # format 2 without its high_ms


def test_a_commit_keeps_the_highest_epoch_while_its_counter_drains_below_it():
    """``high_water``: what a reset point is checked against once an epoch was lowered."""
    base = Checkpoint(epoch_ms=120_000)
    assert high_water(base, 180_000) is None  # forward: nothing above
    assert high_water(base, 20_000) == 120_000  # lowered below an epoch folded to
    drained = Checkpoint(epoch_ms=20_000, high_ms=120_000)
    assert high_water(drained, 60_000) == 120_000  # a later part, still below
    assert high_water(drained, 120_000) is None  # caught up
    assert high_water(Checkpoint(), 60_000) is None  # a first commit


class TestReadersBase:
    """``readers_base``: a fold may commit only if it builds on what readers' copy held."""

    base = Checkpoint(100, 60_000, "c1", version=10)

    def fold(self, base: Checkpoint = base, **changes):
        rows = [(90_000, (90_000, "w", 1), 7)]
        return replace(fold_counter(("X",), base, rows, 120_000), **changes)

    def test_a_fold_on_the_copy_readers_have_passes_and_names_it(self):
        assert readers_base(self.fold(), 100, 60_000, "c1", False) == (100, None)

    def test_a_fold_from_zero_under_a_copy_is_refused(self):
        before, problem = readers_base(self.fold(EMPTY_CHECKPOINT), 100, 60_000, "c1", False)
        assert before == 100 and "holds value 100 of commit c1" in problem

    def test_a_wrong_value_on_the_right_commit_is_refused(self):
        wrong = replace(self.base, value=0)
        _before, problem = readers_base(self.fold(wrong), 100, 60_000, "c1", False)
        assert "holds value 100" in problem and "starts from 0" in problem

    def test_a_new_value_that_is_not_before_plus_the_rows_is_refused(self):
        _before, problem = readers_base(self.fold(value=108), 100, 60_000, "c1", False)
        assert "is not what readers had (100) plus the rows counted (7)" in problem

    def test_a_base_without_a_copy_is_refused_unless_it_restores_it(self):
        assert readers_base(self.fold(EMPTY_CHECKPOINT), None, None, None, False) == (0, None)
        assert (
            "readers have no compact row" in readers_base(self.fold(), None, None, None, False)[1]
        )
        assert readers_base(self.fold(restore=True), None, None, None, False) == (100, None)

    def test_a_copy_behind_the_ledger_takes_the_ledger_but_not_one_ahead(self):
        assert readers_base(self.fold(), 90, 0, "c0", True) == (100, None)
        assert (
            "fold starts from value 100 of commit c1"
            in readers_base(self.fold(), 90, 0, "c0", False)[1]
        )


def test_a_restored_copy_is_versioned_after_the_ledger_and_the_changed_copy_not_the_clock():
    from counters.core import Checkpoint, restored_version, versioned_by_copy

    assert restored_version(100, 250, now_micros=10**12) == 251  # a clock ahead is not used
    assert restored_version(300, 250, now_micros=5) == 301  # nor one behind
    assert restored_version(None, None, now_micros=7) == 7  # nothing known: the clock
    committed = Checkpoint(5, 60_000, None, version=100)
    assert versioned_by_copy(committed, 251).version == 251  # the next commit writes after it
    assert versioned_by_copy(committed, 100) is committed
    assert versioned_by_copy(committed, None) is committed


def test_a_quarantine_entry_is_looked_up_in_every_shard_a_reshard_may_have_moved_it_to():
    from counters.core import overlapping_shards, quarantine_shards

    assert list(overlapping_shards(1, 2, 8)) == [4, 5, 6, 7]
    assert list(overlapping_shards(5, 8, 2)) == [1]
    assert list(overlapping_shards(1, 3, 2)) == [0, 1]  # straddles the new boundary
    assert quarantine_shards(1, [2]) == [1]
    assert quarantine_shards(1, [2, 8]) == [0, 1, 4, 5, 6, 7]  # either count numbered the run
    assert quarantine_shards(5, [8, 2]) == [1, 5]  # the run numbered by 8, the entries by 2
    for before, after in [(2, 8), (4, 1), (3, 5), (7, 16)]:
        for token in range(-(2**63) + 1, 2**63 - 1, 2**59 + 12345):
            shard = shard_of(token, before)
            assert shard_of(token, after) in quarantine_shards(shard, [before, after])
