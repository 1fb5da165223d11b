"""The engine's guarantees, each against the real node."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime, timedelta

import pytest
from counters import engine
from counters.client import Increment
from counters.compaction.plan import sweep_due
from counters.config import Discovery
from counters.core import state_commit, to_millis, utc_aware
from counters.schema import SchemaError
from counters.store import BATCH_BYTES, Store

from tests.copies import after_write, change_copy

from .conftest import Crash
from .helpers import StalledRun, aware, compact_row, raw_rows, rows_at_or_below, state_with

pytestmark = pytest.mark.integration


def inc(counter, amount, at, actor="w", version=0):
    return Increment((counter,), amount, utc_aware(at), (actor, version))


def load(client, t0, counters=("IBM", "AAPL"), before=10, after=2, epoch_offset=10):
    """``before`` rows at or below t0+epoch_offset minutes and ``after`` rows above, per counter."""
    events = []
    for c in counters:
        for i in range(before):
            events.append(inc(c, i + 1, t0 + timedelta(minutes=i * epoch_offset / before), "w", i))
        for j in range(after):
            events.append(
                inc(c, 100, t0 + timedelta(minutes=epoch_offset, seconds=j + 1), "w", 1000 + j)
            )
    client.record(events)
    return events


def same_bucket(store, n, prefix="o"):
    """``n`` counter names whose rows, marks and checkpoints share one bucket."""
    by_bucket: dict = {}
    for i in range(10_000):
        name = f"{prefix}{i}"
        group = by_bucket.setdefault(store.keys.bucket((name,)), [])
        group.append(name)
        if len(group) == n:
            return group
    raise AssertionError("no bucket got enough counters")


def run(store, epoch, now=None, **kw):
    return engine.run_family(store, epoch, now=now or epoch + timedelta(minutes=5), **kw)


def test_fold_counts_rows_at_or_below_epoch_and_deletes_exactly_them(make_family, t0):
    _family, store, client = make_family()
    load(client, t0)
    epoch = t0 + timedelta(minutes=10)
    before = {c.counter: c.value for c in client.read_many(["IBM", "AAPL"])}
    summary = run(store, epoch)
    assert summary.outcome == "success"
    assert summary.tally.rows_folded == 20 and summary.tally.sum_folded == 2 * 55
    assert summary.tally.rows_deleted == 20
    for counter in (("IBM",), ("AAPL",)):
        row = compact_row(store, counter)
        assert (row.value, row.epoch) == (55, epoch)
        assert rows_at_or_below(store, counter, epoch) == 0
        assert len(raw_rows(store, counter)) == 2  # the newer rows are untouched
        assert client.read(counter) == before[counter] == 255


def test_shard_worker_processes_get_the_runs_plan_a_dry_run_writes_nothing(make_family, t0):
    """``counterctl compact --workers 2``: each worker process gets its shard's ``ShardJob``
    (the run's plan included), so a dry run there writes and deletes nothing, and the real run
    after it folds and deletes exactly the counted rows."""
    _family, store, client = make_family(shards=2)
    counters = [("IBM",), ("AAPL",), ("MSFT",), ("ORCL",)]
    assert {store.keys.shard(c) for c in counters} == {0, 1}  # both workers have work
    load(client, t0, counters=[c[0] for c in counters])
    epoch = t0 + timedelta(minutes=10)
    dry = run(store, epoch, workers=2, dry_run=True)
    assert dry.outcome == "dry-run" and dry.tally.rows_folded == 40, dry.message
    for counter in counters:
        assert compact_row(store, counter) is None
        assert rows_at_or_below(store, counter, epoch) == 10
    real = run(store, epoch, workers=2)
    assert real.outcome == "success" and real.tally.rows_deleted == 40, real.message
    for counter in counters:
        assert (compact_row(store, counter).value, rows_at_or_below(store, counter, epoch)) == (
            55,
            0,
        )
        assert client.read(counter) == 255


def test_increments_without_an_identity_in_the_same_millisecond_both_count(make_family, t0):
    _family, store, client = make_family()
    at = t0 + timedelta(seconds=1)
    first = client.increment("IBM", 5, at=aware(at))
    second = client.increment("IBM", 7, at=aware(at))
    assert first.identity != second.identity
    assert client.read("IBM") == 12
    client.record([first])  # a retry of the same event is the same row
    run(store, t0 + timedelta(minutes=1))
    assert client.read("IBM") == 12


def test_int_increments_are_summed_without_wrapping_and_overflow_is_quarantined(
    conn, engine_keyspace, make_family, t0
):
    table = f"raw_int_{secrets.token_hex(3)}"
    conn.session.execute(
        f"CREATE TABLE {engine_keyspace}.{table} (type text, modify_time timestamp, actor text, "
        "version bigint, increment int, PRIMARY KEY ((type), modify_time, actor, version))"
    )
    _family, store, client = make_family(raw_table=table)
    big = 2**31 - 1
    client.record([inc("wide", big, t0 + timedelta(seconds=i), "w", i) for i in range(3)])
    assert client.read("wide") == 3 * big  # Cassandra's sum(int) would wrap
    summary = run(store, t0 + timedelta(minutes=1))
    assert summary.outcome == "success" and client.read("wide") == 3 * big
    shard, bucket = store.keys.bucket(("wide",))
    ledger = store.ledger.read_ledger(shard, bucket, [("wide",)])
    near_max = ledger.checkpoints[("wide",)]
    state = store.statements.session.execute(
        f"SELECT state FROM {engine_keyspace}.{store.family.compact_table}_ledger "
        "WHERE shard = %s AND bucket = %s AND type = 'wide'",
        (shard, bucket),
    ).one()[0]
    # a counter close to the bigint limit, as the engine would leave it
    ledger = f"{engine_keyspace}.{store.family.compact_table}_ledger"
    where = "shard = %s AND bucket = %s AND type = 'wide'"
    stamp = after_write(store.statements.session, ledger, "state", where, (shard, bucket))
    store.statements.session.execute(
        f"UPDATE {ledger} USING TIMESTAMP {stamp} SET state = %s WHERE {where}",
        (state_with(state, value=2**63 - 10), shard, bucket),
    )
    store.statements.session.execute(
        f"UPDATE {engine_keyspace}.{store.family.compact_table} USING TIMESTAMP %s "
        "SET value = %s WHERE type = 'wide'",
        (near_max.version, 2**63 - 10),
    )
    client.record([inc("wide", 100, t0 + timedelta(minutes=1, seconds=5), "w", 9)])
    with pytest.raises(engine.ChecksFailed, match=r"wide: value \d+ would overflow a bigint"):
        run(store, t0 + timedelta(minutes=2))
    assert [q.reason for q in engine.quarantined(store)] == ["overflow"]
    assert store.audit.page(1)[0]["outcome"] == "partial"


def long_keyed_rows(client, t0, counters, rows=60):
    """``rows`` rows per counter, each with a 300-byte actor: a 500-row delete of them is
    ~160 KiB, over the node's default 50 KiB limit for a batch of many partitions."""
    client.record(
        [
            inc(c, 1, t0 + timedelta(seconds=i), secrets.token_hex(150), i)
            for c in counters
            for i in range(rows)
        ]
    )


def test_long_row_keys_are_deleted_in_batches_the_node_accepts(make_family, t0):
    _family, store, client = make_family(shards=1)
    counters = same_bucket(store, 12)
    long_keyed_rows(client, t0, counters)
    summary = run(store, t0 + timedelta(minutes=2))
    assert summary.outcome == "success" and summary.tally.rows_deleted == 12 * 60
    assert [v.value for v in client.read_many(counters)] == [60] * 12
    assert not any(raw_rows(store, (c,)) for c in counters)
    assert (
        store.statements.batch_bytes == BATCH_BYTES
    )  # the estimate kept every batch under the limit


def test_a_batch_the_node_refuses_as_too_large_is_sent_again_in_halves(make_family, t0):
    """As on a cluster whose batch_size_fail_threshold is below the engine's budget: the node
    refuses the batches whole, the engine splits them until they pass and keeps the lower
    budget."""
    _family, store, client = make_family(shards=1)
    counters = same_bucket(store, 12)
    long_keyed_rows(client, t0, counters)
    store.statements.batch_bytes = 2**30
    summary = run(store, t0 + timedelta(minutes=2))
    assert summary.outcome == "success" and summary.tally.rows_deleted == 12 * 60
    assert [v.value for v in client.read_many(counters)] == [60] * 12
    assert not any(raw_rows(store, (c,)) for c in counters)
    assert store.statements.batch_bytes < 50 * 1024


def test_counted_keys_too_long_for_one_commit_are_committed_in_parts(make_family, t0):
    """Rows with 2,000-character keys: a commit records every key it counts in one cell, and
    one record of them all (~31 MiB compressed) is a request Cassandra refuses (over 16 MiB).
    The engine commits the bucket's counters in chunks whose record fits, and folds the
    counter with the most rows over several runs, moving its own epoch as far as the rows that
    fit; readers are exact after every run."""
    _family, store, client = make_family(shards=1)
    wide, *others = same_bucket(store, 4, prefix="k")
    rows = {wide: 12_000, **{c: 3_000 for c in others}}
    client.record(
        [
            inc(c, 1, t0 + timedelta(milliseconds=5 * i), secrets.token_urlsafe(1_500), i)
            for c, n in rows.items()
            for i in range(n)
        ]
    )
    runs = []
    for minute in range(2, 8):
        runs.append(run(store, t0 + timedelta(minutes=minute)))
        assert runs[-1].outcome == "success"
        assert {v.counter[0]: v.value for v in client.read_many(list(rows))} == rows
        if not raw_rows(store, (wide,)):
            break
    assert len(runs) == 3  # 12,000 rows of ~2 KiB keys, at most 8 MiB of keys a commit
    assert sum(r.tally.rows_deleted for r in runs) == sum(rows.values())
    assert not any(raw_rows(store, (c,)) for c in rows)
    assert compact_row(store, (wide,)).value == 12_000


def test_a_fresh_mark_survives_a_run_however_late_its_cleanup(make_family):
    """A writer marks its counter, then stalls before writing the row. The run that reads the
    counter meanwhile must keep the mark (it is younger than the read by less than the margin),
    whatever time its cleanup runs at; the row is folded by the next run, found by the mark."""
    _family, store, client = make_family()
    now = datetime.now(UTC).replace(tzinfo=None, microsecond=0)
    store.state.advance_family_epoch(
        now - timedelta(days=1), "setup", swept_at=now + timedelta(days=1)
    )
    store.index.mark_touched([("slow",)])  # the writer's mark; its row comes later
    later = now + timedelta(minutes=10)  # the run's clock: e.g. its cleanup task minutes later
    run(store, now + timedelta(minutes=1), now=later)
    client.record([inc("slow", 42, now + timedelta(seconds=30), "w", 1)])  # the row lands
    summary = run(store, now + timedelta(minutes=2), now=later)
    assert summary.tally.rows_folded == 1
    assert client.read("slow") == 42 and rows_at_or_below(store, ("slow",), later) == 0


def test_rerun_same_or_older_epoch_is_a_recorded_noop(make_family, t0):
    _family, store, client = make_family()
    load(client, t0)
    epoch = t0 + timedelta(minutes=10)
    run(store, epoch)
    for again in (epoch, epoch - timedelta(minutes=3)):
        summary = run(store, again)
        assert summary.outcome == "noop"
        assert "not newer than the compacted epoch" in summary.message
    assert client.read("IBM") == 255
    outcomes = [r["outcome"] for r in store.audit.page(10)]
    assert outcomes.count("noop") == 2 and outcomes.count("success") == 1


def test_epoch_later_than_now_minus_lag_is_refused(make_family, t0):
    _family, store, client = make_family()
    load(client, t0)
    with pytest.raises(engine.EpochInFuture, match="later than now - lag"):
        engine.run_family(store, t0 + timedelta(minutes=10), now=t0 + timedelta(minutes=10))
    assert rows_at_or_below(store, ("IBM",), t0 + timedelta(minutes=10)) == 10


def test_a_changed_shard_count_is_refused_before_anything_is_read_or_deleted(make_family, t0):
    family, store, client = make_family()
    load(client, t0)
    run(store, t0 + timedelta(minutes=5))
    resharded = Store(store.conn, family.model_copy(update={"shards": 4}), store.layout)
    epoch = t0 + timedelta(minutes=10)
    with pytest.raises(SchemaError, match=r"'shards' is 4 in the YAML but 2 since the first"):
        run(resharded, epoch)
    assert rows_at_or_below(store, ("IBM",), epoch) == 4  # nothing deleted (4 of 10 left)
    assert [r["outcome"] for r in store.audit.page(10)] == ["success"]
    run(store, epoch)  # with the shard count back, the run goes on, exact
    assert client.read("IBM") == 255 and rows_at_or_below(store, ("IBM",), epoch) == 0


def test_late_write_is_folded_by_next_run_and_reported(make_family, t0):
    _family, store, client = make_family()
    load(client, t0)
    epoch = t0 + timedelta(minutes=10)
    run(store, epoch)
    client.record([inc("IBM", 7, t0 + timedelta(minutes=2), "late", 1)])  # behind the epoch
    assert client.read("IBM") == 255  # invisible to readers until folded: the documented gap
    summary = run(store, epoch + timedelta(minutes=1))
    assert (summary.tally.late_rows, summary.tally.late_sum) == (1, 7)
    assert summary.tally.max_lateness_ms == 8 * 60_000
    assert client.read("IBM") == 262
    audit = store.audit.page(1)[0]
    assert (audit["late_rows"], audit["late_sum"]) == (1, 7)


def test_late_write_during_a_run_survives_its_cleanup(make_family, t0):
    _family, store, client = make_family()
    load(client, t0, counters=("IBM",))
    epoch = t0 + timedelta(minutes=10)

    written = []

    def write_late(point):
        """Once IBM's fold is committed (and before cleanup), a late row arrives next to the
        rows it counted."""
        if not written and point != "lease" and store.ledger.committed_by(("IBM",)) is not None:
            written.append(point)
            client.record([inc("IBM", 1000, t0 + timedelta(minutes=1), "late", 2)])

    run(store, epoch, fault=write_late)
    assert written
    assert len([r for r in raw_rows(store, ("IBM",)) if r[1] == 1000]) == 1, "late row deleted"
    run(store, epoch + timedelta(minutes=1))
    assert client.read("IBM") == 55 + 200 + 1000


def test_retry_of_folded_increment_is_not_counted_twice(make_family, t0):
    _family, store, client = make_family()
    events = load(client, t0, counters=("IBM",))
    epoch = t0 + timedelta(minutes=10)
    run(store, epoch)
    client.record(events)  # every increment retried after it was folded and deleted
    assert client.read("IBM") == 255
    run(store, epoch + timedelta(minutes=2))
    assert client.read("IBM") == 255


def test_null_increment_quarantines_its_counter_and_the_rest_proceeds(make_family, t0):
    family, store, client = make_family()
    load(client, t0, counters=("IBM", "AAPL"))
    store.statements.session.execute(
        f"INSERT INTO {family.keyspace}.{family.raw_table} (type, modify_time, actor, version) "
        "VALUES ('IBM', %s, 'bad', 1)",
        (t0 + timedelta(minutes=1),),
    )
    epoch = t0 + timedelta(minutes=10)
    with pytest.raises(engine.ChecksFailed, match=r"1 counter\(s\) quarantined.*IBM"):
        run(store, epoch)
    assert rows_at_or_below(store, ("IBM",), epoch) == 11  # nothing of it deleted
    assert rows_at_or_below(store, ("AAPL",), epoch) == 0  # the rest of the family proceeds
    assert client.read("AAPL") == 255
    audit = store.audit.page(1)[0]
    assert audit["outcome"] == "partial" and "IBM" in audit["message"]
    assert [q.reason for q in engine.quarantined(store)] == ["bad_rows"]
    # every run keeps alerting while it is quarantined, and leaves it alone
    with pytest.raises(engine.ChecksFailed, match="quarantined"):
        run(store, epoch + timedelta(minutes=1))
    assert rows_at_or_below(store, ("IBM",), epoch) == 11
    # an operator fixes the row and releases the counter: the next run folds it
    store.statements.session.execute(
        f"UPDATE {family.keyspace}.{family.raw_table} SET increment = 0 "
        "WHERE type = 'IBM' AND modify_time = %s AND actor = 'bad' AND version = 1",
        (t0 + timedelta(minutes=1),),
    )
    engine.release(store, ("IBM",))
    assert run(store, epoch + timedelta(minutes=2)).outcome == "success"
    assert client.read("IBM") == 255 and rows_at_or_below(store, ("IBM",), epoch) == 0


def test_second_run_is_refused_while_a_lease_is_held(make_family, t0):
    _family, store, client = make_family(shards=1)
    load(client, t0)
    assert store.lease.acquire_lease(0, "other-run", 60) is None
    with pytest.raises(engine.LeaseHeld, match="held by run 'other-run'"):
        run(store, t0 + timedelta(minutes=10))
    assert rows_at_or_below(store, ("IBM",), t0 + timedelta(minutes=10)) == 10
    store.lease.release_lease(0, "other-run")
    assert run(store, t0 + timedelta(minutes=10)).outcome == "success"


def test_tampered_compact_row_is_quarantined_and_nothing_of_it_deleted(make_family, t0):
    family, store, client = make_family()
    load(client, t0)
    epoch = t0 + timedelta(minutes=10)

    def tamper(point):
        committed = compact_row(store, ("IBM",))
        if point == "copy" and committed is not None and committed.value == 55:
            change_copy(
                store.statements.session, f"{family.keyspace}.{family.compact_table}", "IBM", 999
            )

    with pytest.raises(engine.ChecksFailed) as info:
        run(store, epoch, fault=tamper)
    assert "IBM: compact value 999 (expected 55 = 0 + 55)" in str(info.value)
    assert rows_at_or_below(store, ("IBM",), epoch) == 10
    assert rows_at_or_below(store, ("AAPL",), epoch) == 0
    assert client.read("AAPL") == 255
    assert store.audit.page(1)[0]["outcome"] == "partial"
    engine.release(store, ("IBM",))  # restores the readers' copy from the ledger
    assert client.read("IBM") == 255
    assert run(store, epoch + timedelta(minutes=1)).outcome == "success"
    assert rows_at_or_below(store, ("IBM",), epoch) == 0 and client.read("IBM") == 255


@pytest.mark.parametrize("skew", ["operator_clock_ahead", "copy_written_in_the_future"])
def test_a_released_copy_is_written_after_the_ledgers_version_whatever_the_clocks(
    make_family, t0, monkeypatch, skew
):
    """Issue #43 item 8: the restored copy is written strictly after the ledger's version and
    after the changed copy, never at the operator's clock, and the next commit's copy is newer
    still: it neither loses to the restored copy nor quarantines the counter again."""
    from counters import maintenance
    from counters.core import to_micros

    family, store, client = make_family()
    load(client, t0)
    epoch = t0 + timedelta(minutes=10)
    run(store, epoch)
    hour_us = 3600 * 10**6
    now_us = to_micros(datetime.now(UTC))
    compact = f"{family.keyspace}.{family.compact_table}"
    session = store.statements.session
    if skew == "operator_clock_ahead":
        change_copy(session, compact, "IBM", 7)
    else:
        session.execute(
            f"UPDATE {compact} USING TIMESTAMP {now_us + hour_us} SET value = 7 WHERE type = 'IBM'"
        )
    later = epoch + timedelta(minutes=1)
    with pytest.raises(engine.ChecksFailed, match="quarantined"):
        run(store, later)
    if skew == "operator_clock_ahead":
        # the clock the release would write at, an hour ahead (a host that far off is refused
        # outright: test_clock_skew.py; this is the rule for any clock, the cluster's included)
        monkeypatch.setattr(
            maintenance, "cluster_micros", lambda *_a: to_micros(datetime.now(UTC)) + hour_us
        )
    engine.release(store, ("IBM",))
    monkeypatch.undo()
    assert client.read("IBM") == 255
    client.record([inc("IBM", 5, later + timedelta(seconds=1), "w", 77)])
    last = later + timedelta(minutes=1)
    assert run(store, last).outcome == "success"
    assert engine.quarantined(store) == [] and client.read("IBM") == 260
    assert compact_row(store, ("IBM",)).value == 260  # the new commit's copy won


def test_compact_row_changed_between_runs_is_detected_at_the_next_run(make_family, t0):
    family, store, client = make_family()
    load(client, t0)
    epoch = t0 + timedelta(minutes=10)
    run(store, epoch)
    change_copy(store.statements.session, f"{family.keyspace}.{family.compact_table}", "IBM", 7)
    client.record([inc("IBM", 1, t0 + timedelta(minutes=10, seconds=30), "w", 99)])
    with pytest.raises(engine.ChecksFailed, match="IBM: compact value 7"):
        run(store, epoch + timedelta(minutes=1))
    assert [q.reason for q in engine.quarantined(store)] == ["tampered"]
    assert len(raw_rows(store, ("IBM",))) == 3  # nothing of it folded or deleted
    assert client.read("AAPL") == 255


def test_counters_written_by_plain_cql_are_folded_by_the_default_sweep(make_family, t0):
    """Seed 004's writer: plain INSERTs, no index marks. The default discovery sweeps on the
    first run, then once every sweep_interval at the family's own phase (so the second may
    come sooner than an interval after the first, never later)."""
    family, store, client = make_family(sweep_interval="10m")
    insert = (
        f"INSERT INTO {family.keyspace}.{family.raw_table} (type, modify_time, actor, version, "
        "increment) VALUES (%s, %s, 'P1', %s, %s)"
    )
    for i, at in enumerate((t0, t0 + timedelta(minutes=1))):
        store.statements.session.execute(insert, ("IBM", at, i, 500))
    first = run(store, t0 + timedelta(minutes=2), now=t0 + timedelta(minutes=3))
    assert first.plan.sweep and first.tally.rows_folded == 2
    store.statements.session.execute(insert, ("IBM", t0 + timedelta(minutes=3), 7, 5))
    quiet = run(store, t0 + timedelta(minutes=4), now=t0 + timedelta(minutes=5))
    staggered = sweep_due(family, t0 + timedelta(minutes=5), t0 + timedelta(minutes=3))
    assert quiet.plan.sweep == staggered and client.read("IBM") == 1005  # readers exact
    assert quiet.outcome == ("success" if staggered else "idle")
    swept = run(store, t0 + timedelta(minutes=14), now=t0 + timedelta(minutes=15))
    assert swept.plan.sweep and quiet.tally.rows_folded + swept.tally.rows_folded == 1
    assert rows_at_or_below(store, ("IBM",), t0 + timedelta(minutes=14)) == 0
    assert client.read("IBM") == 1005


def test_scan_discovery_finds_rows_written_without_the_index(make_family, t0):
    _family, store, client = make_family(discovery=Discovery.SCAN, shards=3)
    counters = [f"c{i}" for i in range(30)]
    store.raw.insert_raw(  # straight into the raw table, as a foreign writer would
        [((c,), (t0, "x", 1), 2, 0) for c in counters]
    )
    summary = run(store, t0 + timedelta(minutes=1))
    assert summary.tally.counters_committed == 30
    assert all(v.value == 2 and v.newer_sum == 0 for v in client.read_many(counters))


CRASH_POINTS = [p for p in engine.FAULT_POINTS if p != "cleanup_mark"]


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_crash_at_every_point_then_rerun_is_exact(make_family, t0, point):
    _family, store, client = make_family(shards=2)
    counters = [f"s{i}" for i in range(6)]
    load(client, t0, counters=counters, before=5, after=1)
    expected = {c: sum(range(1, 6)) + 100 for c in counters}
    epoch = t0 + timedelta(minutes=10)
    hits = []

    def crash(p):
        if p == point and not hits:
            hits.append(p)
            raise Crash(p)

    with pytest.raises(Crash):
        run(store, epoch, commit_chunk=2, fault=crash, run_id="run-1")
    assert {v.counter[0]: v.value for v in client.read_many(counters)} == expected
    # the retry of the same run takes its own lease back and finishes the job
    retry = run(store, epoch, run_id="run-1")
    assert retry.outcome == ("noop" if point == "finish" else "success")
    assert {v.counter[0]: v.value for v in client.read_many(counters)} == expected
    for c in counters:
        assert rows_at_or_below(store, (c,), epoch) == 0
    # and the next run finds nothing left to fold twice
    run(store, epoch + timedelta(minutes=1))
    assert {v.counter[0]: v.value for v in client.read_many(counters)} == expected


def test_counted_rows_left_by_a_crash_are_told_apart_by_the_run_log(make_family, t0):
    """A run commits and crashes before its cleanup: the next run reads which rows that commit
    counted from the run log (the ledger keeps only their number and sum), counts them once,
    and deletes them. If that record is gone, the counter is quarantined, never guessed at."""
    from counters.schema import runs_table

    family, store, client = make_family(shards=1)
    a, b = same_bucket(store, 2)  # one bucket: the crash comes after both are committed
    # no sweep due: only that bucket is worked (a crash in another one would come first)
    store.state.advance_family_epoch(
        t0 - timedelta(days=1), "setup", swept_at=t0 + timedelta(days=2)
    )
    load(client, t0, counters=(a, b), before=5, after=1)
    epoch = t0 + timedelta(minutes=10)

    def crash(point):
        if point == "verify":
            raise Crash(point)

    with pytest.raises(Crash):
        run(store, epoch, fault=crash, run_id="crashed")
    assert client.read(a) == 115 and rows_at_or_below(store, (a,), epoch) == 5
    late = t0 + timedelta(minutes=3)  # a late row among the counted ones: not counted yet
    client.record([inc(a, 1000, late, "late", 1)])

    after = run(store, epoch + timedelta(minutes=1), run_id="next")
    assert after.outcome == "success"
    assert after.tally.counted_present == 10  # seen, not counted again
    assert (after.tally.rows_folded, after.tally.late_rows) == (3, 1)  # the late and newer rows
    assert {v.counter[0]: v.value for v in client.read_many([a, b])} == {a: 1115, b: 115}
    assert rows_at_or_below(store, (a,), epoch) == 0

    # the same crash, then the record of the commit is lost (the run log keeps it 14 days)
    client.record([inc(a, 7, epoch + timedelta(minutes=2), "w", 7)])
    with pytest.raises(Crash):
        run(store, epoch + timedelta(minutes=3), fault=crash, run_id="crashed-2")
    store.statements.session.execute(f"TRUNCATE {family.keyspace}.{runs_table(family)}")
    client.record([inc(a, 9, epoch + timedelta(minutes=2, seconds=5), "late", 2)])
    with pytest.raises(engine.ChecksFailed, match="quarantined"):
        run(store, epoch + timedelta(minutes=4), run_id="after-loss")
    [held] = engine.quarantined(store)
    assert (held.counter, held.reason) == ((a,), "keys_missing")
    assert "cannot be told from late rows" in held.detail
    # readers see the commit's copy plus the rows after its epoch (the late row waits, as every
    # late row does, here until the counter is released); nothing of it was deleted
    assert client.read(a) == 1115 + 7
    assert sorted(inc for _t, inc in raw_rows(store, (a,))) == [7, 9]


A_COMMITS_FIRST = ("commit", "copy", "verify", "forget", "cleanup_delete")
"""Points a run reaches after its commit applied: a rival builds on that commit."""


@pytest.mark.parametrize(
    "point",
    ["read_compact", "read_raw", "keys", "commit", "copy", "verify", "forget", "cleanup_delete"],
)
def test_overlapping_runs_without_lease_stay_exact(make_family, t0, point):
    """Run A stalls at ``point`` while run B (a stale lease holder's rival) runs to the end.

    The counters share one bucket (one ledger partition), and no run sweeps, so A's stall is in
    the very bucket B commits to. The test proves the overlap (A waited at ``point`` for all of
    B's run) and what each run then did: a commit A made first is built on by B (B counts its
    rows as present, not again); a commit A had still to make loses its compare-and-set to B's
    and adds nothing (B folded those rows); a stall before the raw read finds them deleted."""
    _family, store, client = make_family(shards=1)
    counters = same_bucket(store, 4)
    store.state.advance_family_epoch(
        t0 - timedelta(days=1), "setup", swept_at=t0 + timedelta(days=2)
    )
    load(client, t0, counters=counters, before=4, after=1)  # 1+2+3+4 at or below A's epoch
    expected = {c: 10 + 100 for c in counters}

    def run_a(fault):
        return run(store, t0 + timedelta(minutes=10), use_lease=False, fault=fault, run_id="A")

    with StalledRun(point, run_a) as a:
        assert a.start(), f"run A ended without reaching {point}: {a.outcome()}"
        client.record([inc(c, 1, t0 + timedelta(minutes=3), "late", 7) for c in counters])
        expected = {c: v + 1 for c, v in expected.items()}
        b = run(store, t0 + timedelta(minutes=11), use_lease=False, run_id="B")
        assert a.waiting, f"run A did not wait at {point} while B ran: {a.outcome()}"
        a.release()
    assert a.overlapped and a.error is None, a.outcome()
    assert a.summary.outcome == b.outcome == "success", (a.outcome(), b.message)
    mine, rival = a.summary.tally, b.tally
    if point in A_COMMITS_FIRST:  # B folds only the late and newer rows on A's commit
        assert (mine.counters_committed, mine.rows_folded, mine.conflicts) == (4, 16, 0), mine
        assert (rival.rows_folded, rival.late_rows) == (8, 4), rival
        # A's counted rows are still there for B to see unless A's cleanup deleted them
        assert rival.counted_present == (0 if point == "cleanup_delete" else 16), rival
    else:  # B folds everything; A's commit, if it had one to make, lost to B's
        assert (rival.rows_folded, rival.counted_present) == (24, 0), rival
        # read before B's cleanup, A's rows make a commit that conflicts; read after, none
        lost = 0 if point == "read_compact" else 4
        assert (mine.counters_committed, mine.rows_folded, mine.conflicts) == (0, 0, lost), mine
    run(store, t0 + timedelta(minutes=12), use_lease=False, run_id="C")
    assert {v.counter[0]: v.value for v in client.read_many(counters)} == expected


def _second_fold_of_one_bucket(make_family, t0, n=40):
    """A bucket of ``n`` counters folded once (a sweep); then 3 more rows each, for a second
    run that is no sweep and reads the bucket whole (the shared token-range recount)."""
    _family, store, client = make_family(shards=1)
    counters = same_bucket(store, n)
    load(client, t0, counters=counters, before=4, after=0)
    first = t0 + timedelta(minutes=10)
    run(store, first)
    client.record(
        [
            inc(c, 10 + j, first + timedelta(seconds=10 * (j + 1)), "w", 50 + j)
            for c in counters
            for j in range(3)
        ]
    )
    return store, client, counters, first


def test_a_second_fold_is_recounted_above_its_floor_and_a_lost_row_still_fails_it(make_family, t0):
    store, client, counters, first = _second_fold_of_one_bucket(make_family, t0)
    calls = []
    recount = store.raw.recount

    def recording(shard, bucket, names, epoch_ms, after_ms=None):
        calls.append((store.statements.current_phase, names is None, after_ms))
        return recount(shard, bucket, names, epoch_ms, after_ms)

    store.raw.recount = recording
    victim = counters[0]

    def lose_a_row(point):
        if point == "copy":  # after the commit, before the recount: a row it counted vanishes
            f = store.family
            store.statements.session.execute(
                f"DELETE FROM {f.keyspace}.{f.raw_table} WHERE type = %s AND modify_time = %s "
                "AND actor = 'w' AND version = 51",
                (victim, first + timedelta(seconds=20)),
            )

    with pytest.raises(engine.ChecksFailed, match=f"{victim}: recount"):
        run(store, first + timedelta(minutes=1), fault=lose_a_row)
    # one shared read, above the earliest row this fold counted: no tombstone of the first fold
    floor = to_millis(first + timedelta(seconds=10)) - 1
    assert [c for c in calls if c[0] == "verify"] == [("verify", True, floor)]
    assert [q.counter for q in engine.quarantined(store)] == [(victim,)]
    values = {v.counter[0]: v.value for v in client.read_many(counters)}
    assert all(values[c] == 10 + 33 for c in counters[1:])


def test_rows_below_the_recount_floor_are_left_for_the_next_run(make_family, t0):
    store, client, counters, first = _second_fold_of_one_bucket(make_family, t0)
    late, fresh = counters[1], counters[2]

    def write_behind(point):
        if point == "copy":  # after the fold read: a late row (below the floor), a new row
            client.record(
                [
                    inc(late, 1000, t0 + timedelta(minutes=1), "late", 1),
                    inc(fresh, 2000, first + timedelta(seconds=45), "slow", 1),
                ]
            )

    summary = run(store, first + timedelta(minutes=1), fault=write_behind)
    assert summary.outcome == "success"
    assert len([r for r in raw_rows(store, (late,)) if r[1] == 1000]) == 1, "late row deleted"
    assert len([r for r in raw_rows(store, (fresh,)) if r[1] == 2000]) == 1, "new row deleted"
    run(store, first + timedelta(minutes=2))
    values = {v.counter[0]: v.value for v in client.read_many(counters)}
    assert values[late] == 10 + 33 + 1000 and values[fresh] == 10 + 33 + 2000
    assert all(values[c] == 10 + 33 for c in counters[3:])


def _as_records_from_before_the_key_bytes(store, family) -> int:
    """Rewrite the run log's records as a version before the key bytes wrote them (JSON keys,
    zlib): what an upgrade finds of a run that crashed before it."""
    import json
    import zlib

    from counters.schema import runs_table
    from counters.store import unpack_commit_keys

    table = f"{family.keyspace}.{runs_table(family)}"
    rewritten = 0
    for run_id, shard, bucket, commit_id, blob in store.statements.session.execute(
        f"SELECT run_id, shard, bucket, commit_id, keys FROM {table}"
    ):
        if blob is None:
            continue
        entries = [
            [counter, epoch, [list(k) for k in keys.keys]]
            for counter, epoch, keys in unpack_commit_keys(blob, store.keys.key_codec)
        ]
        store.statements.session.execute(
            f"UPDATE {table} SET keys = %s WHERE run_id = %s AND shard = %s AND bucket = %s "
            "AND commit_id = %s",
            (zlib.compress(json.dumps(entries).encode(), 1), run_id, shard, bucket, commit_id),
        )
        rewritten += 1
    return rewritten


def _crashed_before_upgrade(make_family, t0, point):
    """Two counters of one bucket, 5 rows each at or below the epoch and 1 above, and a run
    (``before-upgrade``) that crashed at ``point``: (family, store, client, counters, epoch)."""
    family, store, client = make_family(shards=1)
    counters = same_bucket(store, 2)
    store.state.advance_family_epoch(
        t0 - timedelta(days=1), "setup", swept_at=t0 + timedelta(days=2)
    )
    load(client, t0, counters=counters, before=5, after=1)
    epoch = t0 + timedelta(minutes=10)

    def crash(p):
        if p == point:
            raise Crash(p)

    with pytest.raises(Crash):
        run(store, epoch, fault=crash, run_id="before-upgrade")
    return family, store, client, counters, epoch


@pytest.mark.parametrize("point", ["verify", "cleanup_read_log"])
def test_a_run_log_record_from_before_the_key_bytes_is_still_read(make_family, t0, point):
    """A commit recorded before the counted keys were kept as CQL bytes (a JSON list): the
    retry's cleanup deletes exactly its rows, a later fold tells them from late ones."""
    family, store, client, counters, epoch = _crashed_before_upgrade(make_family, t0, point)
    assert _as_records_from_before_the_key_bytes(store, family) >= 1
    client.record([inc(counters[0], 1000, t0 + timedelta(minutes=3), "late", 1)])
    if point == "cleanup_read_log":  # the same run again: its cleanup reads the old record
        assert run(store, epoch, run_id="before-upgrade").outcome == "success"
    after = run(store, epoch + timedelta(minutes=1), run_id="after-upgrade")
    assert after.outcome == "success"
    if point == "verify":  # the counted rows were still there: seen, not counted again
        assert after.tally.counted_present == 10
    values = {v.counter[0]: v.value for v in client.read_many(counters)}
    assert values == {counters[0]: 1115, counters[1]: 115}
    for c in counters:
        assert rows_at_or_below(store, (c,), epoch + timedelta(minutes=1)) == 0


@pytest.mark.parametrize("stale_state", [False, True], ids=["no_state", "stale_state"])
def test_ledger_rows_an_older_version_committed_are_read_from_their_columns(
    make_family, t0, stale_state
):
    """A ledger row an older version committed holds the checkpoint in separate columns, with
    no ``state`` cell or one another commit left (an older version committing over a newer
    one's row): the run reads the columns, tells the counted rows still present from late
    ones, and its own commit writes ``state``."""
    from counters.schema import ledger_table

    from .helpers import ledger_as_older_versions_wrote_it

    # committed, nothing deleted: every counter has pending rows
    family, store, client, counters, epoch = _crashed_before_upgrade(make_family, t0, "verify")
    assert ledger_as_older_versions_wrote_it(store, stale_state=stale_state) == 2
    client.record([inc(counters[0], 1000, t0 + timedelta(minutes=3), "late", 1)])
    after = run(store, epoch + timedelta(minutes=1), run_id="after-upgrade")
    assert after.outcome == "success" and after.tally.counted_present == 10
    values = {v.counter[0]: v.value for v in client.read_many(counters)}
    assert values == {counters[0]: 1115, counters[1]: 115}
    assert engine.quarantined(store) == []
    shard, bucket = store.keys.bucket((counters[0],))
    for commit_id, state in store.statements.session.execute(
        f'SELECT commit_id, state FROM {family.keyspace}."{ledger_table(family)}" '
        "WHERE shard = %s AND bucket = %s",
        (shard, bucket),
    ):
        assert state_commit(state) == commit_id.bytes


def test_the_collector_runs_less_often_while_a_shard_step_runs_and_as_before_after(make_family, t0):
    """Python's cyclic collector runs at ``STEP_GC_THRESHOLD`` for the shards' steps and at
    its old thresholds again after the run, whether it ends well or in a crash."""
    import gc

    from counters.compaction.common import STEP_GC_THRESHOLD

    _family, store, client = make_family(shards=2)
    load(client, t0)
    before = gc.get_threshold()
    seen: dict[str, int] = {}

    def note(point):
        seen.setdefault(point, gc.get_threshold()[0])

    assert run(store, t0 + timedelta(minutes=10), fault=note).outcome == "success"
    assert gc.get_threshold() == before
    assert {"lease", "read_raw", "commit", "copy", "verify", "cleanup_delete"} <= set(seen)
    assert seen.pop("finish") == before[0]  # the run's last step, after the shards'
    assert set(seen.values()) == {STEP_GC_THRESHOLD}, seen

    def crash(point):
        if point == "copy":
            raise Crash(point)

    load(client, t0 + timedelta(minutes=10))
    with pytest.raises(Crash):
        run(store, t0 + timedelta(minutes=20), fault=crash)
    assert gc.get_threshold() == before
