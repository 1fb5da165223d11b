"""The archive of deleted rows (issue #35, part 4) against the real node: every row a cleanup
deletes is in a Parquet file first, once, with its manifest in the run's audit row; a recount
from the archive and the rows still present equals the compact table after crashes, retries,
late rows and resets; a changed file is found by its checksum."""

from __future__ import annotations

import hashlib
import io
import json
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from counters import engine
from counters.archive import Manifest
from counters.cli import cli
from counters.client import Increment
from counters.compaction.conclude import finish_run
from counters.core import utc_aware
from counters.recount import recount

from tests.copies import change_copy

from .conftest import Crash
from .helpers import aware, rows_at_or_below

pytestmark = pytest.mark.integration


def inc(counter, amount, at, version, actor="w"):
    return Increment((counter,), amount, utc_aware(at), (actor, version))


def run(store, epoch, **kw):
    kw.setdefault("now", epoch + timedelta(minutes=5))
    return engine.run_family(store, epoch, **kw)


@pytest.fixture
def archived_family(make_family, tmp_path: Path):
    """``archived_family(**fields)``: a family with an archive in the test's tmp dir."""

    def factory(**fields):
        fields.setdefault("archive", str(tmp_path / "archive"))
        fields.setdefault("shards", 2)
        return make_family(**fields)

    return factory


def files(family) -> list[Path]:
    root = Path(family.archive) / family.name
    return sorted(root.rglob("*.parquet")) if root.exists() else []


def archived_rows(family) -> list[tuple]:
    """(counter, time ms, actor, version, increment, counted, run) of every archived row."""
    return [r for path in files(family) for r in archived_rows_of(path)]


def archived_rows_of(path: Path) -> list[tuple]:
    out = []
    if True:
        table = pq.read_table(path)
        times = table.column("modify_time").cast("int64").to_pylist()
        for i, row in enumerate(table.to_pylist()):
            out.append(
                (
                    row["type"],
                    times[i],
                    row["actor"],
                    row["version"],
                    row["increment"],
                    row["_counted"],
                    row["_run_id"],
                )
            )
    return out


def manifests(store) -> dict[str, Manifest]:
    out = {}
    for _started, _run, archive in store.audit.archives():
        for name, text in archive.items():
            out[name] = Manifest.from_text(text)
    return out


def load(client, t0, counters=("IBM", "AAPL"), before=10, after=2, version=0):
    """``before`` rows (1..before) in t0 .. t0+9m and ``after`` of 100 after t0+10m, each."""
    events = []
    for c in counters:
        events += [
            inc(c, i + 1, t0 + timedelta(minutes=i * 10 / before), version + i)
            for i in range(before)
        ]
        events += [
            inc(c, 100, t0 + timedelta(minutes=10, seconds=j + 1), version + 1000 + j)
            for j in range(after)
        ]
    client.record(events)


def assert_recount_equal(store, counters=None):
    report = recount(store, counters)
    assert report.ok, (report.file_problems, [r.as_dict() for r in report.differences])
    return report


def test_cleanup_archives_exactly_the_rows_it_deletes_with_a_manifest_in_the_audit_row(
    archived_family, t0
):
    family, store, client = archived_family()
    load(client, t0)
    epoch = t0 + timedelta(minutes=10)
    summary = run(store, epoch, run_id="run-1")
    assert summary.outcome == "success" and summary.tally.rows_deleted == 20
    for counter in ("IBM", "AAPL"):
        assert rows_at_or_below(store, (counter,), epoch) == 0
    rows = archived_rows(family)
    # exactly the 20 deleted rows, each once, with their increments, counted
    assert sorted((r[0], r[3], r[4]) for r in rows) == sorted(
        (c, i, i + 1) for c in ("IBM", "AAPL") for i in range(10)
    )
    assert all(r[5] and r[6] == "run-1" for r in rows)
    # one file per shard that had rows, named <run>-<shard>.parquet in the run's day folder
    names = {p.name for p in files(family)}
    assert names <= {"run-1-0.parquet", "run-1-1.parquet"} and names
    day = {p.parent.name for p in files(family)}
    assert day == {datetime.now(UTC).strftime("%Y-%m-%d")}
    # the run's own audit row holds each file's manifest: rows, sum, sha256 of its bytes
    [row] = store.audit.page(5)
    assert row["outcome"] == "success" and row["run_id"] == "run-1"
    found = {name: Manifest.from_text(text) for name, text in row["archive"].items()}
    assert set(found) == names
    for path in files(family):
        manifest = found[path.name]
        assert manifest.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
        table = pq.read_table(path)
        assert (manifest.rows, manifest.sum) == (
            table.num_rows,
            sum(table.column("increment").to_pylist()),
        )
    assert sum(m.rows for m in found.values()) == 20
    assert sum(m.sum for m in found.values()) == 110
    report = assert_recount_equal(store)
    by = {r.counter: r for r in report.counters}
    assert (by[("IBM",)].opening, by[("IBM",)].from_start) == (0, True)
    assert (by[("IBM",)].rebuilt, by[("IBM",)].expected) == (55, 55)


