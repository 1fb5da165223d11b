"""``RunPlan``'s one encoding across XCom (``as_dict``/``from_dict``): every field survives the
trip through plain JSON, and a payload that is not a whole plan is refused naming the field."""

from __future__ import annotations

import json
from dataclasses import fields
from datetime import datetime

import pytest
from counters.audit import Provenance
from counters.compaction.plan import PLAN_FORMAT, RunPlan

pytestmark = pytest.mark.unit


def full_plan() -> RunPlan:
    """A plan where no field has its default: a field the codec forgets cannot pass unseen."""
    return RunPlan(
        "trades",
        "scheduled__2026-11-22T10:00:00+00:00",
        datetime(2026, 11, 22, 9, 58, 30, 125_000),
        datetime(2026, 11, 22, 9, 57, 30),
        (0, 3, 7),
        sweep=True,
        noop_reason="why not",
        started_at=datetime(2026, 11, 22, 10, 0, 1, 500_000),
        idle=True,
        small=True,
        dry_run=True,
        scheduled=datetime(2026, 11, 22, 10, 0),
        provenance=Provenance("manual", "alice", {"dag_id": "compact_trades", "epoch": "x"}),
    )


def test_a_run_plan_round_trips_every_field_through_plain_json():
    plan = full_plan()
    defaults = RunPlan("f", "r", plan.epoch, None, ())
    unset = [f.name for f in fields(RunPlan) if getattr(plan, f.name) == getattr(defaults, f.name)]
    assert unset == ["epoch"], unset  # every other field differs from its default
    payload = json.loads(json.dumps(plan.as_dict()))  # what XCom stores
    assert set(payload) == {f.name for f in fields(RunPlan)} | {"format"}
    back = RunPlan.from_dict(payload)
    assert back == plan
    assert isinstance(back.shards, tuple) and back.epoch.tzinfo is None


def test_a_plan_of_another_format_or_missing_a_field_is_refused_naming_it():
    payload = full_plan().as_dict()
    with pytest.raises(ValueError, match="'format' is 0"):
        RunPlan.from_dict({**payload, "format": 0})
    del payload["dry_run"]
    with pytest.raises(ValueError, match="fields missing: \\['dry_run'\\]"):
        RunPlan.from_dict(payload)
    bad = {**full_plan().as_dict(), "epoch": "not a time"}
    with pytest.raises(ValueError, match=r"run plan of run .scheduled__.*not a time"):
        RunPlan.from_dict(bad)
    assert PLAN_FORMAT == 1


def test_what_verify_found_round_trips_through_plain_json():
    from counters.airflow.tasks import VerifiedRun
    from counters.core import CheckOutcome, Tally

    found = VerifiedRun(
        Tally(rows_folded=7, sum_folded=42, counters_committed=2, quarantined=["IBM"]),
        {"verify": 0.25, "compact": 1.5},
        {0: ("run-1:0:a",), 3: ("run-1:3:a", "run-1:3:b")},
        (CheckOutcome("sum_conserved", True, True, "ok", ("IBM",)),),
        "sha256:suite",
        "file:///gx/run-1",
    )
    back = VerifiedRun.from_dict(json.loads(json.dumps(found.as_dict())))
    assert back == found
    assert back.executions[3] == ("run-1:3:a", "run-1:3:b")
