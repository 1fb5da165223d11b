"""A family's DAG end to end with ``dag.test()``: real tasks, real Cassandra, real receivers."""

from __future__ import annotations

import email
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from counters.airflow import tasks
from counters.audit import config_fingerprint
from counters.client import CounterClient, Increment
from counters.core import utc_aware
from counters.gx import checks
from counters.schema import SchemaError
from counters.store import Store

pytestmark = [pytest.mark.integration, pytest.mark.airflow]


def inc(counter: str, amount: int, at: Any, version: int) -> Increment:
    return Increment((counter,), amount, utc_aware(at), ("w", version))


def load(client: CounterClient, t0: Any, counters=("IBM", "AAPL")) -> None:
    """Per counter: 10 rows (1..10) at t0 .. t0+9m, and 2 rows of 100 after t0+10m."""
    events = []
    for c in counters:
        events += [inc(c, i + 1, t0 + timedelta(minutes=i), i) for i in range(10)]
        events += [inc(c, 100, t0 + timedelta(minutes=10, seconds=j + 1), 100 + j) for j in (0, 1)]
    client.record(events)


def raw_times(store: Store, counter: str) -> list[Any]:
    f = store.family
    rows = store.statements.session.execute(
        f'SELECT "{f.columns.time}" FROM {f.keyspace}.{f.raw_table} '
        f'WHERE "{f.columns.key[0]}" = %s',
        (counter,),
    )
    return [r[0] for r in rows]


def overwrite_ibm_copy(store: Store) -> Callable[[str], None]:
    """A fault hook: right after the readers' copy is written, someone overwrites IBM's
    compact value (55 -> 999), after the copy in write order: the copy's write timestamp is
    its commit's time by the run's connection's measure of the cluster's clock, and this
    connection's, measured apart, may be behind it by more than the commit took (under load:
    the overwrite then lost silently and the run ended ``success``)."""
    f = store.family
    compact = f"{f.keyspace}.{f.compact_table}"

    def tamper(point: str) -> None:
        session = store.statements.session
        row = session.execute(
            f"SELECT value, writetime(value) AS written FROM {compact} WHERE type = 'IBM'"
        ).one()
        if point == "copy" and row is not None and row.value == 55:
            session.execute(
                f"UPDATE {compact} USING TIMESTAMP %s SET value = 999 WHERE type = 'IBM'",
                (row.written + 1,),
            )

    return tamper


def states(run: Any) -> dict[str, str]:
    """task_id[map_index] -> state of a finished DagRun."""
    out = {}
    for ti in run.get_task_instances():
        key = ti.task_id if ti.map_index < 0 else f"{ti.task_id}[{ti.map_index}]"
        out[key] = str(ti.state.value if hasattr(ti.state, "value") else ti.state)
    return out


def test_run_folds_increments_deletes_raw_rows_and_records_audit(
    conn, make_families, dagbag, t0, tmp_path: Path
):
    families = make_families({}, shape="mapped")
    family = families.family(families.entries[0]["name"])
    store = Store(conn, family)
    client = CounterClient(conn, family, store)
    load(client, t0)
    before = {v.counter[0]: v.value for v in client.read_many(["IBM", "AAPL"])}
    epoch = t0 + timedelta(minutes=10)

    dag = dagbag().dags[family.dag_id]
    run = dag.test(logical_date=utc_aware(epoch + family.lag + timedelta(seconds=30)))

    assert run.state == "success", states(run)
    got = states(run)  # a first run sweeps: every phase in its own (mapped) task
    assert set(got.values()) == {"success"}, got
    for counter in ("IBM", "AAPL"):
        value = client.read_many([counter])[0]
        assert (value.compact_value, value.epoch, value.value) == (55, epoch, before[counter])
        assert sorted(t for t in raw_times(store, counter) if t <= epoch) == []
        assert len(raw_times(store, counter)) == 2  # the newer rows are untouched
    audit = store.audit.page(5)
    assert [a["outcome"] for a in audit] == ["success"]
    assert audit[0]["run_id"] == run.run_id
    assert (audit[0]["rows_folded"], audit[0]["sum_folded"], audit[0]["rows_deleted"]) == (
        20,
        110,
        20,
    )
    assert audit[0]["epoch_after"] == epoch
    assert store.state.family_epoch() == epoch
    # who started it (dag.test() triggers as the user "dag_test"), under what, and its evidence
    row = audit[0]
    assert (row["triggered_by"], row["airflow_user"], row["sweep"]) == ("manual", "dag_test", True)
    assert json.loads(row["parameters"])["dag_run_id"] == run.run_id
    assert row["config_hash"] == config_fingerprint(family)
    assert row["gx_suite"] and row["gx_suite"] == checks._suite_fingerprint(checks.rules())
    stored = Path(row["gx_result"].removeprefix("file://"))
    assert stored.is_relative_to(tmp_path / "gx-results" / family.name)
    result = json.loads((stored / "result.json").read_text())
    assert result["success"] and result["meta"]["run_id"]["run_name"] == checks.run_name(run.run_id)
    assert not (stored / "page.html").exists()  # rendered when someone opens it (the UI)
    assert not (tmp_path / "gx").exists()  # no GX project written by the run