def recorded_files(store) -> list[Path]:
    """The archive files a manifest names: the archive (a file no manifest names is what a
    cleanup that crashed before recording it left: never counted, and nothing was deleted
    under it)."""
    return sorted(Path(m.url.removeprefix("file://")) for m in manifests(store).values())


def assert_each_row_archived_once(store, expected_rows: int | None = None):
    named = set(recorded_files(store))
    rows = [r for path in named for r in archived_rows_of(path)]
    keys = Counter((r[0], r[1], r[2], r[3]) for r in rows)
    twice = [k for k, n in keys.items() if n > 1]
    assert not twice, f"archived twice: {twice[:5]}"
    assert expected_rows is None or len(rows) == expected_rows, len(rows)


def compact_then_crash_in_cleanup(store, epoch, run_id, point):
    """A run as its Airflow tasks do it, shard by shard: compact, verify, then a cleanup that
    crashes at ``point``. Returns what a retry of the cleanup task gets again: the run's
    start (its audit row) and the verified executions."""
    plan = engine.plan_run(store, run_id, epoch, epoch + timedelta(minutes=5))
    reports = [
        engine.compact_shard(store, s, plan.epoch, run_id, sweep=plan.sweep) for s in plan.shards
    ]
    verified = engine.verify_run(reports)
    assert verified.passed
    started_at = datetime.now(UTC)

    def crash(p):
        if p == point:
            raise Crash(p)

    with pytest.raises(Crash):
        for shard in plan.shards:
            engine.cleanup_shard(
                store, shard, run_id, verified.executions[shard], fault=crash, started_at=started_at
            )
    return plan, started_at, verified.executions


@pytest.mark.parametrize("point", engine.ARCHIVE_FAULT_POINTS)
@pytest.mark.parametrize("then", ["task_retry", "rerun", "next_run"])
def test_a_crash_between_archive_and_delete_archives_no_row_twice_and_deletes_none_unarchived(
    archived_family, t0, point, then
):
    """The cleanup crashes after its file is written (before its manifest is recorded), or
    after the manifest and the commits' marks (before any delete). Nothing is deleted by the
    crashed attempt. Then the cleanup task is retried (the same run, the same verified
    commits), or the run is run again under its id (new commits, carrying the counted rows),
    or the next run (another id) commits the counted rows again as present and deletes them:
    every row is archived exactly once, and none is deleted before its archive is recorded."""
    family, store, client = archived_family(shards=1)
    counters = [f"c{i}" for i in range(6)]
    load(client, t0, counters=counters, before=5, after=1)
    epoch = t0 + timedelta(minutes=10)
    plan, started_at, executions = compact_then_crash_in_cleanup(store, epoch, "crashed", point)
    for c in counters:
        assert rows_at_or_below(store, (c,), epoch) == 5  # none deleted
    assert len(archived_rows(family)) == 30  # the file is whole
    if point == "cleanup_archive":
        assert len(recorded_files(store)) == 1  # recorded before anything was deleted
    else:
        assert recorded_files(store) == []  # not recorded: nothing may be deleted under it
    assert_recount_equal(store)
    extra = 0
    if then == "task_retry":
        for shard in plan.shards:
            engine.cleanup_shard(store, shard, "crashed", executions[shard], started_at=started_at)
        finish_run(store, plan)
    elif then == "rerun":
        again = run(store, epoch, run_id="crashed")
        assert again.outcome == "success", again.message
        # it carries its own run's counted rows: the run folded them once (issue #49 item 4)
        assert (again.tally.rows_folded, again.tally.counted_present) == (30, 0)
    else:
        client.record([inc(c, 1000, epoch + timedelta(minutes=1), 77) for c in counters])
        extra = 1000
        again = run(store, epoch + timedelta(minutes=2), run_id="next")
        assert again.outcome == "success", again.message
        assert again.tally.counted_present == 30  # the crashed run's rows, committed again
    for c in counters:
        assert rows_at_or_below(store, (c,), epoch) == 0
    assert_each_row_archived_once(store, 30 + (12 if extra else 0))  # next: the newer rows too
    if then == "task_retry":  # the retry took its crashed attempt's file as its own
        assert [p.name for p in files(family)] == ["crashed-0.parquet"]
        assert recorded_files(store) == files(family)
    expected = {c: 15 + 100 + extra for c in counters}
    assert {v.counter[0]: v.value for v in client.read_many(counters)} == expected
    report = assert_recount_equal(store)
    orphans = set(files(family)) - set(recorded_files(store))
    assert {Path(u.removeprefix("file://")) for u in report.unrecorded} == orphans
    assert bool(orphans) == (point == "cleanup_archive_file" and then != "task_retry")


