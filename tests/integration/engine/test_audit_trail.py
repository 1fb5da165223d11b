"""The audit trail against the real node: month partitions read across, the upgrade from one
partition per family (crash, resume, stragglers), every operator action recorded with who did
it, and exports of any length."""

from __future__ import annotations

import csv
import io
import json
import secrets
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import time_machine
import yaml
from cassandra.concurrent import execute_concurrent_with_args
from click.testing import CliRunner
from counters import audit, engine, status
from counters.cli import cli
from counters.client import Increment
from counters.connection import Connection
from counters.core import utc_aware
from counters.schema import AUDIT_TABLE, AUDIT_UPGRADE_TABLE, LEGACY_AUDIT_TABLE
from counters.store import Store
from counters.store.auditlog import LEGACY_COLUMNS

from .conftest import Crash
from .helpers import aware, sha256_of_configuration

pytestmark = pytest.mark.integration

LEGACY_DDL = (
    "CREATE TABLE IF NOT EXISTS {ks}.counters_audit (family text, started_at timestamp, "
    "run_id text, kind text, outcome text, dry_run boolean, epoch_before timestamp, "
    "epoch_after timestamp, counters int, rows_folded bigint, sum_folded bigint, "
    "late_rows bigint, late_sum bigint, max_lateness_ms bigint, conflicts int, "
    "rows_deleted bigint, checks text, durations text, message text, "
    "PRIMARY KEY ((family), started_at, run_id)) "
    "WITH CLUSTERING ORDER BY (started_at DESC, run_id ASC)"
)
"""``keyspace_ddl``'s audit table before the month partitions, as it created it."""


def families_yaml(path: Path, *families: Any) -> Path:
    """The families as a YAML counterctl loads (durations in seconds)."""
    entries = []
    for family in families:
        entry = family.model_dump(mode="json")
        for name in ("lag", "sweep_interval", "sweep_offset", "freshness"):
            value = getattr(family, name)
            entry[name] = None if value is None else f"{int(value.total_seconds())}s"
        entries.append({k: v for k, v in entry.items() if v is not None})
    path.write_text(yaml.safe_dump({"families": entries}))
    return path


def invoke(*args: Any) -> Any:
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def record(family: Any, at: datetime, run_id: str, **fields: Any) -> dict[str, Any]:
    return {
        "family": family.name,
        "started_at": at,
        "run_id": run_id,
        "outcome": "success",
    } | fields


def per_month(store: Store) -> dict[str, int]:
    ks = store.family.keyspace
    return {
        month: store.statements.session.execute(
            f"SELECT count(*) FROM {ks}.{AUDIT_TABLE} WHERE family = %s AND month = %s",
            (store.family.name, month),
        ).one()[0]
        for month in store.audit.months()
    }


def test_expect_rows_in_month_partitions_read_newest_first_across_them(make_family) -> None:
    family, store, _client = make_family()
    times = (
        [datetime(2026, 9, 30, 23, 58) + timedelta(minutes=i) for i in range(3)]  # 2 Sep, 1 Oct
        + [datetime(2026, 10, 31, 23, 58) + timedelta(minutes=i) for i in range(3)]  # 2 Oct, 1 Nov
        + [datetime(2027, 1, 1, 0, 0) + timedelta(minutes=i) for i in range(4)]  # Dec is empty
    )
    for i, at in enumerate(times):
        store.audit.write(record(family, at, f"r{i}", counters=i))
    newest_first = [f"r{i}" for i in reversed(range(10))]

    assert store.audit.months() == ["2027-01", "2026-11", "2026-10", "2026-09"]
    assert per_month(store) == {"2027-01": 4, "2026-11": 1, "2026-10": 3, "2026-09": 2}
    assert [r["run_id"] for r in store.audit.page(6)] == newest_first[:6]  # three partitions
    older = store.audit.page(3, before=times[6])
    assert [r["run_id"] for r in older] == ["r5", "r4", "r3"]  # Nov then Oct
    ranged = status.audit_page(store, 100, since=times[1], before=times[7])
    assert [r.run_id for r in ranged] == ["r6", "r5", "r4", "r3", "r2", "r1"]
    streamed = [r.run_id for r in status.audit_stream(store, page_rows=2)]
    assert streamed == newest_first
    assert [r.run_id for r in status.audit_stream(store, times[8], None, page_rows=1)] == [
        "r9",
        "r8",
    ]
    assert store.audit.page(5, since=datetime(2027, 2, 1)) == []
    with pytest.raises(ValueError, match=r"since .* must be before until"):
        list(status.audit_stream(store, times[5], times[2]))