def alert_channels(inbox: Any) -> dict[str, Any]:
    return {
        "email": ["oncall@example.com"],
        "slack_webhook_conn_id": "counters_slack",
        "webhook_url": f"http://127.0.0.1:{inbox.http_port}/hook",
    }


def mail_text(envelope: Any) -> str:
    message = email.message_from_bytes(envelope.content)
    parts = [message["Subject"] or ""]
    for part in message.walk():
        payload = part.get_payload(decode=True)
        if payload:
            parts.append(payload.decode(part.get_content_charset() or "utf-8"))
    return "\n".join(parts)


def test_tampered_counter_is_quarantined_the_rest_compacted_and_the_run_alerts(
    conn, make_families, dagbag, receivers, t0
):
    families = make_families({"alerts": alert_channels(receivers)}, shape="mapped")
    family = families.family(families.entries[0]["name"])
    store = Store(conn, family)
    client = CounterClient(conn, family, store)
    load(client, t0)
    epoch = t0 + timedelta(minutes=10)
    tamper = overwrite_ibm_copy(store)
    dag = dagbag().dags[family.dag_id]
    with tasks.fault_hook(tamper):
        run = dag.test(logical_date=utc_aware(epoch + family.lag))

    assert run.state == "failed"
    got = states(run)
    assert got["record_audit"] == "failed", got
    assert {v for k, v in got.items() if k != "record_audit"} == {"success"}, got
    assert len([t for t in raw_times(store, "IBM") if t <= epoch]) == 10  # nothing of it deleted
    assert [t for t in raw_times(store, "AAPL") if t <= epoch] == []  # the rest proceeds
    assert client.read("AAPL") == 255
    assert store.state.family_epoch() == epoch
    audit = store.audit.page(5)
    assert [a["outcome"] for a in audit] == ["partial"]
    assert "IBM: compact value 999 (expected 55 = 0 + 55)" in audit[0]["message"]

    # the alert, delivered to a real SMTP server, the Slack webhook and the JSON webhook
    assert len(receivers.mails) == 1
    assert receivers.mails[0].rcpt_tos == ["oncall@example.com"]
    text = mail_text(receivers.mails[0])
    hooks = receivers.json_posts("/hook")
    slack = receivers.json_posts("/slack")
    assert len(hooks) == 1 and len(slack) == 1
    hook = hooks[0]
    assert hook["family"] == family.name and hook["run_id"] == run.run_id
    assert hook["task"] == "record_audit"
    assert "no_counter_quarantined" in hook["checks"]
    assert "IBM: compact value 999 (expected 55 = 0 + 55)" in hook["counters"]
    log_url = f"/dags/{family.dag_id}/runs/{quote(run.run_id)}/tasks/record_audit"
    assert log_url in hook["log_url"]
    for body in (text, slack[0]["text"]):
        for needle in (family.name, run.run_id, "no_counter_quarantined"):
            assert needle in body
        assert "IBM: compact value 999 (expected 55 = 0 + 55)" in body
        assert log_url in body