def cli_recount(store, *args):
    """``counterctl recount`` on the test family (its YAML written for the CLI)."""
    import yaml

    family = store.family
    path = Path(family.archive).parent / "families.yaml"
    data = family.model_dump(mode="json", exclude_none=True)
    for name in ("lag", "freshness", "sweep_interval", "sweep_offset", "archive_retention"):
        value = getattr(family, name)
        if value is not None:
            data[name] = f"{int(value.total_seconds())}s"
    path.write_text(yaml.safe_dump({"families": [data]}))
    return CliRunner().invoke(
        cli,
        ["--config", str(path), "recount", "--family", family.name, *map(str, args)],
        catch_exceptions=False,
    )


def test_recount_equals_the_compact_table_after_crashes_retries_late_rows_and_a_reset(
    archived_family, t0
):
    """Run after run with crashes at every cleanup point, retries of the same run, late rows
    (below the epoch, folded by the next run), a counter reset (its consumed rows archived as
    not counted) and a reset whose rows a crash left for the next run: after each, every
    counter rebuilt from the archive and the rows still present equals the compact table,
    from zero, and no row is archived twice."""
    family, store, client = archived_family(shards=2)
    counters = [f"k{i}" for i in range(8)]
    expected = dict.fromkeys(counters, 0)
    version = 0

    def write(at, amount=1):
        nonlocal version
        version += 1
        client.record([inc(c, amount + i, at, version) for i, c in enumerate(counters)])
        for i, c in enumerate(counters):
            expected[c] += amount + i

    def check(values_too=True):
        """Readers see the oracle's values (not after a crash: a late row is seen once a run
        folds it), and the recount equals the compact table, from zero, in any case."""
        values = {v.counter[0]: v.value for v in client.read_many(counters)}
        assert values == expected or not values_too
        report = assert_recount_equal(store)
        assert all(r.from_start for r in report.counters), [r.as_dict() for r in report.counters]
        assert_each_row_archived_once(store)

    epoch = t0 + timedelta(minutes=10)
    points = ["cleanup_read_log", *engine.ARCHIVE_FAULT_POINTS, "cleanup_delete", "verify"]
    for step, point in enumerate(points):
        write(epoch - timedelta(minutes=5), 10 * (step + 1))
        write(epoch + timedelta(seconds=30), 1)  # after this epoch: the next run's
        if step:
            write(epoch - timedelta(minutes=30), 3)  # late: below the compacted epoch

        def crash(p, point=point):
            if p == point:
                raise Crash(p)

        run_id = f"r{step}"
        with pytest.raises(Crash):
            run(store, epoch, run_id=run_id, fault=crash)
        check(values_too=False)
        assert run(store, epoch, run_id=run_id).outcome in ("success", "noop")  # its retry
        check()
        epoch += timedelta(minutes=1)
    # a reset: increments at or before its point are consumed (archived, not counted)
    write(epoch - timedelta(seconds=30), 5)
    result = engine.reset_counter(store, ("k3",), aware(epoch), now=epoch + timedelta(minutes=1))
    assert result.rows_deleted > 0
    expected["k3"] = 0
    check()
    by = {r.counter: r for r in recount(store, [("k3",)]).counters}
    assert by[("k3",)].rebuilt == 0 and by[("k3",)].from_start
    consumed = [r for r in archived_rows(family) if r[6].startswith("reset:")]
    assert consumed and not any(r[5] for r in consumed)  # archived as not counted
    # resets that crash after their commit: before their archive (the next run archives the
    # consumed rows, as not counted), and after it, before their deletes (no row again)
    write(epoch + timedelta(seconds=30), 7)
    for counter, owner, method in (
        ("k5", store.runs, "read_run_commits"),
        ("k6", store.raw, "delete_rows"),
    ):
        original = getattr(owner, method)

        def die(*args, method=method, **kwargs):
            raise Crash(method)

        setattr(owner, method, die)
        with pytest.raises(Crash):
            engine.reset_counter(
                store,
                (counter,),
                aware(epoch + timedelta(minutes=1)),
                now=epoch + timedelta(minutes=2),
            )
        setattr(owner, method, original)
        expected[counter] = 0
        check()
    write(epoch + timedelta(minutes=1, seconds=30), 2)
    after = run(store, epoch + timedelta(minutes=2), run_id="after-reset")
    assert after.outcome == "success", after.message
    check()
    by_run = Counter((r[0], r[6].split("@")[0], r[5]) for r in archived_rows(family))
    # the same rows consumed (the three present at or before the point), archived once each
    consumed = by_run[("k6", "reset:k6", False)]
    assert consumed == 3 and not by_run[("k6", "after-reset", False)]
    assert by_run[("k5", "after-reset", False)] == consumed
    assert not by_run[("k5", "reset:k5", False)]
    assert cli_recount(store).exit_code == 0


