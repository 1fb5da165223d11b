"""The GX suite on tiny record sets (ephemeral data, a file context in a tmp dir; no services)."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from counters.airflow import checks
from counters.core import CommitRecord, evaluate_commit_checks

pytestmark = pytest.mark.airflow

EPOCH = datetime(2026, 11, 22, 10, 0)


def record(counter: str, base: int, folded: int, **changes: object) -> CommitRecord:
    """A committed counter whose compact row is exactly what the run logged."""
    commit = uuid.uuid1()
    fields = {
        "counter": (counter,),
        "commit_id": commit,
        "base_value": base,
        "folded_sum": folded,
        "new_value": base + folded,
        "new_epoch": EPOCH,
        "current_commit_id": commit,
        "current_value": base + folded,
        "current_epoch": EPOCH,
    }
    fields.update(changes)
    return CommitRecord(**fields)


def failed(report: checks.SuiteReport) -> dict[str, tuple[str, ...]]:
    return {o.name: o.counters for o in report.outcomes if not o.success}


def test_expect_a_clean_run_to_pass_and_write_data_docs(tmp_path: Path) -> None:
    # arrange
    records = [record("IBM", 0, 55), record("AAPL", 10, 5), record("MSFT", 7, 0)]
    # act
    report = checks.validate_records("fam", "run:1", records, base_dir=tmp_path)
    # assert
    assert report.success and failed(report) == {}
    assert report.docs_index == (
        tmp_path / "fam" / "gx" / "uncommitted" / "data_docs" / "local_site" / "index.html"
    )
    assert report.docs_index.exists()
    assert report.docs_page and report.docs_page.startswith("file://")
    assert Path(report.docs_page.removeprefix("file://")).exists()
    assert report.statistics["unsuccessful_expectations"] == 0
    json.dumps(report.result)  # goes to XCom


def test_expect_a_tampered_value_to_name_the_counter_and_the_amounts(tmp_path: Path) -> None:
    records = [record("IBM", 0, 55, current_value=999), record("AAPL", 10, 5)]

    report = checks.validate_records("fam", "run-2", records, base_dir=tmp_path)

    assert not report.success
    assert failed(report) == {
        "compact_value_equals_before_plus_folded": (
            "IBM: compact value 999 (expected 55 = 0 + 55)",
        ),
        "family_total_conserved": (),
    }
    # the engine's own rules agree
    engine = {o.name for o in evaluate_commit_checks(records) if not o.success}
    assert engine == {"compact_value_equals_before_plus_folded"}


def test_expect_missing_rows_regressed_epochs_and_bad_arithmetic_each_reported(
    tmp_path: Path,
) -> None:
    superseded = uuid.uuid1()
    records = [
        record("GONE", 1, 2, current_commit_id=None, current_value=None, current_epoch=None),
        record(
            "OLD",
            5,
            5,
            current_commit_id=superseded,
            current_value=10,
            current_epoch=EPOCH - timedelta(minutes=1),
        ),
        record("ODD", 1, 1, new_value=3, current_value=3),
    ]

    report = checks.validate_records("fam", "run-3", records, base_dir=tmp_path)

    assert failed(report) == {
        "compact_row_present": ("GONE: compact row missing (expected value 3)",),
        "epoch_never_regresses": ("OLD: compact epoch 2026-11-22 09:59:00 < 2026-11-22 10:00:00",),
        "logged_arithmetic_is_consistent": ("ODD: logged 1 + 1 != 3",),
        "family_total_conserved": (),
    }


def test_expect_null_amounts_to_fail_the_integer_check(tmp_path: Path) -> None:
    report = checks.validate_records(
        "fam",
        "run-4",
        [record("IBM", 0, 5), record("NUL", 0, 0, folded_sum=None)],
        base_dir=tmp_path,
    )
    assert "folded_sum_is_integer" in failed(report)


def test_expect_no_records_to_pass(tmp_path: Path) -> None:
    assert checks.validate_records("fam", "empty", [], base_dir=tmp_path).success


def test_expect_epochs_as_time_uuids_to_compare_by_time(tmp_path: Path) -> None:
    """A rows family's checkpoint is a time UUID."""
    from cassandra.util import uuid_from_time

    stamp = uuid_from_time(EPOCH.timestamp())
    report = checks.validate_records(
        "fam", "uuid", [record("L1", 2, 3, new_epoch=stamp, current_epoch=stamp)], base_dir=tmp_path
    )
    assert report.success


def test_expect_old_results_pruned_beyond_keep(tmp_path: Path) -> None:
    for run in ("a", "b", "c"):
        checks.validate_records("fam", run, [record("IBM", 0, 1)], base_dir=tmp_path, keep=2)
    store = tmp_path / "fam" / "gx" / "uncommitted" / "validations" / "counters_fam"
    site = tmp_path / "fam" / "gx" / "uncommitted" / "data_docs" / "local_site" / "validations"
    assert sorted(p.name for p in store.iterdir()) == ["b", "c"]
    assert sorted(p.name for p in (site / "counters_fam").iterdir()) == ["b", "c"]
