"""The audit row's pure parts: month partitions, provenance, fingerprints; the GX results
store's layout and pruning (a local folder through ``ObjectStoragePath``, or outside Airflow
the ``UPath`` it wraps)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from counters import audit
from counters.config import Family
from counters.core.codec import decode, encode
from counters.gx import checks, evidence

pytestmark = pytest.mark.unit


def family(**fields: object) -> Family:
    values: dict[str, object] = {
        "name": "trades",
        "keyspace": "ks",
        "raw_table": "raw",
        "compact_table": "compact",
        "lag": "1m",
    }
    values.update(fields)
    return Family.model_validate(values)


def sha256_of_configuration(fam: Family) -> str:
    """The documented configuration hash, computed here: sha256 of the family as loaded
    (every field, defaults included) as JSON with its keys sorted."""
    fields = fam.model_dump(mode="json")
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def test_expect_a_row_in_the_utc_month_it_started() -> None:
    assert audit.month_of(datetime(2026, 12, 31, 23, 59)) == "2026-12"
    in_tokyo = datetime(2027, 1, 1, 8, 0, tzinfo=UTC) + timedelta(hours=0)
    assert audit.month_of(in_tokyo) == "2027-01"
    assert audit.next_month("2026-12") == "2027-01"
    assert audit.next_month("2027-01") == "2027-02"
    with pytest.raises(ValueError, match="audit month '2026-13x' is not YYYY-MM"):
        audit.month_start("2026-13x")


@pytest.mark.parametrize(
    ("since", "before", "expected"),
    [
        (None, None, True),
        (datetime(2026, 11, 30, 23, 59), None, True),
        (datetime(2026, 12, 1), None, False),  # the month ends where since starts
        (None, datetime(2026, 11, 1), False),  # before is exclusive
        (None, datetime(2026, 11, 1, 0, 0, 0, 1000), True),
        (datetime(2026, 10, 1), datetime(2027, 1, 1), True),
    ],
)
def test_expect_a_month_read_only_when_it_overlaps_the_range(
    since: datetime | None, before: datetime | None, expected: bool
) -> None:
    assert audit.month_overlaps("2026-11", since, before) is expected


def test_expect_every_row_stamped_with_who_code_and_configuration() -> None:
    fam = family()
    record = {
        "family": "trades",
        "started_at": datetime(2026, 11, 30, 23, 59, 59),
        "run_id": "r1",
        "parameters": {"counter": "IBM"},
    }
    started_by = audit.Provenance("manual", "alice", {"dag_run_id": "manual__x", "counter": "X"})

    row = audit.stamped(record, fam, started_by, None)

    assert row["month"] == "2026-11" and row["action"] == "compact"
    assert (row["triggered_by"], row["airflow_user"]) == ("manual", "alice")
    assert row["cassandra_role"] == "anonymous"  # no authentication: Cassandra's name for it
    assert row["parameters"] == {"dag_run_id": "manual__x", "counter": "IBM"}  # the record's win
    assert (row["os_user"], row["host"]) == audit.machine()
    assert row["code_version"] == audit.code_version() and row["code_version"]
    assert row["config_hash"] == sha256_of_configuration(fam)
    assert audit.stamped(record, fam, None, "compactor")["cassandra_role"] == "compactor"
    assert audit.stamped(record, fam, None, None)["triggered_by"] == "library"


def test_expect_the_configuration_hash_to_change_with_any_field() -> None:
    base = audit.config_fingerprint(family())
    assert base.startswith("sha256:") and len(base) == len("sha256:") + 64
    assert audit.config_fingerprint(family()) == base
    assert audit.config_fingerprint(family(lag="2m")) != base
    assert audit.config_fingerprint(family(shards=8)) != base


def test_expect_the_code_version_from_the_environment_first(monkeypatch) -> None:
    audit.code_version.cache_clear()
    monkeypatch.setenv(audit.CODE_VERSION_ENV, "1.2.3+image.42")
    try:
        assert audit.code_version() == "1.2.3+image.42"
    finally:
        audit.code_version.cache_clear()
    monkeypatch.delenv(audit.CODE_VERSION_ENV)
    assert "+git." in audit.code_version()  # a checkout: the commit it runs


def test_expect_provenance_to_survive_xcom() -> None:
    """It crosses XCom inside the run's plan, through the one codec."""
    started_by = audit.Provenance("backfill", "bob", {"epoch": "2026-11-22T09:00:00"})
    assert decode(audit.Provenance, json.loads(json.dumps(encode(started_by)))) == started_by


# --- the GX results store ------------------------------------------------------------------