def _two_runs(archived_family, t0):
    family, store, client = archived_family(shards=1)
    load(client, t0, counters=("IBM", "AAPL"), before=4, after=0)
    epoch = t0 + timedelta(minutes=10)
    assert run(store, epoch, run_id="first").outcome == "success"
    client.record(
        [
            inc(c, 10 + i, epoch + timedelta(seconds=10 * (i + 1)), 50 + i)
            for c in ("IBM", "AAPL")
            for i in range(3)
        ]
    )
    assert run(store, epoch + timedelta(minutes=1), run_id="second").outcome == "success"
    return family, store, client


def _rewrite(path: Path, change) -> bytes:
    """A file rewritten with ``change(table)`` as a tamperer would: valid Parquet, new bytes."""
    table = change(pq.read_table(path))
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    path.write_bytes(sink.getvalue())
    return sink.getvalue()


def test_a_tampered_archive_file_is_detected_by_its_checksum(archived_family, t0):
    _family, store, _client = _two_runs(archived_family, t0)
    assert cli_recount(store, "IBM").exit_code == 0
    [second] = [p for p in recorded_files(store) if p.name.startswith("second")]

    def raise_one(table):
        values = table.column("increment").to_pylist()
        values[0] += 1
        column = table.schema.get_field_index("increment")
        return table.set_column(column, "increment", pa.array(values, pa.int64()))

    _rewrite(second, raise_one)
    report = recount(store)
    assert not report.ok
    [problem] = report.file_problems
    assert str(second) in problem and "sha256" in problem and "changed after the run" in problem
    result = cli_recount(store)
    assert result.exit_code == 7, result.output
    assert "sha256" in result.output and "changed after the run wrote it" in result.output
    # the changed file is not counted: its commits' rows are missing, so the chain breaks too
    by = {r.counter: r for r in report.counters}
    assert not by[("IBM",)].equal


def test_rows_missing_from_the_archive_break_the_chain_even_with_a_forged_manifest(
    archived_family, t0
):
    """What a cleanup that deleted rows without archiving them would leave: a commit whose
    archived rows do not add up to its value step. The file and its manifest are rewritten
    consistently (no checksum to catch), and the recount still finds the gap."""
    _family, store, _client = _two_runs(archived_family, t0)
    [second] = [p for p in recorded_files(store) if p.name.startswith("second")]
    data = _rewrite(second, lambda t: t.filter(pa.array([i != 0 for i in range(t.num_rows)])))
    table = pq.read_table(second)
    [(started_at, run_id, archive)] = [a for a in store.audit.archives() if a[1] == "second"]
    [(name, text)] = archive.items()
    forged = json.loads(text) | {
        "sha256": hashlib.sha256(data).hexdigest(),
        "rows": table.num_rows,
        "sum": sum(table.column("increment").to_pylist()),
        "size": len(data),
    }
    store.audit.record_archive(started_at, run_id, {name: json.dumps(forged)})
    report = recount(store)
    assert not report.file_problems
    broken = [r for r in report.counters if not r.equal]
    assert len(broken) == 1
    assert "rows counted between them are missing from the archive" in broken[0].problems[0] or (
        "is not the sum of its counted rows" in broken[0].problems[0]
    )
    assert cli_recount(store).exit_code == 7


def test_a_store_the_archive_cannot_be_written_to_fails_the_run_and_deletes_nothing(
    make_family, tmp_path, t0
):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the archive's folder should be")
    family, store, client = make_family(archive=str(blocker / "archive"), shards=1)
    load(client, t0, counters=("IBM",), before=3, after=0)
    epoch = t0 + timedelta(minutes=10)
    with pytest.raises(engine.ArchiveError) as info:
        run(store, epoch, run_id="refused")
    message = str(info.value)
    assert f"family {family.name!r}: archive {family.archive!r}" in message
    assert "cannot write the archive of run 'refused' shard 0" in message
    assert rows_at_or_below(store, ("IBM",), epoch) == 3  # nothing deleted
    [row] = store.audit.page(5)
    assert row["outcome"] == "failed" and "cannot write the archive" in row["message"]
    assert client.read(("IBM",)) == 6  # readers still exact: counted, kept, not lost