def _legacy_rows(family_name: str, start: datetime, count: int) -> list[tuple[Any, ...]]:
    """Rows as versions before the month partitions wrote them, an hour apart from ``start``."""
    return [
        (
            family_name,
            start + timedelta(hours=i),
            f"scheduled__{i}",
            "increments",
            "reset" if i == 7 else "success",
            False,
            start + timedelta(hours=i - 1),
            start + timedelta(hours=i, minutes=-1),
            i % 5,
            i,
            3 * i,
            0,
            0,
            0,
            0,
            i,
            json.dumps({"recount_equals_counted_rows": "pass"}),
            json.dumps({"plan": 0.01}),
            f"row {i}",
        )
        for i in range(count)
    ]


def _write_legacy(store: Store, rows: list[tuple[Any, ...]], now: bool = False) -> None:
    """Write the rows as an older version did: when their run ended (``now``: just now, on
    this host's clock, as its driver's default timestamps were)."""
    ks = store.family.keyspace
    store.statements.session.execute(LEGACY_DDL.format(ks=ks))
    insert = store.statements.session.prepare(
        f"INSERT INTO {ks}.{LEGACY_AUDIT_TABLE} ({', '.join(LEGACY_COLUMNS)}) "
        f"VALUES ({', '.join('?' for _ in LEGACY_COLUMNS)}) USING TIMESTAMP ?"
    )
    written = [
        (*row, int(time.time() * 1e6))
        if now
        else (*row, int(row[1].replace(tzinfo=UTC).timestamp() * 1e6) + 30_000_000)
        for row in rows
    ]
    execute_concurrent_with_args(store.statements.session, insert, written, concurrency=50)


def _legacy_left(store: Store) -> int:
    return store.statements.session.execute(
        f"SELECT count(*) FROM {store.family.keyspace}.{LEGACY_AUDIT_TABLE} WHERE family = %s",
        (store.family.name,),
    ).one()[0]


def test_expect_the_upgrade_to_move_every_legacy_row_once_and_resume_after_a_crash(
    make_family, tmp_path: Path
) -> None:
    family, store, _client = make_family()
    other, other_store, _ = make_family()
    start = datetime(2026, 1, 28)  # 2,500 hours: Jan 28 .. May 12 2026, five months
    legacy = _legacy_rows(family.name, start, 2500)
    _write_legacy(store, legacy)
    _write_legacy(other_store, _legacy_rows(other.name, start, 3))

    def crash(moved: int) -> None:
        raise Crash(f"killed after {moved} rows")

    with pytest.raises(Crash):
        store.audit.upgrade(page_rows=1000, after_page=crash)
    state = store.statements.session.execute(
        f"SELECT cursor, copied, finished_at FROM {family.keyspace}.{AUDIT_UPGRADE_TABLE} "
        "WHERE family = %s",
        (family.name,),
    ).one()
    assert (state.cursor, state.copied, state.finished_at) == (legacy[999][1], 1000, None)
    assert sum(per_month(store).values()) == 1000 and _legacy_left(store) == 2500

    resumed = Store(store.conn, family).audit.upgrade(page_rows=1000)

    assert resumed == 1501  # from the cursor (its row again: same key, same row), not the start
    assert per_month(store) == {
        "2026-05": 268,
        "2026-04": 720,
        "2026-03": 744,
        "2026-02": 672,
        "2026-01": 96,
    }
    moved = {(r["started_at"], r["run_id"]): r for r in status_rows(store)}
    assert len(moved) == 2500
    for row in legacy:
        copy = moved[(row[1], row[2])]
        assert tuple(copy[c] for c in LEGACY_COLUMNS) == row
        assert copy["action"] == ("reset" if row[4] == "reset" else "compact")
        assert copy["triggered_by"] is None  # who wrote a legacy row is not known: not guessed
    assert _legacy_left(store) == 0 and _legacy_left(other_store) == 3  # one family at a time
    assert Store(store.conn, family).audit.upgrade() == 0  # done: nothing moved twice

    # an older version still running wrote a row after the move: the next init moves it
    _write_legacy(store, _legacy_rows(family.name, datetime(2026, 5, 12, 12), 1), now=True)
    assert Store(store.conn, family).audit.upgrade(margin=timedelta(0)) == 1
    assert _legacy_left(store) == 0 and sum(per_month(store).values()) == 2501

    # counterctl init upgrades a family of a keyspace written by today's schema
    path = families_yaml(tmp_path / "families.yaml", other)
    result = invoke("--config", path, "init", "--family", other.name)
    assert result.exit_code == 0, result.output
    assert f"{other.name}: 3 audit row(s) moved from {family.keyspace}.counters_audit" in (
        result.output
    )
    assert [r["run_id"] for r in other_store.audit.page(5)] == [
        f"scheduled__{i}" for i in (2, 1, 0)
    ]
    again = invoke("--config", path, "init", "--family", other.name)
    assert again.exit_code == 0 and "moved" not in again.output


