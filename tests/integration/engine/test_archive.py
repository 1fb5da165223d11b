"""The archive of deleted rows (issue #35, part 4) against the real node: every row a cleanup
deletes is in a Parquet file first, once, with its manifest in the run's audit row; a recount
from the archive and the rows still present equals the compact table after crashes, retries,
late rows and resets; a changed file is found by its checksum."""

from __future__ import annotations

import hashlib
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from counters import engine
from counters.archive import Manifest
from counters.client import Increment
from counters.recount import recount

from .conftest import Crash
from .helpers import rows_at_or_below

pytestmark = pytest.mark.integration


def inc(counter, amount, at, version, actor="w"):
    return Increment((counter,), amount, at, (actor, version))


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
    for _started, _run, archive in store.audit_log.archives():
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
    [row] = store.read_audit(5)
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


def assert_each_row_archived_once(store, expected_rows: int):
    named = set(recorded_files(store))
    rows = [r for path in named for r in archived_rows_of(path)]
    keys = Counter((r[0], r[1], r[2], r[3]) for r in rows)
    twice = [k for k, n in keys.items() if n > 1]
    assert not twice, f"archived twice: {twice[:5]}"
    assert len(rows) == expected_rows, len(rows)


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
        engine.finish_run(store, plan)
    elif then == "rerun":
        again = run(store, epoch, run_id="crashed")
        assert again.outcome == "success", again.message
        assert again.tally.counted_present == 30
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