def test_a_relative_archive_outside_the_local_dev_setup_fails_the_run_and_deletes_nothing(
    make_family, monkeypatch, t0
):
    """Installed, a relative folder would be under site-packages: refused, naming the field."""
    family, store, client = make_family(archive="var/archive", shards=1)
    load(client, t0, counters=("IBM",), before=3, after=0)
    monkeypatch.delenv("COUNTERS_LOCAL_DEV", raising=False)
    epoch = t0 + timedelta(minutes=10)
    with pytest.raises(engine.ArchiveError) as info:
        run(store, epoch, run_id="relative")
    assert str(info.value).startswith(
        f"family {family.name!r}: field 'archive': 'var/archive' is a relative path"
    )
    assert rows_at_or_below(store, ("IBM",), epoch) == 3  # nothing deleted
    [row] = store.audit.page(5)
    assert row["outcome"] == "failed" and "is a relative path" in row["message"]
    assert client.read(("IBM",)) == 6  # readers still exact: counted, kept, not lost


def test_the_job_prunes_day_folders_past_the_retention_and_recount_says_so(archived_family, t0):
    family, store, client = archived_family(shards=1, archive_retention="2d")
    root = Path(family.archive) / family.name
    old = root / "2020-01-01"
    old.mkdir(parents=True)
    (old / "ancient-0.parquet").write_bytes(b"old")
    load(client, t0, counters=("IBM",), before=3, after=0)
    assert run(store, t0 + timedelta(minutes=10), run_id="fresh").outcome == "success"
    assert not old.exists()  # pruned by the run
    assert [p.parent.name for p in files(family)] == [datetime.now(UTC).strftime("%Y-%m-%d")]
    # a manifest whose file the retention removed: counted as pruned, not as missing
    stale = Manifest(f"{old.as_uri()}/ancient-0.parquet", 0, 1, 1, 1, "00", 3, 1)
    store.audit.record_archive(
        datetime(2020, 1, 1, tzinfo=UTC), "ancient", {stale.name: stale.as_text()}
    )
    report = assert_recount_equal(store)
    assert report.pruned == 1 and report.files == 1
    # a file missing inside the retention is a problem
    [kept] = [p for p in recorded_files(store) if p.name.startswith("fresh")]
    kept.unlink()
    report = recount(store)
    assert report.file_problems == [f"{kept.as_uri()}: missing"]


def test_a_unique_family_archives_its_members_once_and_recounts_them_once(archived_family, t0):
    _family, store, client = archived_family(
        kind="unique", columns={"key": "meeting", "member": "user"}, shards=1
    )
    first = client.add_members([("m1", f"u{i}") for i in range(5)])
    assert all(first)
    # members are written at the wall clock: runs at epochs after it (a virtual clock ahead)
    epoch = datetime.now(UTC).replace(tzinfo=None, second=0, microsecond=0) + timedelta(minutes=1)
    assert run(store, epoch, run_id="u1").outcome == "success"
    again = client.add_members([("m1", f"u{i}") for i in range(3, 8)])
    assert again == [False, False, True, True, True]
    assert run(store, epoch + timedelta(minutes=1), run_id="u2").outcome == "success"
    assert client.read(("m1",)) == 8
    report = assert_recount_equal(store)
    [m1] = report.counters
    assert (m1.rebuilt, m1.from_start, m1.archived_rows) == (8, True, 8)


def test_commits_from_before_the_archive_are_archived_by_the_next_fold_of_their_counter(
    make_family, tmp_path, t0
):
    """A run committed before the family had an archive; the archive is switched on before its
    cleanup runs (a cleanup task retried after a deploy). That cleanup has no values of those
    rows: it leaves them (and its check of what is left passes), and the next fold of their
    counters commits them again as present, with their values, archives them and deletes them."""
    from counters.store import Store

    family, store, client = make_family(shards=1)
    load(client, t0, counters=("IBM", "AAPL"), before=3, after=0)
    epoch = t0 + timedelta(minutes=10)
    plan = engine.plan_run(store, "old", epoch, epoch + timedelta(minutes=5))
    [report] = [engine.compact_shard(store, 0, plan.epoch, "old", sweep=plan.sweep)]
    archived = family.model_copy(update={"archive": str(tmp_path / "archive")})
    store2 = Store(store.conn, archived, store.layout, concurrency=8)
    cleanup = engine.cleanup_shard(
        store2, 0, "old", [report.execution], started_at=datetime.now(UTC)
    )
    assert (cleanup.rows_deleted, cleanup.leftovers) == (0, ())
    assert cleanup.archive_deferred >= 1  # a commit per bucket the two counters fell in
    assert engine.verify_cleanup([cleanup]).success
    finish_run(store2, plan)
    assert rows_at_or_below(store2, ("IBM",), epoch) == 3
    assert client.read(("IBM",)) == 6
    client.record([inc("IBM", 100, epoch + timedelta(seconds=20), 99)])
    later = run(store2, epoch + timedelta(minutes=1), run_id="later")
    assert later.outcome == "success" and later.tally.counted_present == 6  # a sweep: both
    assert rows_at_or_below(store2, ("IBM",), epoch) == 0
    rows = archived_rows(archived)
    assert sorted(r[4] for r in rows if r[0] == "IBM") == [1, 2, 3, 100]
    report = recount(store2, [("IBM",)])
    assert report.ok, [r.as_dict() for r in report.counters]
    ibm = report.counters[0]
    # its first commit was recorded without an archive: the opening is 0, but not proven so
    assert (ibm.rebuilt, ibm.opening, ibm.from_start) == (106, 0, False)


