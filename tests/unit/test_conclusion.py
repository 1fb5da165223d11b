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
    tally = Tally(counters_quarantined=2, quarantined=["a", "b"])
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
    tally = Tally(counters_quarantined=1, quarantined=["a"])
    broken = CheckOutcome("sum_conserved", False, True, "off by 3", ("c",))
    ended = engine.conclusion("trades", PLAN, tally, [broken, engine.epoch_advanced(PLAN, EPOCH)])
    assert (ended.outcome, ended.failed, ended.counters) == ("failed", ["sum_conserved"], ["c"])
    assert "sum_conserved: off by 3" in ended.message


def test_the_dry_run_message_is_what_the_cli_and_the_dag_both_record():
    tally = Tally(counters_committed=3, rows_folded=7, sum_folded=70)
    assert engine.dry_run_message(tally) == (
        "dry run: 3 counter(s) would fold 7 row(s) (sum 70); nothing written, verified or deleted"
    )