@pytest.mark.parametrize("shard_tasks", [True, False], ids=["mapped", "one-task"])
def test_task_failing_for_good_on_an_unaudited_error_still_leaves_the_audit_row(
    conn, make_families, dagbag, t0, shard_tasks
):
    """A task dies on an error no task audits (here the raw table's schema changed under the
    run, which the retry policy does not retry): its failure callback writes the run's
    ``failed`` audit row, naming the task and the error, with the run's own plan (a sweep:
    the family's first run), read from XCom ``run`` in the mapped shape and from the task's
    process in the one-task shape, which pushes no plan; nothing is deleted."""
    families = make_families({}, shape="mapped" if shard_tasks else "one-task")
    family = families.family(families.entries[0]["name"])
    store = Store(conn, family)
    load(CounterClient(conn, family, store), t0)
    epoch = t0 + timedelta(minutes=10)

    def schema_changed(point: str) -> None:
        if point == "discover":
            raise SchemaError(f"family {family.name!r}: column 'increment' is gone")

    dag = dagbag().dags[family.dag_id]
    with tasks.fault_hook(schema_changed):
        run = dag.test(logical_date=utc_aware(epoch + family.lag))

    assert run.state == "failed"
    got = states(run)
    failed = ["compact[0]", "compact[1]"] if shard_tasks else ["run"]
    assert {got[task] for task in failed} == {"failed"}, got
    for counter in ("IBM", "AAPL"):  # nothing folded, nothing deleted
        assert len(raw_times(store, counter)) == 12
    audit = store.audit.page(5)
    assert [a["outcome"] for a in audit] == ["failed"]
    assert audit[0]["run_id"] == run.run_id and audit[0]["sweep"], audit[0]
    assert f"task {'compact[' if shard_tasks else 'run'}" in audit[0]["message"]
    assert "SchemaError" in audit[0]["message"]
    assert "column 'increment' is gone" in audit[0]["message"]


def test_dry_run_with_epoch_param_writes_nothing_but_its_audit_row(conn, make_families, dagbag, t0):
    families = make_families({}, shape="mapped")
    family = families.family(families.entries[0]["name"])
    store = Store(conn, family)
    client = CounterClient(conn, family, store)
    load(client, t0)
    epoch = t0 + timedelta(minutes=4, seconds=30)

    dag = dagbag().dags[family.dag_id]
    run = dag.test(
        logical_date=utc_aware(t0 + timedelta(minutes=30)),
        run_conf={"dry_run": True, "epoch": epoch.isoformat()},
    )

    assert run.state == "success"
    got = states(run)
    assert got["verify"] == "skipped" and got["record_audit"] == "skipped", got
    audit = store.audit.page(5)
    assert [a["outcome"] for a in audit] == ["dry-run"]
    assert audit[0]["dry_run"] is True
    assert (audit[0]["rows_folded"], audit[0]["sum_folded"]) == (10, 2 * 15)  # rows 1..5
    assert store.state.family_epoch() is None
    assert client.read_many(["IBM"])[0].compact_value == 0
    assert len(raw_times(store, "IBM")) == 12


def test_backfill_runs_advance_the_epoch_in_order_and_older_ones_are_noops(
    conn, make_families, dagbag, t0
):
    families = make_families({"shards": 1}, shape="mapped")
    family = families.family(families.entries[0]["name"])
    store = Store(conn, family)
    client = CounterClient(conn, family, store)
    load(client, t0, counters=("IBM",))
    dag = dagbag().dags[family.dag_id]

    for minutes, expected in ((3, 1 + 2 + 3 + 4), (6, 28), (9, 55)):
        epoch = t0 + timedelta(minutes=minutes)
        run = dag.test(logical_date=utc_aware(epoch + family.lag))
        assert run.state == "success", states(run)
        value = client.read_many(["IBM"])[0]
        assert (value.compact_value, value.epoch, value.value) == (expected, epoch, 255)
        assert store.state.family_epoch() == epoch

    older = dag.test(logical_date=utc_aware(t0 + timedelta(minutes=5) + family.lag))
    assert older.state == "success"
    got = states(older)
    assert got["run"] == "skipped" and got["compact"] == "skipped", got
    audit = store.audit.page(10)
    assert [a["outcome"] for a in audit] == ["noop", "success", "success", "success"]
    assert [a["epoch_after"] for a in audit[1:]] == [t0 + timedelta(minutes=m) for m in (9, 6, 3)]
    assert "not newer than the compacted epoch" in audit[0]["message"]
    assert store.state.family_epoch() == t0 + timedelta(minutes=9)