def test_a_quarantined_counters_rows_are_neither_archived_nor_deleted_until_released(
    archived_family, t0
):
    family, store, client = archived_family(shards=1)
    load(client, t0, counters=("IBM", "AAPL"), before=3, after=0)
    store.statements.session.execute(
        f"INSERT INTO {family.keyspace}.{family.raw_table} (type, modify_time, actor, version, "
        "increment) VALUES ('IBM', %s, 'bad', 1, null)",
        (t0 + timedelta(minutes=1),),
    )
    epoch = t0 + timedelta(minutes=10)
    with pytest.raises(engine.ChecksFailed, match="quarantined"):
        run(store, epoch, run_id="q")
    assert {r[0] for r in archived_rows(family)} == {"AAPL"}
    assert rows_at_or_below(store, ("IBM",), epoch) == 4
    store.statements.session.execute(
        f"DELETE FROM {family.keyspace}.{family.raw_table} WHERE type = 'IBM' AND "
        "modify_time = %s AND actor = 'bad' AND version = 1",
        (t0 + timedelta(minutes=1),),
    )
    engine.release(store, ("IBM",))
    assert run(store, epoch + timedelta(minutes=1), run_id="after").outcome == "success"
    assert sorted(r[4] for r in archived_rows(family) if r[0] == "IBM") == [1, 2, 3]
    assert_each_row_archived_once(store, 6)
    assert_recount_equal(store)


def test_recount_of_a_window_starts_from_an_opening_balance_and_ends_at_its_last_commit(
    archived_family, t0
):
    _family, store, _client = _two_runs(archived_family, t0)
    [first_at] = [a[0] for a in store.audit.archives() if a[1] == "first"]
    [second_at] = [a[0] for a in store.audit.archives() if a[1] == "second"]
    after_first = first_at + timedelta(milliseconds=1)
    window = recount(store, [("IBM",)], since=after_first)
    [ibm] = window.counters
    assert window.ok and (ibm.opening, ibm.from_start, ibm.archived_commits) == (10, False, 1)
    assert ibm.rebuilt == 10 + 10 + 11 + 12
    until = recount(store, [("IBM",)], until=after_first)
    [ibm] = until.counters
    assert until.ok and (ibm.rebuilt, ibm.expected, ibm.from_start) == (10, 10, True)
    result = cli_recount(store, "IBM", "--from", after_first.isoformat(), "--json")
    assert result.exit_code == 0 and json.loads(result.output)["counters"][0]["opening"] == 10
    bad = cli_recount(store, "--from", second_at.isoformat(), "--to", first_at.isoformat())
    assert bad.exit_code == 2 and "must be before --to" in bad.output


def test_recount_refuses_a_family_without_an_archive(make_family):
    _family, store, _client = make_family()
    with pytest.raises(engine.ArchiveError, match="has no archive"):
        recount(store)


def test_a_reshard_moves_the_archive_records_with_the_keys(archived_family, t0):
    """A cleanup archives and crashes before its deletes; the family is resharded (its commits'
    records move to the counters' new places); the next run carries the rows as archived:
    deleted, not archived again, and the recount still proves every counter from zero."""
    from counters.reshard import reshard
    from counters.store import Store

    family, store, client = archived_family(shards=2)
    counters = [f"s{i}" for i in range(40)]
    load(client, t0, counters=counters, before=3, after=0)
    epoch = t0 + timedelta(minutes=10)
    hits = []

    def crash(point):
        if point == "cleanup_archive" and not hits:
            hits.append(point)
            raise Crash(point)

    with pytest.raises(Crash):
        run(store, epoch, run_id="crashed", fault=crash, workers=1)
    archived_before = len(archived_rows(family))
    assert 0 < archived_before <= 120
    moved = reshard(store, 3)
    assert moved.records_moved > 0
    resharded = Store(store.conn, family.model_copy(update={"shards": 3}), store.layout, 8)
    later = run(resharded, epoch + timedelta(minutes=1), run_id="after-reshard")
    assert later.outcome == "success", later.message
    for c in counters:
        assert rows_at_or_below(resharded, (c,), epoch) == 0
    assert_each_row_archived_once(resharded, 120)
    report = assert_recount_equal(resharded)
    assert all(r.from_start for r in report.counters)