def test_a_legacy_row_an_older_version_writes_during_the_upgrade_is_moved_not_lost(
    conn: Connection, make_family
) -> None:
    """An older version still running on a host 10 s behind the cluster (within the tolerance)
    writes a legacy row while the upgrade moves the partition: the upgrade's delete, stamped on
    this host's clock as that row is, leaves it, and the next upgrade moves it. Stamped on the
    cluster's clock (what the upgrade's connection stamps its own writes with), the delete was
    10 s newer than the row and removed it unmoved: a run's audit row lost."""
    family, store, _client = make_family()
    with time_machine.travel(datetime.now(UTC) - timedelta(seconds=10), tick=True):
        behind = Connection(conn.settings)  # its own clock offset: the session's is left alone
        try:
            assert -11 < behind.cluster_clock().offset.seconds < -9
            on_behind = Store(behind, family, store.layout)
            _write_legacy(on_behind, _legacy_rows(family.name, datetime(2026, 5, 1), 1), now=True)

            def older_version_writes(_moved: int) -> None:
                late = _legacy_rows(family.name, datetime(2026, 5, 2), 1)
                _write_legacy(on_behind, late, now=True)

            moved = on_behind.audit.upgrade(margin=timedelta(0), after_page=older_version_writes)
            assert moved == 1 and _legacy_left(store) == 1  # the late row stays, unmoved
            assert on_behind.audit.upgrade(margin=timedelta(0)) == 1
        finally:
            behind.close()
    assert _legacy_left(store) == 0 and sum(per_month(store).values()) == 2


def status_rows(store: Store) -> list[dict[str, Any]]:
    return list(store.audit.stream())


@pytest.fixture
def cli_families(make_family, tmp_path: Path) -> tuple[Path, Any, Any]:
    """An increments family and a unique one, in a YAML for counterctl."""
    trades, *_ = make_family()
    meetings, *_ = make_family(
        kind="unique",
        raw_table=f"members_{secrets.token_hex(3)}",
        columns={"key": "meeting", "member": "user"},
    )
    return families_yaml(tmp_path / "families.yaml", trades, meetings), trades, meetings