def test_small_run_does_every_phase_in_one_task_and_a_sweep_maps_them(
    conn, make_families, dagbag, t0
):
    families = make_families({"shards": 2}, shape="mapped")
    family = families.family(families.entries[0]["name"])
    store = Store(conn, family)
    client = CounterClient(conn, family, store)
    load(client, t0)
    dag = dagbag().dags[family.dag_id]

    first = dag.test(logical_date=utc_aware(t0 + timedelta(minutes=5) + family.lag))
    assert first.state == "success", states(first)
    got = states(first)  # the family's first run sweeps: the phases are mapped over shards
    assert {got["run"], got["compact[0]"], got["compact[1]"], got["record_audit"]} == {"success"}, (
        got
    )

    epoch = t0 + timedelta(minutes=10)
    second = dag.test(logical_date=utc_aware(epoch + family.lag))
    assert second.state == "success", states(second)
    got = states(second)  # few counters touched, no sweep due: one task does it all
    assert got.pop("run") == "success", got
    assert set(got.values()) == {"skipped"}, got
    # every task of the DAG has a task instance row in every run, skipped or not: a small run
    # costs five rows (the scheduler examines and skips four); a sixth task would show here
    assert len(second.get_task_instances()) == 5
    assert sorted(got) == ["cleanup", "compact", "record_audit", "verify"], got
    summary = next(
        ti.xcom_pull(task_ids="run", key="summary")
        for ti in second.get_task_instances()
        if ti.task_id == "run"
    )
    assert summary["outcome"] == "success" and summary["rows_folded"] == 8
    for counter in ("IBM", "AAPL"):
        value = client.read_many([counter])[0]
        assert (value.compact_value, value.epoch, value.value) == (55, epoch, 255)
        assert len(raw_times(store, counter)) == 2  # rows <= epoch deleted, the newer kept
    audit = store.audit.page(5)
    assert [a["outcome"] for a in audit] == ["success", "success"]
    assert audit[0]["run_id"] == second.run_id and audit[0]["rows_deleted"] == 8
    checks = json.loads(audit[0]["checks"])  # stored as JSON text
    assert checks["gx:recount_equals_counted_rows"] == "pass", checks


def test_a_family_without_shard_tasks_does_every_run_whole_in_one_task_instance(
    conn, make_families, dagbag, t0, api_requests
):
    """``shard_tasks: false``: the DAG is the ``run`` task alone, one task instance per run;
    the first run (a sweep, which the five-task DAG maps over shards) and a small one both
    fold, check (GX included), delete and audit there. Its task asks the execution API only
    what it needs: no rendered fields (a plain operator without template fields), one XCom
    (``summary``: the plan is not pushed), the inlets' check, the streak, the end."""
    families = make_families({"shards": 2}, shape="one-task")
    family = families.family(families.entries[0]["name"])
    store = Store(conn, family)
    client = CounterClient(conn, family, store)
    load(client, t0)
    dag = dagbag().dags[family.dag_id]
    assert [t.task_id for t in dag.tasks] == ["run"]

    first = dag.test(logical_date=utc_aware(t0 + timedelta(minutes=5) + family.lag))
    assert first.state == "success" and states(first) == {"run": "success"}, states(first)
    epoch = t0 + timedelta(minutes=10)
    api_requests.clear()
    second = dag.test(logical_date=utc_aware(epoch + family.lag))
    assert second.state == "success" and states(second) == {"run": "success"}, states(second)
    assert [what for task, what in api_requests if task == "run"] == [
        "ValidateInletsAndOutlets",
        "SetXCom",
        "GetVariable",
        "SucceedTask",
    ], api_requests
    assert second.get_task_instances()[0].xcom_pull(task_ids="run", key="summary")["epoch"]
    for counter in ("IBM", "AAPL"):
        value = client.read_many([counter])[0]
        assert (value.compact_value, value.epoch, value.value) == (55, epoch, 255)
        assert len(raw_times(store, counter)) == 2  # rows <= epoch deleted, the newer kept
    audit = store.audit.page(5)
    assert [a["outcome"] for a in audit] == ["success", "success"]
    assert [a["rows_deleted"] for a in audit] == [8, 12]
    for row in audit:
        checks_ = json.loads(row["checks"])
        assert checks_["gx:recount_equals_counted_rows"] == "pass", checks_
        assert checks_["no_counted_rows_remain_after_cleanup"].startswith("pass"), checks_


def test_a_failed_check_in_the_one_task_dag_deletes_nothing_of_that_counter(
    conn, make_families, dagbag, t0
):
    """The one-task DAG checks as the mapped one does: a counter whose readers' copy is
    overwritten during the run is quarantined before anything of it is deleted, the run fails
    (``partial``) and the rest is compacted."""
    families = make_families({}, shape="one-task")
    family = families.family(families.entries[0]["name"])
    store = Store(conn, family)
    client = CounterClient(conn, family, store)
    load(client, t0)
    epoch = t0 + timedelta(minutes=10)
    tamper = overwrite_ibm_copy(store)
    dag = dagbag().dags[family.dag_id]
    with tasks.fault_hook(tamper):
        run = dag.test(logical_date=utc_aware(epoch + family.lag))

    assert run.state == "failed" and states(run) == {"run": "failed"}, states(run)
    assert len([t for t in raw_times(store, "IBM") if t <= epoch]) == 10  # nothing of it deleted
    assert [t for t in raw_times(store, "AAPL") if t <= epoch] == []
    assert client.read("AAPL") == 255
    audit = store.audit.page(5)
    assert [a["outcome"] for a in audit] == ["partial"]
    assert "IBM: compact value 999 (expected 55 = 0 + 55)" in audit[0]["message"]


