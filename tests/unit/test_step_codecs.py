"""What the engine's steps pass each other crosses XCom in one encoding, read back whole."""

from __future__ import annotations

import json

import pytest
from counters.core import CheckOutcome, Tally
from counters.engine import CleanedRun, VerifiedRun

pytestmark = pytest.mark.unit


def test_a_verified_run_survives_json_whole() -> None:
    verified = VerifiedRun(
        Tally(counters_committed=2, rows_folded=12, sum_folded=42),
        {"verify": 0.5, "compact.fold": 1.25},
        {0: ("a1",), 1: ("b1", "b2")},
        (
            CheckOutcome("family_total_conserved", True, True, "ok"),
            CheckOutcome("gx:no_counter_quarantined", False, False, "1 bucket", ("shard 1",)),
        ),
        "fingerprint",
        "file:///results/f/2026-11-27/x",
    )
    assert VerifiedRun.from_dict(json.loads(json.dumps(verified.as_dict()))) == verified


def test_a_cleaned_run_survives_json_whole() -> None:
    cleaned = CleanedRun(
        CheckOutcome("no_counted_rows_remain_after_cleanup", False, True, "1 left", ("IBM",)),
        12,
        {"cleanup": 0.75},
    )
    assert CleanedRun.from_dict(json.loads(json.dumps(cleaned.as_dict()))) == cleaned