@pytest.mark.parametrize(
    "order", ["older_cleanup_last", "newer_crashes_before_delete", "older_cleanup_inside_newer"]
)
def test_an_older_runs_cleanup_after_a_newer_fold_archives_no_row_twice(archived_family, t0, order):
    """Cleanups out of run order: the next run folds while the crashed run's rows are still
    there (carried, not archived). ``older_cleanup_last``: the newer run archives and deletes
    them, then the older run's cleanup is retried (an operator clears its task).
    ``newer_crashes_before_delete``: the same, but the newer run's cleanup crashes after its
    archive, before its deletes. ``older_cleanup_inside_newer``: the older run's cleanup
    archives them and crashes before its deletes while the newer run is between its fold and
    its cleanup. Either way each row is archived once and the recount proves every counter."""
    _family, store, client = archived_family(shards=1)
    counters = [f"o{i}" for i in range(4)]
    load(client, t0, counters=counters, before=3, after=0)
    epoch = t0 + timedelta(minutes=10)
    plan, started_at, executions = compact_then_crash_in_cleanup(
        store, epoch, "older", "cleanup_read_log"
    )
    client.record([inc(c, 1000, epoch + timedelta(seconds=10), 77) for c in counters])

    def older_cleanup(fault=None):
        for shard in plan.shards:
            engine.cleanup_shard(
                store,
                shard,
                "older",
                executions[shard],
                started_at=started_at,
                **({"fault": fault} if fault else {}),
            )

    def inside(point):
        if point == "cleanup_read_log" and order == "older_cleanup_inside_newer":

            def crash(p):
                if p == "cleanup_archive":
                    raise Crash(p)

            with pytest.raises(Crash):
                older_cleanup(crash)

    if order == "newer_crashes_before_delete":

        def crash(point):
            if point == "cleanup_archive":
                raise Crash(point)

        with pytest.raises(Crash):
            run(store, epoch + timedelta(minutes=1), run_id="newer", fault=crash)
        assert len(recorded_files(store)) == 1
    else:
        newer = run(store, epoch + timedelta(minutes=1), run_id="newer", fault=inside)
        assert newer.outcome == "success", newer.message
        assert newer.tally.counted_present == 12
    if order != "older_cleanup_inside_newer":
        older_cleanup()
    for c in counters:
        assert rows_at_or_below(store, (c,), epoch) == 0  # the older run's, archived
    assert_each_row_archived_once(store, 16)
    assert {v.counter[0]: v.value for v in client.read_many(counters)} == dict.fromkeys(
        counters, 1006
    )
    assert_recount_equal(store)


def run_days_ago(store, epoch, run_id, days):
    """A run as if it had started ``days`` ago: its archive file in that day's folder and its
    audit row keyed then (its own conclusion prunes that folder when it is past the
    retention: the retention has dropped its file)."""
    started = datetime.now(UTC) - timedelta(days=days)
    now = epoch + timedelta(minutes=5)
    plan = engine.plan_step(store, run_id, epoch, now, started_at=started)
    return engine.run_steps(engine.RunSteps(store, plan, started, now=now))


