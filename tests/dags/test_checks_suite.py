"""The GX suite on tiny evidence sets (a file context in a tmp dir; no services)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from counters.airflow import checks
from counters.core import Evidence, evaluate_evidence

pytestmark = pytest.mark.airflow


def evidence(bucket: int, folded: int, **changes: int) -> Evidence:
    """A bucket whose commits and recount agree: ``folded`` summed from 4 rows, all counted."""
    fields = {
        "shard": 0,
        "bucket": bucket,
        "counters": 2,
        "rows_folded": 4,
        "sum_folded": folded,
        "value_delta": folded,
        "pending_rows": 4,
        "pending_sum": folded,
        "recount_rows": 4,
        "recount_sum": folded,
        "late_arrivals": 0,
        "quarantined": 0,
    }
    fields.update(changes)
    fields.setdefault("readers_before", 1000)
    fields.setdefault("readers_after", 1000 + fields["value_delta"])
    return Evidence(**fields)


def failed(report: checks.SuiteReport) -> dict[str, tuple[str, ...]]:
    return {o.name: o.counters for o in report.outcomes if not o.success}


def test_expect_a_clean_run_to_pass_and_write_data_docs(tmp_path: Path) -> None:
    # arrange
    rows = [evidence(0, 55), evidence(1, 15), evidence(7, 0)]
    # act
    report = checks.validate_evidence("fam", "run:1", rows, base_dir=tmp_path)
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


def test_expect_values_that_moved_by_more_than_was_folded_to_name_the_bucket(
    tmp_path: Path,
) -> None:
    rows = [evidence(3, 55, value_delta=999), evidence(4, 15)]

    report = checks.validate_evidence("fam", "run-2", rows, base_dir=tmp_path)

    assert not report.success
    assert failed(report) == {
        "value_change_equals_folded_sum": (
            "shard 0 bucket 3: readers' copies moved by 999 (from 1000 to 1999), sum folded 55",
        ),
        "family_total_conserved": (),
    }
    # the engine's own rules agree
    engine = {o.name for o in evaluate_evidence(rows) if not o.success}
    assert engine == {"value_change_equals_folded_sum", "family_total_conserved"}


def test_expect_a_recount_that_differs_from_the_counted_rows_to_fail(tmp_path: Path) -> None:
    rows = [evidence(0, 10, recount_rows=3, recount_sum=7), evidence(1, 5, recount_sum=6)]

    report = checks.validate_evidence("fam", "run-3", rows, base_dir=tmp_path)

    found = failed(report)
    assert set(found) == {"recount_equals_counted_rows"}
    assert found["recount_equals_counted_rows"][0].startswith("shard 0 bucket 0: recount")
    assert not report.success


def test_expect_a_quarantined_counter_to_warn_without_failing_the_suite(tmp_path: Path) -> None:
    report = checks.validate_evidence(
        "fam", "run-q", [evidence(0, 10, quarantined=1)], base_dir=tmp_path
    )
    assert report.success
    warning = {o.name: o for o in report.outcomes}["no_counter_quarantined"]
    assert not warning.success and not warning.critical


def test_expect_amounts_past_a_bigint_to_fail_the_integer_check(tmp_path: Path) -> None:
    report = checks.validate_evidence(
        "fam",
        "run-4",
        [evidence(0, 5), evidence(1, 2**63, value_delta=2**63)],
        base_dir=tmp_path,
    )
    assert "sum_folded_is_integer" in failed(report)


def test_expect_no_evidence_to_pass(tmp_path: Path) -> None:
    assert checks.validate_evidence("fam", "empty", [], base_dir=tmp_path).success


def test_expect_old_results_pruned_beyond_keep(tmp_path: Path) -> None:
    for run in ("a", "b", "c"):
        checks.validate_evidence("fam", run, [evidence(0, 1)], base_dir=tmp_path, keep=2)
    store = tmp_path / "fam" / "gx" / "uncommitted" / "validations" / "counters_fam"
    site = tmp_path / "fam" / "gx" / "uncommitted" / "data_docs" / "local_site" / "validations"
    assert sorted(p.name for p in store.iterdir()) == ["b", "c"]
    assert sorted(p.name for p in (site / "counters_fam").iterdir()) == ["b", "c"]


def test_expect_minute_runs_to_skip_the_index_until_it_is_due_or_a_run_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # arrange: an index built by a first run, and the GX objects it wrote
    monkeypatch.setenv(checks.INDEX_EVERY_ENV, "3600")
    first = checks.validate_evidence("fam", "run-1", [evidence(0, 1)], base_dir=tmp_path)
    assert first.docs_index is not None
    built = first.docs_index.read_text()
    suites = tmp_path / "fam" / "gx" / "expectations"
    written = {p: p.stat().st_mtime_ns for p in suites.rglob("*.json")}
    # act: a passing run within the hour
    second = checks.validate_evidence("fam", "run-2", [evidence(0, 2)], base_dir=tmp_path)
    # assert: its own page exists, the index and the suite were left as they were
    assert Path(second.docs_page.removeprefix("file://")).exists()
    assert first.docs_index.read_text() == built and "run-2" not in built
    assert {p: p.stat().st_mtime_ns for p in suites.rglob("*.json")} == written
    # a failing run rebuilds the index at once, listing every kept run
    third = checks.validate_evidence(
        "fam", "run-3", [evidence(0, 3, value_delta=4)], base_dir=tmp_path
    )
    assert not third.success
    index = first.docs_index.read_text()
    assert "run-2" in index and "run-3" in index
    # and the whole site can be rebuilt on demand (e.g. before it is shown)
    assert checks.build_data_docs("fam", base_dir=tmp_path) == first.docs_index