def test_expect_every_change_through_counterctl_audited_with_who_did_it(
    cli_families, conn, t0: datetime
) -> None:
    path, trades, meetings = cli_families
    store = Store(conn, trades)
    from counters.client import CounterClient

    client = CounterClient(conn, trades, store)
    client.record(
        [
            Increment(("IBM",), 5, utc_aware(t0), ("w", 1)),
            Increment(("AAPL",), 7, utc_aware(t0), ("w", 2)),
        ]
    )
    epoch = (t0 + timedelta(minutes=5)).isoformat()
    assert (
        invoke("--config", path, "compact", "--family", trades.name, "--epoch", epoch).exit_code
        == 0
    )
    reset_at = (t0 + timedelta(minutes=6)).isoformat()
    assert (
        invoke(
            "--config", path, "reset", "--family", trades.name, "--at", reset_at, "--yes", "IBM"
        ).exit_code
        == 0
    )
    # a counter with a NULL increment (a writer outside the API) is quarantined by a run ...
    conn.session.execute(
        f"INSERT INTO {trades.keyspace}.{trades.raw_table} (type, modify_time, actor, version) "
        "VALUES ('BROKEN', %s, 'bad-writer', 1)",
        (t0 + timedelta(minutes=7),),
    )
    store.index.mark_touched([("BROKEN",)])
    with pytest.raises(engine.ChecksFailed, match=r"1 counter.s. quarantined"):
        engine.run_family(store, t0 + timedelta(minutes=8), "run-quarantine")
    # ... and released by an operator
    released = invoke(
        "--config", path, "quarantine", "--family", trades.name, "--release", "BROKEN"
    )
    assert released.exit_code == 0, released.output
    # a unique family's member whose derived row a crashed writer never wrote: repaired
    meeting_store = Store(conn, meetings)
    CounterClient(conn, meetings, meeting_store).add_member("m1", "erin", at=aware(t0))
    meeting_store.raw.add_member(("m1",), "frank", t0)
    repaired = invoke("--config", path, "reconcile", "--family", meetings.name, "--repair")
    assert repaired.exit_code == 0, repaired.output

    rows = {r.action: r for r in status.audit_page(store, 10) if r.triggered_by == "cli"}
    [repair] = [r for r in status.audit_page(meeting_store, 10)]
    os_user, host = audit.machine()
    hashes = invoke("--config", path, "families", "--hashes").output
    for row in (*rows.values(), repair):
        assert (row.triggered_by, row.os_user, row.host) == ("cli", os_user, host)
        assert row.cassandra_role == (conn.settings.username or "anonymous")
        assert row.code_version == audit.code_version()
        assert row.config_hash and row.config_hash in hashes
    assert set(rows) == {"compact", "reset", "quarantine-release"}
    assert rows["compact"].parameters == {"epoch": epoch, "dry_run": False}
    assert rows["compact"].sweep and rows["compact"].counters == 2
    # counterctl compact runs the GX suite after the engine's checks, as the DAG does
    assert rows["compact"].gx_suite and rows["compact"].gx_result
    assert rows["reset"].parameters["counter"] == "IBM"
    assert rows["reset"].parameters["reset_id"].startswith("reset:IBM@")
    released_row = rows["quarantine-release"]
    assert (released_row.outcome, released_row.counters) == ("released", 1)
    assert released_row.parameters == {"counter": "BROKEN"}
    assert "held for bad_rows" in released_row.message and "run-quarantine" in released_row.message
    assert (repair.action, repair.outcome, repair.counters) == ("reconcile-repair", "repaired", 1)
    assert repair.parameters == {"repair": True} and "m1: expected 2, counted 1" in repair.message
    assert repair.config_hash == sha256_of_configuration(meetings) != rows["reset"].config_hash
    # the run the library started (no interface named who) says so, and still names the process
    [library] = [r for r in status.audit_page(store, 10) if r.run_id == "run-quarantine"]
    assert (library.triggered_by, library.os_user, library.outcome) == (
        "library",
        os_user,
        "partial",
    )


