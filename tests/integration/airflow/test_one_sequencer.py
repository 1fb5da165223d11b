"""``counterctl compact`` and the DAG run one sequence of a run's steps: the same family data
compacted once by each path leaves the same audit rows (outcome, tally, checks with the GX
suite's, message) and the same run summary (``counterctl compact --json`` against the DAG's
XCom: both ``RunOutcome.summary``): a sweep (the DAG's mapped tasks), then a small run (its
``run`` task alone); and a sweep whose GX suite fails."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from click.testing import CliRunner
from counters.cli import cli
from counters.client import CounterClient
from counters.core import utc_aware as aware
from counters.store import Store

from tests.gx_rules import add_failing_rule
from tests.integration.airflow.test_compaction_dag import load, states

pytestmark = [pytest.mark.integration, pytest.mark.airflow]

COMPARED = (
    "outcome",
    "kind",
    "dry_run",
    "sweep",
    "epoch_before",
    "epoch_after",
    "counters",
    "rows_folded",
    "sum_folded",
    "late_rows",
    "late_sum",
    "conflicts",
    "rows_deleted",
    "checks",
    "message",
    "gx_suite",
)
"""Every column of a run's audit row but its ids, times, provenance and the family's name."""


def compared(row: dict[str, Any]) -> dict[str, Any]:
    """The row's compared columns, the names that differ between the two families' runs (its
    GX result's folder, the family, the run id) replaced by placeholders."""

    def same(text: str) -> str:
        for name, placeholder in (
            (row["gx_result"], "<gx_result>"),
            (row["run_id"], "<run>"),
            (row["family"], "<family>"),
        ):
            text = text.replace(name, placeholder) if name else text
        return text

    out = {column: row[column] for column in COMPARED}
    out["checks"] = {k: same(v) for k, v in json.loads(row["checks"]).items()}
    out["message"] = same(row["message"] or "")
    return out


SUMMARY_DIFFERS = ("family", "run_id", "gx_result", "peak_rss_mib", "durations_s", "requests")
"""What a run's summary may differ in between the paths: names, and what working it cost (the
CLI's processes against the DAG's tasks)."""


def same_summary(summary: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in summary.items() if k not in SUMMARY_DIFFERS}
    out["message"] = (
        summary["message"]
        .replace(summary["run_id"], "<run>")
        .replace(summary["family"], "<family>")
    )
    return out


def dag_summary(run: Any) -> dict[str, Any]:
    """A successful DAG run's summary XCom: ``record_audit``'s return value (a mapped run), or
    ``run``'s ``summary`` (a run done whole there)."""
    by_task = {ti.task_id: ti for ti in run.get_task_instances()}
    mapped = by_task["record_audit"].xcom_pull(task_ids="record_audit")
    whole = by_task["run"].xcom_pull(task_ids="run", key="summary")
    summary: dict[str, Any] = mapped or whole
    return summary


def run_both(
    by_cli: Any, by_dag: Any, dag: Any, epochs: list[Any]
) -> tuple[list[int], list[tuple[str, dict[str, str]]], list[tuple[Any, Any]]]:
    """Each epoch's run by ``counterctl compact --json`` on one family, then by the DAG on the
    other: the CLI's exit codes, the DAG runs' states, and both summaries of each successful
    run."""
    codes, ran, summaries = [], [], []
    for epoch in epochs:
        command = ["compact", "--family", by_cli.name, "--epoch", epoch.isoformat(), "--json"]
        result = CliRunner().invoke(cli, command)
        codes.append(result.exit_code)
        run = dag.test(logical_date=aware(epoch + by_dag.lag))
        ran.append((run.state, states(run)))
        if result.exit_code == 0:
            summaries.append((json.loads(result.stdout), dag_summary(run)))
    return codes, ran, summaries


def test_the_cli_and_the_dag_leave_the_same_audit_rows(
    conn, make_families, dagbag, t0, monkeypatch
):
    families = make_families(*({"shards": 2} for _ in range(4)), shape="mapped")
    cli_ok, dag_ok, cli_bad, dag_bad = (families.family(e["name"]) for e in families.entries)
    for family in (cli_ok, dag_ok, cli_bad, dag_bad):
        load(CounterClient(conn, family, Store(conn, family)), t0)
    bag = dagbag()
    first, second = t0 + timedelta(minutes=5), t0 + timedelta(minutes=10)

    codes, ran, summaries = run_both(cli_ok, dag_ok, bag.dags[dag_ok.dag_id], [first, second])
    # a suite is built per family and process on first use: these two families' first one
    # has the failing rule (the engine's own checks pass)
    failing = add_failing_rule(monkeypatch)
    bad_codes, bad_ran, _ = run_both(cli_bad, dag_bad, bag.dags[dag_bad.dag_id], [first])

    assert codes + bad_codes == [0, 0, 4], codes + bad_codes
    assert [state for state, _ in ran + bad_ran] == ["success", "success", "failed"], ran
    mapped, small = ran[0][1], ran[1][1]
    assert mapped["compact[1]"] == "success" and small["compact"] == "skipped", ran
    cli_rows = [*Store(conn, cli_ok).audit.page(10)[::-1], *Store(conn, cli_bad).audit.page(10)]
    dag_rows = [*Store(conn, dag_ok).audit.page(10)[::-1], *Store(conn, dag_bad).audit.page(10)]
    assert [r["outcome"] for r in cli_rows] == ["success", "success", "failed"]
    assert [compared(r) for r in cli_rows] == [compared(r) for r in dag_rows]
    assert failing in json.loads(cli_rows[2]["checks"]), cli_rows[2]["checks"]
    assert all(r["gx_suite"] and r["gx_result"] for r in cli_rows + dag_rows)
    assert cli_rows[0]["sweep"] and not cli_rows[1]["sweep"]
    assert len(summaries) == 2 and summaries[0][0]["rows_folded"] > 0, summaries
    for by_cli, by_dag in summaries:  # the sweep's (mapped tasks), then the small run's
        assert list(by_cli) == list(by_dag)
        assert same_summary(by_cli) == same_summary(by_dag)
