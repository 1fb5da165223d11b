"""The one encoding of a run's typed values (``core.codec``): every field of every value that
crosses XCom survives plain JSON; a payload of another version, or with a field missing or
unknown, is refused naming the type and the field; and what the previous release stored in
XCom (literal payloads below, as it wrote them) still decodes."""

from __future__ import annotations

import json
from dataclasses import FrozenInstanceError, dataclass, fields
from datetime import datetime
from typing import Any, Literal

import pytest
from counters.audit import Provenance
from counters.compaction.outcome import RunOutcome
from counters.compaction.plan import PLAN_VERSION, RunPlan
from counters.core import CheckOutcome, Evidence, Tally
from counters.core.codec import CodecError, decode, encode, versioned
from counters.engine import CleanupReport, Phases, ShardReport, VerifiedRun

pytestmark = pytest.mark.unit


def trip(value: Any) -> Any:
    """``value`` through what XCom stores (JSON text) and back."""
    return decode(type(value), json.loads(json.dumps(encode(value))))


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


def full_tally() -> Tally:
    figures = {f.name: i + 1 for i, f in enumerate(fields(Tally)) if f.type == "int"}
    return Tally(**figures, quarantined=("IBM",), windowed_counters=("AAPL",))


def test_a_run_plan_round_trips_every_field_with_times_in_the_one_format():
    plan = full_plan()
    defaults = RunPlan("f", "r", plan.epoch, None, ())
    unset = [f.name for f in fields(RunPlan) if getattr(plan, f.name) == getattr(defaults, f.name)]
    assert unset == ["epoch"], unset  # every other field differs from its default
    payload = encode(plan)
    assert set(payload) == {f.name for f in fields(RunPlan)} | {"v"}
    assert payload["v"] == PLAN_VERSION
    assert payload["epoch"] == "2026-11-22T09:58:30.125Z"  # core.to_text
    back = trip(plan)
    assert back == plan
    assert isinstance(back.shards, tuple) and back.epoch.tzinfo is None


def test_every_step_value_round_trips_every_field():
    report = ShardReport(
        3,
        full_tally(),
        Phases({"fold": 0.5}),
        (Evidence(3, 1, 2, 5, 42, 42, 0, 0, 5, 42, 0, 0, 1, 43),),
        ("x",),
        {"compact": 4},
        True,
        81.5,
        "0a1b",
    )
    assert trip(report) == report
    cleanup = CleanupReport(
        3, 5, ("left",), 1, 2, 3, 4, 5, 0.25, {"c": 3}, 80.0, 6, 7, ("f",), 8, 1.5, ("a @ 1",)
    )
    assert trip(cleanup) == cleanup
    for value, name in ((report, "tally"), (cleanup, "rows_deleted")):  # frozen, as read back
        with pytest.raises(FrozenInstanceError):
            setattr(trip(value), name, None)
    verified = VerifiedRun(
        full_tally(),
        {"verify": 0.5, "compact.fold": 1.25},
        {0: ("a1",), 1: ("b1", "b2")},
        (
            CheckOutcome("family_total_conserved", True, True, "ok"),
            CheckOutcome("gx:no_counter_quarantined", False, False, "1 bucket", ("shard 1",)),
        ),
        "fingerprint",
        "file:///results/f/2026-11-27/x",
    )
    back = trip(verified)
    assert back == verified and back.executions[1] == ("b1", "b2")
    ended = RunOutcome(
        full_plan(),
        "partial",
        datetime(2026, 11, 22, 10, 0, 1),
        "increments",
        full_tally(),
        {"plan": 0.5},
        verified.checks,
        "why",
        "fp",
        "file:///r",
        {"compact": 3},
        12.5,
    )
    assert trip(ended) == ended


def test_another_version_or_a_missing_or_unknown_field_is_refused_naming_type_and_field():
    payload = dict(encode(full_plan()))
    with pytest.raises(CodecError, match=r"RunPlan: field 'v' is 7"):
        decode(RunPlan, {**payload, "v": 7})
    with pytest.raises(CodecError, match=r"RunPlan: field\(s\) missing: dry_run"):
        decode(RunPlan, {k: v for k, v in payload.items() if k != "dry_run"})
    with pytest.raises(CodecError, match=r"RunPlan: unknown field\(s\): colour"):
        decode(RunPlan, {**payload, "colour": "red"})
    with pytest.raises(CodecError, match=r"RunPlan\.epoch: not an ISO 8601 time: 'not a time'"):
        decode(RunPlan, {**payload, "epoch": "not a time"})
    with pytest.raises(CodecError, match=r"RunPlan\.shards\[1\]: expected int, got '3'"):
        decode(RunPlan, {**payload, "shards": [0, "3"]})
    report = dict(encode(ShardReport(1, Tally(), Phases())))
    with pytest.raises(CodecError, match=r"ShardReport\.tally: field\(s\) missing: rows_read"):
        decode(ShardReport, {**report, "tally": {"v": 2}})
    with pytest.raises(CodecError, match=r"ShardReport\.tally: Tally: field 'v' is 3, expected 2"):
        decode(ShardReport, {**report, "tally": {**report["tally"], "v": 3}})


def test_a_type_without_an_upgrade_refuses_a_payload_without_its_version():
    @versioned(3)
    @dataclass(frozen=True)
    class Probe:
        when: datetime
        named: tuple[str, ...] = ()

    value = Probe(datetime(2026, 11, 22, 10, 0), ("a",))
    assert encode(value) == {"v": 3, "when": "2026-11-22T10:00:00.000Z", "named": ["a"]}
    assert trip(value) == value
    with pytest.raises(CodecError, match=r"Probe: field 'v' is 0, expected 3"):
        decode(Probe, {"when": "2026-11-22T10:00:00.000Z", "named": []})