def suite_report() -> checks.SuiteReport:
    return checks.SuiteReport(
        success=True,
        outcomes=[],
        result={"success": True, "statistics": {"evaluated_expectations": 3}},
        fingerprint="abc",
    )


def test_expect_a_result_stored_and_its_page_rendered_once_when_opened(tmp_path: Path) -> None:
    store = tmp_path / "store"
    at = datetime(2026, 11, 25, 16, 10, 14, 130283, tzinfo=UTC)
    rendered: list[dict] = []

    def render(result: dict) -> str:
        rendered.append(result)
        return f"<html>{result['statistics']['evaluated_expectations']} checked</html>"

    url = evidence.keep("fam", "manual__2026:x", suite_report(), now=at, location=store)

    assert url == f"{store.as_uri()}/fam/2026-11-25/20261125T161014.130283Z__manual__2026_x"
    stored = evidence.stored_of("fam", url, location=store)
    assert stored is not None and stored.run_name == "manual__2026_x"
    assert stored.run_time == datetime(2026, 11, 25, 16, 10, 14, 130283)
    result = evidence.open_file("fam", stored.day, stored.folder, "result.json", location=store)
    assert (
        result is not None
        and evidence.read_json(result)["statistics"]["evaluated_expectations"] == 3
    )
    # no page until someone opens it; then rendered from the result, once, and kept
    assert evidence.open_file("fam", stored.day, stored.folder, "page.html", store) is None
    for _ in range(2):
        html = evidence.page("fam", stored.day, stored.folder, render, location=store)
        assert html == "<html>3 checked</html>"
    assert rendered == [{"success": True, "statistics": {"evaluated_expectations": 3}}]
    folder = store / "fam" / stored.day / stored.folder
    assert sorted(p.name for p in folder.iterdir()) == ["page.html", "result.json"]
    # a page stored before (a run of an older version) is served as it is
    (folder / "page.html").write_text("<html>rendered by the run</html>")
    kept = evidence.page("fam", stored.day, stored.folder, render, location=store)
    assert kept == "<html>rendered by the run</html>"
    assert len(rendered) == 1
    assert evidence.page("fam", stored.day, "20261125T000000.000000Z__none", render, store) is None
    assert evidence.latest("fam", location=store) == stored
    assert evidence.stored_of("other", url, location=store) is None
    assert evidence.stored_of("fam", "s3://elsewhere/fam/2026-11-25/x", location=store) is None


KEEP_PROBE = """
import json, sys
from datetime import UTC, datetime
from counters.gx import checks, evidence
report = checks.SuiteReport(success=True, outcomes=[], result={"success": True}, fingerprint="a")
at = datetime(2026, 11, 25, 16, 10, 14, 130283, tzinfo=UTC)
url = evidence.keep("fam", "r", report, now=at, location=sys.argv[1])
imported = sorted(m for m in sys.modules if m.startswith("airflow"))
print(json.dumps({"url": url, "airflow": imported}))
"""