@pytest.fixture(scope="module")
def long_trail(conn, engine_keyspace) -> Any:
    """10,050 audit rows of one family over three months (more than the UI's old cap)."""
    from counters.config import Family

    family = Family.model_validate(
        {
            "name": f"long_{secrets.token_hex(3)}",
            "keyspace": engine_keyspace,
            "raw_table": f"raw_l{secrets.token_hex(3)}",
            "compact_table": f"compact_l{secrets.token_hex(3)}",
            "lag": "1m",
        }
    )
    from counters.schema import ensure_schema

    layout = ensure_schema(conn.session, family)
    store = Store(conn, family, layout)
    start = datetime(2026, 10, 15)
    rows = [
        audit.stamped(
            record(family, start + timedelta(minutes=13 * i), f"run-{i:05d}", counters=i),
            family,
            audit.Provenance("scheduled"),
            None,
        )
        for i in range(10_050)
    ]
    for month in sorted({r["month"] for r in rows}):
        store.audit._add_month(month)
    statements = [store.audit._insert(row) for row in rows]
    store.statements.run(statements)
    return family, store, rows


def test_expect_counterctl_to_export_any_range_in_every_format(long_trail, tmp_path: Path) -> None:
    family, store, rows = long_trail
    path = families_yaml(tmp_path / "families.yaml", family)
    since, until = rows[100]["started_at"], rows[10_040]["started_at"]
    expected = [r["run_id"] for r in reversed(rows[100:10_040])]  # newest first
    assert len(expected) > 9_900 and len(store.audit.months(since, until)) == 4
    common = ("--config", path, "audit", "--family", family.name, "--since", since.isoformat())
    common += ("--until", until.isoformat())

    as_csv = invoke(*common, "--format", "csv")
    as_json = invoke(*common, "--format", "json")
    as_jsonl = invoke(*common, "--format", "jsonl")
    target = tmp_path / "trail.parquet"
    as_parquet = invoke(*common, "--format", "parquet", "-o", target)

    assert as_csv.exit_code == as_json.exit_code == as_parquet.exit_code == 0
    lines = list(csv.DictReader(io.StringIO(as_csv.output)))
    assert [line["run_id"] for line in lines] == expected
    assert list(lines[0]) == list(status.AUDIT_COLUMNS)
    assert lines[0]["triggered_by"] == "scheduled"
    body = json.loads(as_json.output)
    assert [r["run_id"] for r in body["rows"]] == expected
    assert as_jsonl.exit_code == 0 and as_jsonl.output.endswith("}\n")
    assert [json.loads(line) for line in as_jsonl.output.splitlines()] == body["rows"]
    assert body["family"] == family.name and body["since"].startswith(since.isoformat())
    table = pq.read_table(target)
    assert table.column("run_id").to_pylist() == expected
    assert table.column("counters").to_pylist()[0] == 10_039
    assert str(table.schema.field("started_at").type) == "timestamp[ms, tz=UTC]"
    limited = invoke(*common[:5], "--limit", "3")  # the table: newest first
    assert [line.split("\t")[1] for line in limited.output.splitlines()[1:]] == [
        "run-10049",
        "run-10048",
        "run-10047",
    ]
    wrong = invoke(*common[:5], "--since", "2027-01-01", "--until", "2026-01-01")
    assert wrong.exit_code == 2 and "--since (2027-01-01) must be before --until" in wrong.output


def test_a_family_total_past_a_bigint_still_leaves_the_runs_audit_row(make_family, t0):
    """Issue #43 item 6: two counters near 2^63 each fit a bigint, their run's sum does not.
    The run deletes their rows, so it must leave its audit row: the column too small for the
    total is left empty and the exact total is in the row's message."""
    _family, store, client = make_family()
    big = 2**62 + 2**61  # each fits a bigint; the two together do not
    at = t0 + timedelta(seconds=10)
    client.record([Increment((f"c{i}",), big, utc_aware(at), ("w", i)) for i in (1, 2)])
    epoch = t0 + timedelta(minutes=1)
    engine.run_family(store, epoch, run_id="big-sums", now=epoch + timedelta(minutes=2))
    [row] = [r for r in store.audit.page(5) if r["run_id"] == "big-sums"]
    assert row["outcome"] == "success" and row["rows_deleted"] == 2
    assert row["sum_folded"] is None and row["rows_folded"] == 2
    assert f"sum_folded {2 * big}" in row["message"]
    assert [client.read(f"c{i}") for i in (1, 2)] == [big, big]