def test_a_literal_field_takes_only_its_values():
    @dataclass(frozen=True)
    class Ended:
        how: Literal["success", "failed"]

    assert trip(Ended("failed")) == Ended("failed")
    with pytest.raises(CodecError, match=r"Ended\.how: expected one of \['success', 'failed'\]"):
        decode(Ended, {"how": "done"})


# --- what the previous release stored in XCom (its ``as_dict``), literally ---------------------

OLD_PLAN = {
    "format": 1,
    "family": "trades",
    "run_id": "scheduled__2026-11-22T10:00:00+00:00",
    "epoch": "2026-11-22T09:58:30.125Z",
    "epoch_before": "2026-11-22T09:57:30.000Z",
    "shards": [0, 3],
    "sweep": True,
    "noop_reason": None,
    "started_at": "2026-11-22T10:00:01.500Z",
    "idle": False,
    "small": False,
    "dry_run": False,
    "scheduled": "2026-11-22T10:00:00.000Z",
    "provenance": {
        "triggered_by": "manual",
        "airflow_user": "alice",
        "parameters": {"dag_id": "compact_trades"},
    },
}
OLD_TALLY = {
    "rows_read": 0,
    "counters_seen": 0,
    "counters_committed": 2,
    "counters_refused": 0,
    "counters_quarantined": 0,
    "conflicts": 0,
    "rows_folded": 5,
    "sum_folded": 42,
    "late_rows": 0,
    "late_sum": 0,
    "max_lateness_ms": 0,
    "rows_deleted": 0,
    "windowed_reads": 0,
    "capped_counters": 0,
    "rows_left": 0,
    "counted_present": 0,
    "rows_gone": 0,
    "quarantined": ["IBM"],
    "windowed_counters": [],
}
OLD_REPORT = {
    "execution": "0a1b2c3d4e5f6071",
    "peak_rss_mib": 81.5,
    "shard": 3,
    "tally": OLD_TALLY,
    "seconds": {"fold": 0.5},
    "evidence": [
        {
            "shard": 3,
            "bucket": 1,
            "counters": 2,
            "rows_folded": 5,
            "sum_folded": 42,
            "value_delta": 42,
            "pending_rows": 0,
            "pending_sum": 0,
            "recount_rows": 5,
            "recount_sum": 42,
            "late_arrivals": 0,
            "quarantined": 0,
            "readers_before": 1,
            "readers_after": 43,
        }
    ],
    "failures": ["x"],
    "requests": {"compact": 4},
    "dry_run": False,
}
OLD_CLEANUP = {
    "shard": 3,
    "rows_deleted": 5,
    "leftovers": [],
    "late_rows": 1,
    "late_sum": 2,
    "windowed": 0,
    "counters_cleaned": 2,
    "counters_checked": 2,
    "seconds": 0.25,
    "requests": {"cleanup": 3},
    "peak_rss_mib": 80.0,
    "archived_rows": 0,
    "archived_sum": 0,
    "archive_files": [],
    "archive_deferred": 0,
    "archive_seconds": 0.0,
}
OLD_VERIFIED = {
    "tally": {**OLD_TALLY, "quarantined": []},
    "seconds": {"verify": 0.25},
    "executions": {"3": ["0a1b2c3d4e5f6071"]},
    "checks": [
        {
            "name": "family_total_conserved",
            "success": True,
            "critical": True,
            "detail": "ok",
            "counters": [],
        }
    ],
    "gx_suite": "sha256:suite",
    "gx_result": "file:///gx/run-1",
}


def test_what_the_previous_release_stored_in_xcom_still_decodes():
    plan = decode(RunPlan, OLD_PLAN)
    assert plan.epoch == datetime(2026, 11, 22, 9, 58, 30, 125_000) and plan.sweep
    assert plan.provenance == Provenance("manual", "alice", {"dag_id": "compact_trades"})
    assert encode(plan) == {
        "v": PLAN_VERSION,
        **{k: v for k, v in OLD_PLAN.items() if k != "format"},
    }
    report = decode(ShardReport, OLD_REPORT)
    assert report.phases == Phases({"fold": 0.5}) and report.execution == "0a1b2c3d4e5f6071"
    assert report.tally.sum_folded == 42 and report.tally.quarantined == ("IBM",)
    assert report.tally.buckets_by_counter == 0
    tally_v1 = {k: v for k, v in encode(report.tally).items() if k != "buckets_by_counter"}
    assert decode(Tally, {**tally_v1, "v": 1}) == report.tally  # the last release's form
    assert report.evidence[0].readers_after == 43
    cleanup = decode(CleanupReport, OLD_CLEANUP)
    assert cleanup.rows_deleted == 5 and cleanup.requests == {"cleanup": 3}
    assert cleanup.stamped_ahead == ()
    cleanup_v1 = decode(CleanupReport, {**OLD_CLEANUP, "v": 1})  # the last release's form
    assert cleanup_v1 == cleanup and encode(cleanup_v1)["v"] == 2  # type: ignore[typeddict-item]
    with pytest.raises(CodecError, match=r"CleanupReport: field 'v' is 3, expected 2"):
        decode(CleanupReport, {**OLD_CLEANUP, "v": 3})
    verified = decode(VerifiedRun, OLD_VERIFIED)
    assert verified.executions == {3: ("0a1b2c3d4e5f6071",)}
    assert verified.checks == (CheckOutcome("family_total_conserved", True, True, "ok"),)
    with pytest.raises(CodecError, match=r"RunPlan: field 'v' is 0 \(format 0\)"):
        decode(RunPlan, {**OLD_PLAN, "format": 0})  # no plan of format 0 was ever stored