def test_expect_a_result_kept_outside_airflow_without_importing_it(tmp_path: Path) -> None:
    """``counterctl compact`` keeps its GX result in a local folder without importing Airflow
    (2-4 CPU-s, in the middle of its run), at the URL the store names it by (a ``file://`` URL,
    as Airflow's ``ObjectStoragePath`` names it in a task), where the UI finds it."""
    store = tmp_path / "store"
    env = {k: v for k, v in os.environ.items() if k != evidence.RESULTS_CONN_ENV}
    probe = subprocess.run(
        [sys.executable, "-c", KEEP_PROBE, str(store)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    kept = json.loads(probe.stdout)

    assert kept["airflow"] == []
    folder = "20261125T161014.130283Z__r"
    assert kept["url"] == f"{store.as_uri()}/fam/2026-11-25/{folder}"
    stored = evidence.stored_of("fam", kept["url"], location=store)
    assert stored is not None and stored.folder == folder
    result = evidence.open_file("fam", stored.day, stored.folder, "result.json", location=store)
    assert result is not None and evidence.read_json(result) == {"success": True}


def test_expect_nothing_outside_the_stored_files_served(tmp_path: Path) -> None:
    store = tmp_path / "store"
    at = datetime(2026, 11, 25, tzinfo=UTC)
    url = evidence.keep("fam", "r", suite_report(), now=at, location=store)
    stored = evidence.stored_of("fam", url, location=store)
    assert stored is not None
    (tmp_path / "secret.txt").write_text("no")
    for day, folder, name in (
        ("..", "..", "secret.txt"),
        (stored.day, stored.folder, "../../../secret.txt"),
        (stored.day, "..", "result.json"),
        ("2026-11-25", stored.folder, "other.json"),
        (stored.day, stored.folder, "page.html"),  # no page was rendered for this one
    ):
        assert evidence.open_file("fam", day, folder, name, location=store) is None


def test_a_naive_now_prunes_evidence_by_its_utc_day_not_the_hosts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``prune(now=)`` with a naive time reads it as UTC (as ``keep`` names the day folder),
    whatever this host's zone: read as local time (+14:00 here) the cutoff fell a day early
    and a folder past the kept age stayed."""
    monkeypatch.setenv("TZ", "Pacific/Kiritimati")
    time.tzset()
    try:
        store = tmp_path / "store"
        now = datetime(2026, 11, 25, 5, tzinfo=UTC)
        for days_ago, run in ((90, "kept-last"), (91, "old")):
            evidence.keep(
                "fam", run, suite_report(), now=now - timedelta(days=days_ago), location=store
            )
        naive = now.replace(tzinfo=None)
        assert evidence.prune("fam", now=naive, days_kept=90, location=store) == 1
        assert [r.run_name for r in evidence.runs("fam", location=store)] == ["kept-last"]
    finally:
        monkeypatch.undo()
        time.tzset()


def test_expect_results_kept_by_age_and_listed_newest_first(tmp_path: Path) -> None:
    store = tmp_path / "store"
    now = datetime(2026, 11, 25, 12, tzinfo=UTC)
    for days_ago, run in (
        (0, "today"),
        (89, "kept"),
        (90, "kept-last"),
        (91, "old"),
        (400, "older"),
    ):
        evidence.keep(
            "fam", run, suite_report(), now=now - timedelta(days=days_ago), location=store
        )
    evidence.keep("other", "x", suite_report(), now=now - timedelta(days=400), location=store)

    removed = evidence.prune("fam", now=now, days_kept=90, location=store)

    assert removed == 2
    assert [r.run_name for r in evidence.runs("fam", location=store)] == [
        "today",
        "kept",
        "kept-last",
    ]
    assert [r.run_name for r in evidence.runs("fam", 2, location=store)] == ["today", "kept"]
    assert evidence.runs("other", location=store)  # another family's age is its own
    assert evidence.runs("nothing", location=store) == []


def test_expect_keep_to_prune_with_the_configured_age(tmp_path: Path, monkeypatch) -> None:
    store = tmp_path / "store"
    now = datetime(2026, 11, 25, 12, tzinfo=UTC)
    evidence.keep("fam", "old", suite_report(), now=now - timedelta(days=10), location=store)
    monkeypatch.setenv(evidence.KEEP_DAYS_ENV, "7")
    evidence.keep("fam", "new", suite_report(), now=now, location=store)
    assert [r.run_name for r in evidence.runs("fam", location=store)] == ["new"]
    monkeypatch.setenv(evidence.KEEP_DAYS_ENV, "a week")
    with pytest.raises(
        evidence.EvidenceConfigError, match=r"COUNTERS_GX_KEEP_DAYS must be .* 'a week'"
    ):
        evidence.keep("fam", "x", suite_report(), now=now, location=store)


def test_integers_past_their_audit_column_are_left_out_and_kept_in_the_message():
    record = {"sum_folded": 2**63, "late_sum": -(2**63), "counters": 2**31, "message": "ran"}
    row = audit.fit_integers(record)
    assert (row["sum_folded"], row["late_sum"], row["counters"]) == (None, -(2**63), None)
    assert row["message"].startswith("ran [") and f"sum_folded {2**63}" in row["message"]
    assert f"counters {2**31}" in row["message"]
    assert audit.fit_integers({"sum_folded": 2**63 - 1, "message": "m"}) == {
        "sum_folded": 2**63 - 1,
        "message": "m",
    }


def test_a_runs_and_an_operators_audit_message_are_cut_at_one_length():
    """``audit.MESSAGE_MAX`` is the one cut of an audit row's message: a run's (its notes
    included) and an operator action's."""
    from dataclasses import replace

    from counters.audit import MESSAGE_MAX, operator_record
    from counters.compaction.outcome import RunOutcome
    from counters.compaction.plan import RunPlan
    from counters.core import Tally

    long = "x" * (MESSAGE_MAX + 10)
    at = datetime(2026, 11, 22, 10, 0)
    run = RunOutcome(RunPlan("trades", "r1", at, None, (0,)), "failed", at, "increments", Tally())
    assert len(replace(run, message=long).audit_row()["message"]) == MESSAGE_MAX
    record = operator_record(
        family(), action="release", outcome="success", run_id="r", message=long, parameters={}
    )
    assert len(record["message"]) == MESSAGE_MAX