def test_a_run_archives_the_rows_it_deletes_and_its_one_audit_row_holds_the_manifests(
    conn, make_families, dagbag, t0, tmp_path: Path
):
    """The DAG's cleanup tasks archive before they delete: the files are in the family's
    archive, their manifests in the run's one audit row (written by the cleanup tasks before
    their deletes, completed by record_audit), and the recount from them equals the compact
    table."""
    import hashlib

    from counters.archive import Manifest
    from counters.recount import recount

    families = make_families(
        {"archive": str(tmp_path / "archive"), "archive_retention": "30d"}, shape="mapped"
    )
    family = families.family(families.entries[0]["name"])
    store = Store(conn, family)
    client = CounterClient(conn, family, store)
    load(client, t0)
    epoch = t0 + timedelta(minutes=10)
    run = (
        dagbag()
        .dags[family.dag_id]
        .test(logical_date=utc_aware(epoch + family.lag + timedelta(seconds=30)))
    )
    assert run.state == "success", states(run)
    [row] = store.audit.page(5)  # one row: the manifests and the run's outcome together
    assert (row["outcome"], row["run_id"], row["rows_deleted"]) == ("success", run.run_id, 20)
    manifests = [Manifest.from_text(text) for text in row["archive"].values()]
    assert sum(m.rows for m in manifests) == 20 and sum(m.sum for m in manifests) == 110
    for manifest in manifests:
        data = Path(manifest.url.removeprefix("file://")).read_bytes()
        assert hashlib.sha256(data).hexdigest() == manifest.sha256
        assert Path(manifest.url).parent.parent.name == family.name
    report = recount(store)
    assert report.ok and {r.counter: r.rebuilt for r in report.counters} == {
        ("IBM",): 55,
        ("AAPL",): 55,
    }


def test_a_counted_row_left_after_cleanup_fails_record_audit_before_the_epoch_advances(
    conn, make_families, dagbag, t0
):
    """``record_audit`` checks the cleanup before it audits: a counted row that outlives its
    delete fails the run with a ``failed`` audit row naming the check, and the family's
    compacted epoch does not advance. Here its key alone is written again, with a write time
    after the tombstone's (a clock far ahead): the check cannot read a key's own write time, so
    it cannot delete the row again as it does one whose columns are stamped ahead."""
    families = make_families({}, shape="mapped")
    family = families.family(families.entries[0]["name"])
    store = Store(conn, family)
    load(CounterClient(conn, family, store), t0)
    epoch = t0 + timedelta(minutes=10)
    raw = f"{family.keyspace}.{family.raw_table}"
    rewritten: list[str] = []

    def outlive_the_delete(point: str) -> None:
        """Before the first cleanup deletes: IBM's first row's key (counted: at t0, before the
        epoch) written again, far in the future, without its increment."""
        if point == "cleanup_read_log" and not rewritten:
            rows = store.statements.session.execute(f"SELECT JSON * FROM {raw} WHERE type = 'IBM'")
            row = min((json.loads(r[0]) for r in rows), key=lambda r: r["modify_time"])
            first = json.dumps({k: v for k, v in row.items() if k != "increment"})
            future_us = int((datetime.now(UTC) + timedelta(days=30)).timestamp() * 1_000_000)
            store.statements.session.execute(
                f"INSERT INTO {raw} JSON %s USING TIMESTAMP {future_us}", (first,)
            )
            rewritten.append(first)

    dag = dagbag().dags[family.dag_id]
    with tasks.fault_hook(outlive_the_delete):
        run = dag.test(logical_date=utc_aware(epoch + family.lag))

    assert rewritten and run.state == "failed"
    got = states(run)  # the first run sweeps: the mapped shape
    assert got["record_audit"] == "failed", got
    assert {v for k, v in got.items() if k != "record_audit"} == {"success"}, got
    audit = store.audit.page(5)
    assert [a["outcome"] for a in audit] == ["failed"]
    assert "cleanup check failed" in audit[0]["message"]
    cleanup_check = json.loads(audit[0]["checks"])["no_counted_rows_remain_after_cleanup"]
    assert cleanup_check.startswith("FAIL: 1 counted row(s) still present"), cleanup_check
    assert store.state.family_epoch() is None  # not advanced: the run did not finish