@pytest.mark.parametrize("point", ["commit", "verify"])
def test_a_retried_compact_steps_earlier_commits_are_in_the_runs_audit_row(make_family, t0, point):
    """Issue #49 item 4, as the DAG's tasks run a run: shard 0's compact step commits a bucket
    and dies (before its verification: ``commit``; after it: ``verify``); the step is tried
    again (a new execution, which carries those counted rows into its own commits), and only
    the retry's report reaches verify. The audit row adds up every commit of the run: each
    row folded once, the values' whole rise, each counter once."""
    _family, store, client = make_family(shards=1)
    counters = [f"k{i}" for i in range(24)]
    client.record(
        [
            Increment((c,), i + 1, utc_aware(t0 + timedelta(minutes=1, seconds=i)), ("w", i))
            for c in counters
            for i in range(3)
        ]
    )
    epoch = t0 + timedelta(minutes=5)
    now = epoch + timedelta(minutes=5)
    started = datetime.now(UTC)
    plan = engine.plan_step(store, "retried", epoch, now, started_at=started)
    crashed: list[str] = []

    def die_once(at: str) -> None:
        if at == point and not crashed:
            crashed.append(at)
            raise Crash(at)

    with pytest.raises(Crash):
        engine.RunSteps(store, plan, started, fault=die_once, now=now).compact(plan.shards)
    steps = engine.RunSteps(store, plan, started, now=now)
    retry = steps.compact(plan.shards)
    assert retry[0].tally.rows_folded < 72  # the retry folded only what the first had not
    verified = steps.verify(retry)
    cleaned = steps.check_cleanup(verified, steps.cleanup(verified, plan.shards))
    summary = steps.conclude(verified, cleaned)
    assert summary.outcome == "success"
    [row] = [a for a in store.audit.page(5) if a["run_id"] == "retried"]
    assert (row["rows_folded"], row["sum_folded"], row["rows_deleted"]) == (72, 144, 72), row
    assert row["counters"] == 24
    assert summary.tally.rows_folded == 72 and summary.tally.counted_present == 0
    assert {v.counter[0]: v.value for v in client.read_many(counters)} == dict.fromkeys(counters, 6)


def test_a_run_whose_compact_step_is_cleared_after_it_ended_audits_both_passes(make_family, t0):
    """Issue #49 item 4: a run ends (folded and deleted 72 rows); late rows at or below its
    epoch arrive; an operator clears its compact task in the UI, and the tasks after it run
    again under the same run (the same plan and start: the same audit row). The row then says
    what the whole run did, both passes: every row folded and every row deleted, not only the
    second pass's."""
    _family, store, client = make_family(shards=1)
    counters = [f"k{i}" for i in range(24)]
    rows = [
        Increment((c,), i + 1, utc_aware(t0 + timedelta(minutes=1, seconds=i)), ("w", i))
        for c in counters
        for i in range(3)
    ]
    client.record(rows)
    epoch = t0 + timedelta(minutes=5)
    now = epoch + timedelta(minutes=5)
    started = datetime.now(UTC)
    plan = engine.plan_step(store, "cleared", epoch, now, started_at=started)

    def one_pass() -> engine.RunOutcome:
        steps = engine.RunSteps(store, plan, started, now=now)
        verified = steps.verify(steps.compact(plan.shards))
        cleanups = steps.cleanup(verified, plan.shards)
        return steps.conclude(verified, steps.check_cleanup(verified, cleanups))

    assert one_pass().tally.rows_deleted == 72
    client.record(
        [
            Increment((c,), 10, utc_aware(t0 + timedelta(minutes=2)), ("late", 1))
            for c in counters[:4]
        ]
    )
    second = one_pass()
    [row] = [a for a in store.audit.page(5) if a["run_id"] == "cleared"]
    assert (row["rows_folded"], row["sum_folded"], row["rows_deleted"]) == (76, 184, 76), row
    assert (row["late_rows"], row["counters"]) == (4, 24), row
    assert second.tally.rows_deleted == 76
