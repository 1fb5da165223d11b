"""How a run ends, decided once for ``counterctl compact`` and the DAG (``engine.conclusion``):
the compacted epoch must have moved, a quarantined counter makes the run ``partial``."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from counters import engine
from counters.core import CheckOutcome, Tally, to_text

pytestmark = pytest.mark.unit

EPOCH = datetime(2026, 11, 25, 12, 0)
PLAN = engine.RunPlan("trades", "r1", EPOCH, EPOCH - timedelta(minutes=1), (0, 1))
PASSED = [CheckOutcome("sum_conserved", True, True, "ok")]


def test_a_run_whose_epoch_moved_succeeds():
    ended = engine.conclusion(
        "trades", PLAN, Tally(), [*PASSED, engine.epoch_advanced(PLAN, EPOCH)]
    )
    assert (ended.outcome, ended.message, ended.failed) == ("success", "", [])
    assert [o.name for o in ended.checks] == ["sum_conserved", "family_epoch_advanced"]


def test_a_run_whose_epoch_did_not_move_fails_and_says_where_it_stands():
    behind = EPOCH - timedelta(minutes=1)
    ended = engine.conclusion(
        "trades", PLAN, Tally(), [*PASSED, engine.epoch_advanced(PLAN, behind)]
    )
    assert ended.outcome == "failed"
    assert ended.failed == ["family_epoch_advanced"]
    assert "'trades'" in ended.message and "'r1'" in ended.message
    assert f"is {to_text(behind)} after finishing, expected at least {to_text(EPOCH)}" in (
        ended.message
    )
    never = engine.conclusion("trades", PLAN, Tally(), [engine.epoch_advanced(PLAN, None)])
    assert never.outcome == "failed"


def test_quarantined_counters_make_the_run_partial_and_are_named():
    tally = Tally(counters_quarantined=2, quarantined=("a", "b"))
    quarantine = CheckOutcome("no_counter_quarantined", False, False, "2 quarantined", ("a", "b"))
    ended = engine.conclusion(
        "trades", PLAN, tally, [*PASSED, quarantine, engine.epoch_advanced(PLAN, EPOCH)]
    )
    assert (ended.outcome, ended.failed, ended.counters) == (
        "partial",
        ["no_counter_quarantined"],
        ["a", "b"],
    )
    assert "counterctl quarantine --family trades" in ended.message


def test_a_failed_critical_check_wins_over_a_quarantine():
    tally = Tally(counters_quarantined=1, quarantined=("a",))
    broken = CheckOutcome("sum_conserved", False, True, "off by 3", ("c",))
    ended = engine.conclusion("trades", PLAN, tally, [broken, engine.epoch_advanced(PLAN, EPOCH)])
    assert (ended.outcome, ended.failed, ended.counters) == ("failed", ["sum_conserved"], ["c"])
    assert "sum_conserved: off by 3" in ended.message


def test_the_dry_run_message_is_what_the_cli_and_the_dag_both_record():
    tally = Tally(counters_committed=3, rows_folded=7, sum_folded=70)
    assert engine.dry_run_message(tally) == (
        "dry run: 3 counter(s) would fold 7 row(s) (sum 70); nothing written, verified or deleted"
    )


def test_a_runs_figures_add_up_its_applied_commits_each_row_and_counter_once():
    """Issue #49 item 4: the audit row's committed figures are those of every applied commit
    of the run (``commit_figures`` kept with each record), not the reporting attempt's own. A
    retry's fold on its own run's commit carries that commit's rows: counted there, once."""
    from counters.core import Checkpoint, commit_figures, fold_counter, run_figures

    rows = [(1000 + i, ("w", i), i + 1) for i in range(3)]
    first = fold_counter(("A",), Checkpoint(), rows, 5000)  # 3 rows, sum 6
    committed = Checkpoint(6, 5000, "c1", frozenset(r[1] for r in rows), 6, run_id="r1")
    late = (4000, ("w", 9), 10)
    retry = fold_counter(("A",), committed, [*rows, late], 5000)  # carries 3, folds 1 late
    other_run = fold_counter(("A",), committed, rows, 6000)  # another run carries them
    assert commit_figures([first], "r1")["rows_folded"] == 3
    again = commit_figures([retry], "r1")
    assert (again["counters_committed"], again["rows_folded"], again["sum_folded"]) == (0, 1, 10)
    assert (again["counted_present"], again["late_rows"]) == (0, 1)
    assert commit_figures([other_run], "r2")["counted_present"] == 3
    reported = Tally(rows_folded=1, sum_folded=10, conflicts=2, rows_deleted=4, rows_read=9)
    run = run_figures(reported, [commit_figures([first], "r1"), again])
    assert (run.counters_committed, run.rows_folded, run.sum_folded) == (1, 4, 16)
    assert (run.conflicts, run.rows_deleted, run.rows_read) == (2, 4, 9)  # as reported
    # a record from before figures were kept: the reported tally, whole
    assert run_figures(reported, [again, None]) == reported
    assert run_figures(reported, []) == reported
    # the rows every cleanup of the run recorded (a cleared compact step's earlier pass too)
    assert run_figures(reported, [again], deleted=44).rows_deleted == 44
    assert run_figures(reported, [again], deleted=None).rows_deleted == 4
