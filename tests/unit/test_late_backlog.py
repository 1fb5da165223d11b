"""A backlog over one commit's limits, late rows included, folded oldest first over several
folds: pure, with readers' values simulated by the read rule after every fold."""

from __future__ import annotations

import random

import pytest
from counters.core import (
    EMPTY_CHECKPOINT,
    Checkpoint,
    Fold,
    Row,
    cap_rows,
    fold_counter,
    key_bytes,
)
from hypothesis import given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.unit


def row(t: int, inc: int = 1, actor: str = "a", version: int = 0) -> Row:
    return (t, (t, actor, version), inc)


def committed(fold: Fold) -> Checkpoint:
    """The checkpoint a fold becomes (as the engine commits it), its keys loaded."""
    return Checkpoint(
        fold.value,
        fold.epoch_ms,
        f"c{fold.epoch_ms}",
        frozenset(fold.pending),
        fold.pending_sum,
        pending_rows=len(fold.pending),
        low_ms=fold.low_ms,
    )


def read(checkpoint: Checkpoint, present: list[Row]) -> int:
    """The read rule: the copy's value plus every row after its epoch."""
    return checkpoint.value + sum(
        r[2] for r in present if checkpoint.epoch_ms is None or r[0] > checkpoint.epoch_ms
    )