def test_recount_tells_a_quiet_counter_whose_archive_expired_from_a_wrong_one(archived_family, t0):
    """Issue #49 item 4: the retention dropped the file of IBM's only commit (a quiet,
    correct counter): the recount says it cannot rebuild IBM (evidence expired, exit 9), not
    that IBM differs; AAPL, committed again since, is proven from an opening balance. A
    counter whose archive file is lost inside the retention still differs (exit 7). The same
    for a commit whose run-log record expired too (its run's file is past the retention)."""
    family, store, client = archived_family(shards=1, archive_retention="2d")
    load(client, t0, counters=("IBM", "AAPL", "MSFT"), before=10, after=0)
    epoch = t0 + timedelta(minutes=10)
    assert run_days_ago(store, epoch, "old", days=5).outcome == "success"
    assert recorded_files(store) and not files(family)  # pruned by its own conclusion
    client.record([inc("AAPL", 7, epoch + timedelta(minutes=1), 70)])
    assert run(store, epoch + timedelta(minutes=2), run_id="today").outcome == "success"
    report = recount(store)
    by = {r.counter[0]: r for r in report.counters}
    assert report.pruned == 1 and report.files == 1
    assert by["AAPL"].equal and (by["AAPL"].opening, by["AAPL"].rebuilt) == (55, 62)
    for quiet in ("IBM", "MSFT"):
        assert not by[quiet].equal and by[quiet].difference is None, by[quiet].as_dict()
        assert by[quiet].status == "cannot_rebuild" and "retention" in by[quiet].cannot_rebuild
        assert by[quiet].expected == 55 and by[quiet].problems == []
    assert report.ok and not report.differences
    assert [r.counter[0] for r in report.cannot_rebuild] == ["IBM", "MSFT"]
    result = cli_recount(store, "IBM", "--json")
    assert result.exit_code == 9, result.output
    assert json.loads(result.output)["counters"][0]["status"] == "cannot_rebuild"
    assert cli_recount(store, "AAPL").exit_code == 0
    text = cli_recount(store)
    assert text.exit_code == 9 and "2 counter(s) cannot be rebuilt" in text.output, text.output
    # MSFT's run-log record expires too (kept 14 days): its run's file is past the retention
    store.statements.session.execute(
        f"DELETE FROM {family.keyspace}.{family.compact_table}_runs WHERE run_id = 'old' "
        "AND shard = 0"
    )
    msft = recount(store, [("MSFT",)]).counters[0]
    assert msft.status == "cannot_rebuild" and "retention" in msft.cannot_rebuild, msft.as_dict()
    # a counter whose archive file is lost inside the retention is wrong, not expired
    client.record([inc("TSLA", 5, epoch + timedelta(minutes=3), 1)])
    assert run(store, epoch + timedelta(minutes=3), run_id="lost").outcome == "success"
    [lost] = [p for p in files(family) if p.name.startswith("lost")]
    lost.unlink()
    tsla = recount(store, [("TSLA",)])
    assert tsla.counters[0].status == "different" and tsla.counters[0].difference == -5
    assert tsla.file_problems == [f"{lost.as_uri()}: missing"]
    assert cli_recount(store, "TSLA").exit_code == 7


def test_a_cleanup_run_again_after_a_release_deletes_no_row_it_did_not_archive(archived_family, t0):
    """Issue #49 item 4: a run quarantines IBM after its commit (its readers' copy was changed
    under the run); its cleanup archives and deletes AAPL and leaves IBM, marking IBM left out
    of its file. An operator releases IBM, then clears and runs that cleanup again (the same
    run, the same verified commits): the delete follows what the archive holds (the commit's
    mark), not the quarantine as it is now, so IBM's rows stay until the next run carries,
    archives and deletes them. Every row is archived once, and the recount holds."""
    family, store, client = archived_family(shards=1)
    load(client, t0, counters=("IBM", "AAPL"), before=10, after=0)
    epoch = t0 + timedelta(minutes=10)
    compact = f"{family.keyspace}.{family.compact_table}"

    def tamper(point: str) -> None:  # after IBM's copy is written: it is changed
        session = store.statements.session
        row = session.execute(f"SELECT value FROM {compact} WHERE type = 'IBM'").one()
        if point == "copy" and row is not None and row.value == 55:
            change_copy(session, compact, "IBM", 999)

    started = datetime.now(UTC)
    now = epoch + timedelta(minutes=5)
    plan = engine.plan_step(store, "q-run", epoch, now, started_at=started)
    steps = engine.RunSteps(store, plan, started, fault=tamper, now=now)
    verified = steps.verify(steps.compact(plan.shards))
    assert verified.tally.counters_quarantined == 1
    steps.fault = lambda _point: None
    cleanups = steps.cleanup(verified, plan.shards)
    with pytest.raises(engine.RunFailed):  # partial: IBM quarantined, AAPL compacted
        steps.conclude(verified, steps.check_cleanup(verified, cleanups))
    assert rows_at_or_below(store, ("IBM",), epoch) == 10
    assert {r[0] for r in archived_rows(family)} == {"AAPL"}
    engine.release(store, ("IBM",))  # the readers' copy restored from the ledger: 55
    assert client.read("IBM") == 55
    again = steps.cleanup(verified, plan.shards)  # "Clear" on the run's cleanup task
    assert sum(r.rows_deleted for r in again) == 10  # AAPL's, again: IBM's were not archived
    assert rows_at_or_below(store, ("IBM",), epoch) == 10
    assert_each_row_archived_once(store, 10)
    assert_recount_equal(store)
    later = run(store, epoch + timedelta(minutes=1), run_id="after-release")
    assert later.outcome == "success" and later.tally.counted_present == 10
    assert rows_at_or_below(store, ("IBM",), epoch) == 0 and client.read("IBM") == 55
    assert sorted(r[4] for r in archived_rows(family) if r[0] == "IBM") == list(range(1, 11))
    assert_each_row_archived_once(store, 20)
    assert_recount_equal(store)
