"""The GX suite on tiny evidence sets (the process's in-memory context; no services), a page
rendered from a stored result, and the preload's warm-up in a forked child."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from counters.airflow.ui import datadocs
from counters.core import Evidence, evaluate_evidence
from counters.gx import checks

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


def test_expect_a_clean_run_to_pass_and_write_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # arrange
    monkeypatch.chdir(tmp_path)
    rows = [evidence(0, 55), evidence(1, 15), evidence(7, 0)]
    # act
    report = checks.validate_evidence("fam", "run:1", rows)
    # assert
    assert report.success and failed(report) == {}
    assert report.statistics["unsuccessful_expectations"] == 0
    assert report.result["suite_name"] == "counters_fam"
    assert report.result["meta"]["run_id"]["run_name"] == "run_1"
    json.dumps(report.result, default=str)  # what evidence.keep stores
    assert list(tmp_path.iterdir()) == []  # no GX project, no Data Docs


def test_expect_values_that_moved_by_more_than_was_folded_to_name_the_bucket() -> None:
    rows = [evidence(3, 55, value_delta=999), evidence(4, 15)]

    report = checks.validate_evidence("fam", "run-2", rows)

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


def test_expect_a_recount_that_differs_from_the_counted_rows_to_fail() -> None:
    rows = [evidence(0, 10, recount_rows=3, recount_sum=7), evidence(1, 5, recount_sum=6)]

    report = checks.validate_evidence("fam", "run-3", rows)

    found = failed(report)
    assert set(found) == {"recount_equals_counted_rows"}
    assert found["recount_equals_counted_rows"][0].startswith("shard 0 bucket 0: recount")
    assert not report.success


def test_expect_a_quarantined_counter_to_warn_without_failing_the_suite() -> None:
    report = checks.validate_evidence("fam", "run-q", [evidence(0, 10, quarantined=1)])
    assert report.success
    warning = {o.name: o for o in report.outcomes}["no_counter_quarantined"]
    assert not warning.success and not warning.critical


def test_expect_amounts_past_a_bigint_to_fail_the_integer_check() -> None:
    report = checks.validate_evidence(
        "fam", "run-4", [evidence(0, 5), evidence(1, 2**63, value_delta=2**63)]
    )
    assert "sum_folded_is_integer" in failed(report)


def test_expect_a_missing_or_fractional_amount_to_fail_its_integer_check() -> None:
    """One expectation per amount column: a null (which GX's column-map expectations skip)
    and a float are held as their text, never an ``int64``. Mutation: the frame keeping None
    as a null passes the suite."""
    clean = evidence(0, 5)
    missing = Evidence(**{**clean.as_dict(), "bucket": 1, "pending_sum": None})  # type: ignore[arg-type]
    fractional = Evidence(**{**clean.as_dict(), "bucket": 2, "readers_after": 5.5})  # type: ignore[arg-type]
    report = checks.validate_evidence("fam", "run-none", [clean, missing, fractional])
    lines = failed(report)
    assert not report.success
    # an object column fails as a whole (GX checks its values' types): every row is named
    assert "shard 0 bucket 1: pending_sum = None" in lines["pending_sum_is_integer"]
    assert "shard 0 bucket 2: readers_after = 5.5" in lines["readers_after_is_integer"]
    assert set(lines) >= {"pending_sum_is_integer", "readers_after_is_integer"}


def test_expect_no_evidence_to_pass() -> None:
    assert checks.validate_evidence("fam", "empty", []).success


def test_expect_each_family_its_own_suite_with_the_same_rules() -> None:
    first = checks.validate_evidence("fam_a", "r", [evidence(0, 1)])
    second = checks.validate_evidence("fam_b", "r", [evidence(0, 1, value_delta=2)])
    again = checks.validate_evidence("fam_a", "r2", [evidence(0, 1, recount_sum=9)])

    assert (first.result["suite_name"], second.result["suite_name"]) == (
        "counters_fam_a",
        "counters_fam_b",
    )
    assert first.fingerprint == second.fingerprint == again.fingerprint
    assert first.success and not second.success and not again.success
    assert set(failed(again)) == {"recount_equals_counted_rows"}


def stored(report: checks.SuiteReport) -> dict:
    """The result as ``evidence.keep`` stores it and the UI reads it back."""
    return json.loads(json.dumps(report.result, default=str, sort_keys=True))


def test_expect_a_validation_to_wait_for_the_suite_built_beside_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``counterctl compact`` builds the family's suite in a thread while its shards compact
    (``checks.prepare``); a validation asked for meanwhile waits for that build and uses it,
    not a second suite of the same name (which GX's context refuses) or a half-built one."""
    building = threading.Event()
    built: list[int] = []
    real = checks.rules

    def slow_rules() -> list[checks.Rule]:
        built.append(1)
        building.set()
        time.sleep(0.5)
        return real()

    monkeypatch.setattr(checks, "rules", slow_rules)
    family = "prepared_beside"
    thread = checks.prepare(family)
    assert building.wait(60)

    report = checks.validate_evidence(family, "run:2", [evidence(0, 55)])
    thread.join(60)

    assert report.success and report.result["suite_name"] == f"counters_{family}"
    assert built == [1] and not thread.is_alive()


def test_expect_a_page_rendered_from_a_stored_result_to_show_the_run_and_its_failures() -> None:
    passed = checks.validate_evidence("fam", "manual__ok", [evidence(0, 5)])
    broken = checks.validate_evidence("fam", "manual__bad", [evidence(0, 5, value_delta=7)])

    good, bad = datadocs.render_page(stored(passed)), datadocs.render_page(stored(broken))

    for html, run, status, failing in (
        (good, "manual__ok", "Succeeded", 0),
        (bad, "manual__bad", "Failed", 2),
    ):
        text = " ".join(re.sub(r"<[^>]+>", " ", html).split())
        assert "Expectation Validation Result" in html and f"Run Name {run}" in text
        assert f"Expectation Suite: counters_fam Data asset: None Status: {status}" in text
        assert f"Unsuccessful Expectations {failing} " in text
        assert datadocs.remote_assets(datadocs.rewrite(html, "/a", "/s")) == []


WARM_AND_FORK = textwrap.dedent(
    """
    import json, os, sys, threading
    from counters.gx import checks
    from counters.core import Evidence

    def bucket(delta):
        return Evidence(0, 0, 1, 1, 5, delta, 1, 5, 1, 5, 0, 0, 0, delta)

    left = checks.warm(["fam"])
    built = checks._context().suites["fam"].definition.id
    threads = [t.name for t in threading.enumerate()]
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # a task process forked from the preloaded parent
        report = checks.validate_evidence("fam", "good", [bucket(5)])
        good = report.success
        bad = checks.validate_evidence("fam", "bad", [bucket(6)])
        os.write(write, json.dumps([good, bad.success, [o.name for o in bad.outcomes
                                    if not o.success], len(threading.enumerate()),
                                    report.result["meta"]["validation_id"] == built]).encode())
        os._exit(0)
    os.close(write)
    _, status = os.waitpid(child, 0)
    print(json.dumps({"left": left, "threads": threads, "status": status,
                      "child": json.loads(os.read(read, 65536) or b"null")}))
    """
)


def test_expect_the_warm_up_to_leave_no_thread_and_a_forked_task_to_validate() -> None:
    """What the preload does (``checks.warm``) in a fresh interpreter, then a fork: no thread
    is left to lose in the fork, the child validates with the family's suite the parent built
    (not one of its own), and it still fails a wrong total."""
    done = subprocess.run(
        [sys.executable, "-c", WARM_AND_FORK], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["left"] == [] and got["threads"] == ["MainThread"], got
    assert got["status"] == 0
    good, bad, failures, threads, parents_suite = got["child"]
    assert good is True and bad is False and threads == 1
    assert parents_suite is True
    assert set(failures) == {"value_change_equals_folded_sum", "family_total_conserved"}


def test_expect_a_row_count_mismatch_to_be_described_by_its_own_rule() -> None:
    """Two rules report under ``recount_equals_counted_rows``: a failed row count is described
    as a row count, not with the sum rule's words (each result names its rule by index)."""
    report = checks.validate_evidence("fam", "run-7", [evidence(0, 10, recount_rows=3)])

    (detail,) = failed(report)["recount_equals_counted_rows"]
    assert detail == "shard 0 bucket 0: recount 3 row(s), commits counted 4"
    assert not report.success


def test_expect_a_rule_gx_did_not_evaluate_to_fail_the_suite() -> None:
    """Fail closed: a suite whose results miss a rule (a GX change, an expectation dropped) does
    not pass on the rules it did evaluate."""
    suite = checks._suite("fam_short")  # built, then one expectation dropped from GX's copy
    definition_suite = suite.definition.suite
    definition_suite.expectations.pop(0)
    definition_suite.save()
    try:
        report = checks.validate_evidence("fam_short", "run-8", [evidence(0, 10)])
    finally:
        checks._context().suites.pop("fam_short", None)
    assert not report.success
    assert [o.name for o in report.outcomes if not o.success] == ["gx_suite_complete"]


def test_expect_the_result_to_be_what_gx_validation_definition_run_returns() -> None:
    """``validate_evidence`` validates without GX's per-run store round trip (``_validate``)
    and builds each expectation's configuration once per validation: its stored result must
    still be the one ``ValidationDefinition.run`` returns, the same results and the same
    ``meta`` (the UI renders the page from it), up to the run's time."""
    from datetime import UTC, datetime

    import great_expectations as gx

    rows = [evidence(0, 5), evidence(1, 3, value_delta=4)]
    ours = stored(checks.validate_evidence("fam_same", "manual__same", rows))
    from great_expectations.expectations.expectation import Expectation

    # GX's own property is back after a validation (ours only lives while one runs)
    assert Expectation.__dict__["configuration"].fget.__qualname__ == "Expectation.configuration"
    suite = checks._suite("fam_same")
    theirs_result = suite.definition.run(
        batch_parameters={"dataframe": checks.evidence_frame(rows)},
        result_format="COMPLETE",
        run_id=gx.RunIdentifier(run_name="manual__same", run_time=datetime.now(UTC)),
    )
    theirs = json.loads(json.dumps(theirs_result.to_json_dict(), default=str, sort_keys=True))
    store = checks._context().context.validation_results_store
    for key in store.list_keys():  # what run stored: this process's context stays empty
        store.remove_key(key)

    for result in (ours, theirs):  # the moments differ
        result["meta"].pop("validation_time")
        result["meta"]["run_id"].pop("run_time")
        result["meta"]["batch_markers"].pop("ge_load_time")
    assert ours["meta"] == theirs["meta"]
    assert ours == theirs
    assert not ours["success"] and ours["meta"]["validation_id"]


PRELOAD_AND_FORK = textwrap.dedent(
    """
    import json, os, subprocess
    from counters.airflow import preload
    from counters import audit

    preload.preload_tasks()
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # a task process: it may not run git (a subprocess per task) any more
        def refuse(*args, **kwargs):
            raise RuntimeError("a task process ran a subprocess")
        subprocess.run = refuse
        try:
            os.write(write, json.dumps(audit.code_version()).encode())
        except Exception as exc:
            os.write(write, json.dumps(repr(exc)).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(child, 0)
    print(json.dumps({"parent": audit.code_version(),
                      "child": json.loads(os.read(read, 65536) or b"null")}))
    """
)


def test_expect_a_forked_task_to_inherit_the_preloaded_code_version() -> None:
    """Every audit row records the code version (``git describe``): the preload computes it
    once, so a task forked afterwards records the same without running ``git`` itself."""
    env = {k: v for k, v in os.environ.items() if k != "COUNTERS_CODE_VERSION"}
    done = subprocess.run(
        [sys.executable, "-c", PRELOAD_AND_FORK],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert "+git." in got["parent"], got
    assert got["child"] == got["parent"]