class TestCap:
    def test_an_ordinary_backlog_of_long_keys_is_capped_by_bytes(self):
        rows = [row(t, actor="x" * 1_000) for t in range(100)]
        each = key_bytes(rows[0][1])
        fold = fold_counter(("c",), EMPTY_CHECKPOINT, rows, 500, max_rows=1_000,
                            max_key_bytes=10 * each)  # fmt: skip
        assert fold.capped and (fold.epoch_ms, fold.value, fold.newer_rows) == (9, 10, 90)
        assert not fold.lowered

    def test_a_fold_never_ends_inside_a_millisecond(self):
        rows = [row(t // 3, version=t) for t in range(30)]  # three rows a millisecond
        fold = fold_counter(("c",), EMPTY_CHECKPOINT, rows, 100, max_rows=10)
        assert (fold.epoch_ms, fold.folded_rows) == (2, 9)  # not 10: ms 3 would be split

    def test_a_late_backlog_lowers_the_epoch_to_the_last_rows_that_fit(self):
        base = Checkpoint(7, 1_000, "c1")
        late = [row(t, 2) for t in range(100, 120)]
        newer = [row(1_001, 5)]
        fold = fold_counter(("c",), base, late + newer, 1_060, max_rows=8)
        assert fold.capped and fold.lowered and fold.epoch_ms == 107
        assert (fold.folded_rows, fold.value, fold.newer_rows) == (8, 7 + 16, 13)
        # the readers' value counts every late row from this commit on: reported as late now
        assert (fold.late_rows, fold.late_sum, fold.max_lateness_ms) == (20, 40, 900)
        again = fold_counter(("c",), committed(fold), late[8:] + newer, 1_120, max_rows=8)
        assert (again.epoch_ms, again.late_rows, again.lowered) == (115, 0, False)

    def test_a_counted_row_still_present_after_the_cut_keeps_the_epoch(self):
        """A cleanup that did not finish leaves counted rows; lowering the epoch under them
        would make readers count them again: the epoch stays, the oldest late rows fit."""
        counted = row(900, 3, actor="counted")
        base = Checkpoint(10, 1_000, "c1", frozenset({counted[1]}), 3, pending_rows=1)
        late = [row(t) for t in range(100, 120)]
        fold = fold_counter(("c",), base, [counted, *late], 1_060, max_rows=8)
        assert fold.capped and not fold.lowered and fold.epoch_ms == 1_000
        assert counted[1] in fold.pending and fold.counted_present == 1
        assert (fold.folded_rows, fold.value, fold.late_rows) == (7, 17, 7)

    def test_a_hot_counter_read_by_parts_keeps_its_epoch(self):
        base = Checkpoint(0, 1_000, "c1")
        late = [row(t) for t in range(100, 120)]
        fold = fold_counter(("c",), base, late, 1_060, max_rows=8, lower_epoch=False)
        assert (fold.epoch_ms, fold.folded_rows, fold.lowered) == (1_000, 8, False)

    def test_one_millisecond_over_the_rows_is_folded_whole(self):
        """A bulk import at one time (``add_members`` with one ``at``): over the rows of a fold,
        within half again its bytes, folded whole: a fold never ends inside a millisecond."""
        rows = [row(1_010, version=v) for v in range(20)] + [row(1_011)]
        fold = fold_counter(("c",), Checkpoint(0, 1_000, "c1"), rows, 1_060, max_rows=8)
        assert (fold.epoch_ms, fold.folded_rows, fold.newer_rows) == (1_010, 20, 1)

    def test_one_millisecond_over_the_bytes_refuses_the_counter(self):
        rows = [row(1_010, actor="k" * 100, version=v) for v in range(9)] + [row(1_011)]
        each = key_bytes(rows[0][1])
        for base in (Checkpoint(0, 1_000, "c1"), EMPTY_CHECKPOINT):
            fold = fold_counter(("c",), base, rows, 1_060, max_rows=100, max_key_bytes=5 * each)
            assert fold.refused and not fold.commit and fold.too_large == (1_010, 9)
        within = fold_counter(("c",), EMPTY_CHECKPOINT, rows, 1_060, max_rows=100,
                              max_key_bytes=6 * each)  # fmt: skip
        assert (within.epoch_ms, within.folded_rows) == (1_010, 9)  # 9 <= 6 x 1.5

    def test_late_rows_of_one_millisecond_over_the_limit_are_folded_in_parts(self):
        """Lowering needs a whole millisecond; late rows, counted by key, do not."""
        rows = [row(500, actor="k" * 100, version=v) for v in range(20)]
        each = key_bytes(rows[0][1])
        fold = fold_counter(("c",), Checkpoint(0, 1_000, "c1"), rows, 1_060, max_rows=100,
                            max_key_bytes=5 * each)  # fmt: skip
        assert (fold.epoch_ms, fold.folded_rows, fold.lowered) == (1_000, 5, False)

    def test_rows_within_the_limits_are_not_measured_or_capped(self):
        rows = [row(t, actor="y" * 100) for t in range(40)]
        assert cap_rows(EMPTY_CHECKPOINT, rows, 200_000, 8 * 2**20) is None


class TestDrain:
    @settings(max_examples=100, deadline=None)
    @given(
        seed=st.integers(0, 2**32),
        cap=st.integers(1, 12),
        late=st.integers(0, 60),
        crashes=st.integers(0, 6),
    )
    def test_readers_are_exact_after_every_fold_of_a_capped_late_backlog(
        self, seed, cap, late, crashes
    ):
        """A counter with a late backlog, new rows and late arrivals during the drain, folded
        with ``max_rows=cap`` run after run; some cleanups do not happen (a crash). After every
        fold the read rule gives the sum of every row written before it, never more; the one
        exception: a fold that found counted rows still present (its base's cleanup did not
        run) and more late rows than it carries leaves the late rows it could not fold out of
        readers' values (as every late row was before), until its own cleanup has run."""
        rng = random.Random(seed)
        used: set[int] = set()  # one row a millisecond: never more than a fold of cap=1 carries
        version = iter(range(10**9))

        def at(low: int, high: int) -> int:
            t = rng.choice([t for t in range(low, high + 1) if t not in used])
            used.add(t)
            return t

        present: list[Row] = [row(at(0, 999), 1, version=next(version)) for _ in range(5)]
        total = len(present)
        cp = committed(fold_counter(("c",), EMPTY_CHECKPOINT, present, 1_000))
        present = [r for r in present if r[1] not in cp.pending]
        backlog = [row(at(0, 1_000), rng.randint(-3, 9), version=next(version))
                   for _ in range(late)]  # fmt: skip
        present += backlog
        total += sum(r[2] for r in backlog)
        epoch, folds = 1_000, 0
        while True:
            epoch += 60
            news = []
            if folds < 6:  # new rows, on time or late, and late bursts while the backlog drains
                news = [row(at(epoch - 90, epoch + 30), 1, version=next(version))
                        for _ in range(rng.randint(0, 3))]  # fmt: skip
                if rng.random() < 0.3:
                    news += [row(at(0, epoch - 60), 1, version=next(version))
                             for _ in range(rng.randint(1, 2 * cap))]  # fmt: skip
            present += news
            total += len(news)
            carried = any(r[1] in cp.pending for r in present)
            fold = fold_counter(("c",), cp, present, epoch, max_rows=cap)
            folds += 1
            assert not fold.refused
            cp = committed(fold) if fold.commit else cp
            missed = sum(r[2] for r in present if r[0] <= cp.epoch_ms and r[1] not in cp.pending)
            assert read(cp, present) == total - missed, (folds, fold)
            assert not missed or carried, (folds, fold)
            if crashes and rng.random() < 0.5:  # its cleanup did not run
                crashes -= 1
            else:
                present = [r for r in present if r[1] not in cp.pending]
            assert read(cp, present) == total - missed
            if not news and all(r[0] > epoch for r in present):
                break
            assert folds < 200

    @settings(max_examples=50, deadline=None)
    @given(seed=st.integers(0, 2**32), cap=st.integers(1, 8), crashes=st.integers(0, 4))
    def test_a_unique_counters_readers_count_each_member_once_through_a_drain(
        self, seed, cap, crashes
    ):
        """The same drain for a unique counter: members written late in bursts, some twice (a
        clock-behind writer's second row), cleanups that mark members counted before deleting
        their rows, some skipped. After every fold the readers' rule (the copy's value plus
        the distinct members after its epoch neither in its pending nor marked) counts every
        member once; none more."""
        rng = random.Random(seed)
        used: set[int] = set()

        def at(low: int, high: int) -> int:
            t = rng.choice([t for t in range(low, high + 1) if t not in used])
            used.add(t)
            return t

        members = iter(f"u{i}" for i in range(10**6))
        present: list[Row] = []
        marked: set[str] = set()
        written: set[str] = set()
        cp = EMPTY_CHECKPOINT
        epoch = 1_000
        for step in range(40):
            if step < 8:
                for _ in range(rng.randint(0, 2 * cap)):
                    member = next(members) if not written or rng.random() < 0.8 else (
                        rng.choice(sorted(written))
                    )  # fmt: skip
                    t = at(0, epoch + 30)
                    present.append((t, (t, member), 1))
                    written.add(member)
            carried = any(r[1] in cp.pending for r in present)
            candidates = {r[1][1] for r in present if r[1] not in cp.pending}
            counted = frozenset(candidates & marked)
            fold = fold_counter(("m",), cp, present, epoch, member_index=1,
                                counted_members=counted, max_rows=cap)  # fmt: skip
            assert not fold.refused
            cp = committed(fold) if fold.commit else cp
            counted_before = {k[1] for k in cp.pending} | marked
            cp_epoch = -1 if cp.epoch_ms is None else cp.epoch_ms  # None: nothing committed yet
            after = {r[1][1] for r in present if r[0] > cp_epoch} - counted_before
            missed = {r[1][1] for r in present if r[0] <= cp_epoch and r[1] not in cp.pending}
            missed -= counted_before | after
            assert cp.value + len(after) == len(written) - len(missed), (step, fold)
            assert not missed or carried, (step, fold)
            if crashes and rng.random() < 0.4:
                crashes -= 1
            else:  # members marked first, then their rows deleted
                marked |= {k[1] for k in cp.pending}
                present = [r for r in present if r[1] not in cp.pending]
            epoch += 60
            if step >= 8 and not any(r[0] <= epoch for r in present):
                break
