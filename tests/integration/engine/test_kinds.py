"""Family kinds other than increments: rows (business data, counted, never deleted)."""

from __future__ import annotations

import secrets
import time
from datetime import date, timedelta

import pytest
from cassandra.util import uuid_from_time
from counters import engine
from counters.core import EMPTY_CHECKPOINT, fold_slice, to_millis, utc_aware
from counters.schema import SchemaError
from counters.store import Store

from .conftest import Crash
from .helpers import aware
from .test_engine import same_bucket

pytestmark = pytest.mark.integration

DAY = date(2026, 3, 29)


@pytest.fixture
def orders(conn, engine_keyspace, make_family):
    """Seed 003's location_orders2 (composite partition key, timeuuid clustering)."""
    table = f"orders_{secrets.token_hex(3)}"
    conn.session.execute(
        f"CREATE TABLE {engine_keyspace}.{table} (location_id int, calculation_date date, "
        "timestamp timeuuid, order_id int, PRIMARY KEY ((location_id, calculation_date), "
        "timestamp, order_id)) WITH CLUSTERING ORDER BY (timestamp ASC, order_id ASC)"
    )
    family, store, client = make_family(
        kind="rows",
        raw_table=table,
        columns={"key": ["location_id", "calculation_date"], "time": "timestamp"},
    )
    insert = conn.session.prepare(
        f"INSERT INTO {engine_keyspace}.{table} (location_id, calculation_date, timestamp, "
        "order_id) VALUES (?, ?, ?, ?)"
    )

    def add(location, at, order_id):
        conn.session.execute(insert, (location, DAY, uuid_from_time(at), order_id))

    return family, store, client, add


def business_rows(store: Store) -> int:
    f = store.family
    return store.statements.session.execute(
        f"SELECT count(*) FROM {f.keyspace}.{f.raw_table}"
    ).one()[0]


def test_rows_family_counts_without_deleting(orders, t0):
    family, store, client, add = orders
    assert family.compact_columns.value == "count" and family.discovery.value == "scan"
    for i in range(10):
        add(1, t0 + timedelta(minutes=i), i)
        add(2, t0 + timedelta(minutes=i, seconds=30), 100 + i)
    epoch = t0 + timedelta(minutes=5)
    summary = engine.run_family(store, epoch, now=epoch + timedelta(minutes=5))
    assert summary.outcome == "success"
    assert summary.tally.rows_folded == 6 + 5 and summary.tally.rows_deleted == 0
    values = {v.counter[0]: v for v in client.read_many([(1, DAY), (2, DAY)])}
    assert (values[1].compact_value, values[1].value) == (6, 10)
    assert (values[2].compact_value, values[2].value) == (5, 10)
    assert values[1].epoch == epoch
    assert business_rows(store) == 20
    row = store.statements.session.execute(
        f"SELECT count, counted_until FROM {family.keyspace}.{family.compact_table} "
        "WHERE location_id = 1 AND calculation_date = %s",
        (DAY,),
    ).one()
    assert row.count == 6 and row.counted_until.version == 1  # a timeuuid checkpoint
    engine.run_family(store, t0 + timedelta(minutes=20), now=t0 + timedelta(minutes=30))
    assert [v.compact_value for v in client.read_many([(1, DAY), (2, DAY)])] == [10, 10]
    assert business_rows(store) == 20


@pytest.mark.parametrize(
    "point", ["read_compact", "read_raw", "commit", "copy", "verify", "finish"]
)
def test_rows_family_crash_then_rerun_is_exact(orders, t0, point):
    _family, store, client, add = orders
    for i in range(8):
        add(i % 3, t0 + timedelta(minutes=i), i)
    epoch = t0 + timedelta(minutes=10)

    def crash(p):
        if p == point:
            raise Crash(p)

    with pytest.raises(Crash):
        engine.run_family(
            store, epoch, now=epoch + timedelta(minutes=2), fault=crash, run_id="r1", commit_chunk=1
        )
    engine.run_family(store, epoch, now=epoch + timedelta(minutes=2), run_id="r1")
    values = client.read_many([(i, DAY) for i in range(3)])
    assert [v.value for v in values] == [3, 3, 2]
    assert [v.compact_value for v in values] == [3, 3, 2]
    assert business_rows(store) == 8


def test_rows_family_overlapping_commits_never_double_count(orders, t0):
    """Two runs fold the same slice; the second commit is refused by the checkpoint's CAS."""
    _family, store, client, add = orders
    for i in range(5):
        add(1, t0 + timedelta(minutes=i), i)
    key = (1, DAY)
    epoch = t0 + timedelta(minutes=10)
    shard, bucket = store.keys.bucket(key)
    ledger = store.ledger.read_ledger(shard, bucket, [key])
    base = {key: ledger.checkpoints.get(key, EMPTY_CHECKPOINT)}
    epoch_ms = to_millis(epoch)
    slice_ = store.raw.read_slices([key], base, epoch_ms)
    fold = fold_slice(key, base[key], *slice_[key], epoch_ms)
    now = to_millis(epoch) * 1000
    first = [
        store.ledger.commit_bucket(
            shard, bucket, ledger.head, [fold], store.ledger.new_commit_id(), "A", now
        )
    ]
    second = [
        store.ledger.commit_bucket(
            shard, bucket, ledger.head, [fold], store.ledger.new_commit_id(), "B", now
        )
    ]
    assert (first, second) == ([True], [False])
    assert client.read_many([key])[0].value == 5  # no copy for readers yet: still exact
    assert store.ledger.read_ledger(shard, bucket, [key]).checkpoints[key].value == 5


def test_rows_family_needs_a_time_clustering_column(conn, engine_keyspace, make_family):
    table = f"bad_{secrets.token_hex(3)}"
    conn.session.execute(
        f"CREATE TABLE {engine_keyspace}.{table} (k int, seq int, v int, PRIMARY KEY (k, seq))"
    )
    with pytest.raises(
        SchemaError, match=r"family '.*': raw table .*columns.time 'seq' has type int"
    ):
        make_family(kind="rows", raw_table=table, columns={"key": "k", "time": "seq"})


def test_rows_family_missing_raw_table_is_not_created(make_family):
    with pytest.raises(SchemaError, match="does not exist"):
        make_family(kind="rows", raw_table="no_such_table", columns={"key": "k", "time": "t"})


# --- unique ------------------------------------------------------------------------------


@pytest.fixture
def meetings(make_family):
    """Seed 000's meeting_users: who accepted, first write wins."""
    suffix = secrets.token_hex(3)
    return make_family(
        kind="unique", raw_table=f"members_{suffix}", columns={"key": "meeting", "member": "user"}
    )


def compact_all(store, t0, minutes=30, **kw):
    return engine.run_family(
        store, t0 + timedelta(minutes=minutes), now=t0 + timedelta(minutes=minutes + 5), **kw
    )


def test_unique_first_write_wins_and_counts_distinct_members(meetings, t0):
    _family, store, client = meetings
    assert client.add_member("m1", "alice", at=aware(t0)) is True
    assert (
        client.add_member("m1", "alice", at=aware(t0 + timedelta(minutes=1))) is False
    )  # retry later
    assert client.add_member("m1", "bob", at=aware(t0 + timedelta(minutes=2))) is True
    assert client.read("m1") == 2
    summary = compact_all(store, t0)
    assert summary.tally.rows_folded == 2
    assert client.read("m1") == 2
    assert client.add_member("m1", "alice", at=aware(t0 + timedelta(minutes=40))) is False
    compact_all(store, t0, minutes=60)
    assert client.read("m1") == 2
    assert engine.reconcile(store) == []


def test_unique_copies_carrying_many_members_are_written_in_batches_the_node_accepts(meetings, t0):
    """A unique copy carries the members its commit counted that are not deleted yet: 12
    meetings of 150 new members are ~10 KiB a copy, and a batch of them all would be over the
    node's 50 KiB limit for a batch of many partitions."""
    _family, store, client = meetings
    names = same_bucket(store, 12, prefix="m")
    members = {m: [f"user-{secrets.token_hex(16)}" for _ in range(150)] for m in names}
    client.add_members(
        [(m, user) for m in names for user in members[m]], at=aware(t0 + timedelta(minutes=1))
    )
    summary = compact_all(store, t0)
    assert summary.outcome == "success" and summary.tally.rows_folded == 12 * 150
    assert [client.read(m) for m in names] == [150] * 12
    assert engine.reconcile(store) == []


def test_unique_add_members_in_bulk_matches_one_by_one(meetings, t0):
    """The bulk write API answers "first" per pair like add_member: an existing member is not
    first, a pair repeated within the call is first once; the count is distinct members."""
    _family, store, client = meetings
    assert client.add_member("m1", "alice", at=aware(t0)) is True
    firsts = client.add_members(
        [("m1", "alice"), ("m1", "bob"), ("m2", "bob"), ("m1", "bob"), ("m2", "carol")],
        at=aware(t0 + timedelta(minutes=1)),
    )
    assert firsts == [False, True, True, False, True]
    assert [client.read("m1"), client.read("m2")] == [2, 2]
    summary = compact_all(store, t0)
    assert summary.tally.rows_folded == 4
    assert [client.read("m1"), client.read("m2")] == [2, 2]
    assert engine.reconcile(store) == []


def test_unique_concurrent_writers_racing_on_the_same_members(meetings, t0):
    _family, store, client = meetings
    import threading

    members = [f"user-{i}" for i in range(40)]
    firsts: list[str] = []
    lock = threading.Lock()
    offsets = (0, 1, 2, 3)
    start = threading.Barrier(len(offsets), timeout=60)
    spans: dict[int, tuple[float, float]] = {}  # writer -> (first write sent, last answered)

    def writer(offset_s: int) -> None:
        start.wait()  # all four write the same members at once
        began = time.monotonic()
        for m in members:
            if client.add_member("m1", m, at=aware(t0 + timedelta(seconds=offset_s))):
                with lock:
                    firsts.append(m)
        spans[offset_s] = (began, time.monotonic())

    threads = [threading.Thread(target=writer, args=(s,), daemon=True) for s in offsets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(t.is_alive() for t in threads) and len(spans) == len(offsets), spans
    # they raced: every writer was still writing when the last one started
    assert max(b for b, _e in spans.values()) < min(e for _b, e in spans.values()), spans
    # every member was first for somebody; with skewed clocks (or the same microsecond) more
    # than one writer can be told "first" (the seed's caveat) - the count must not care
    assert set(firsts) == set(members)
    assert client.read("m1") == 40
    compact_all(store, t0)
    assert client.read("m1") == 40


def test_unique_writer_with_clock_behind_wins_but_counts_once(meetings, t0):
    """A writer whose clock is behind 'wins' over a member first written earlier by another
    writer (its timestamp is larger): both believe they were first, the count stays exact."""
    _family, store, client = meetings
    assert client.add_member("m1", "carol", at=aware(t0 + timedelta(minutes=5))) is True
    compact_all(store, t0, minutes=10)  # carol's row is folded and deleted, carol marked
    assert client.add_member("m1", "carol", at=aware(t0 + timedelta(minutes=1))) is True  # behind
    compact_all(store, t0, minutes=20)
    assert client.read("m1") == 1
    # and before any mark exists: both rows in one fold
    assert client.add_member("m2", "dave", at=aware(t0 + timedelta(minutes=25))) is True
    assert client.add_member("m2", "dave", at=aware(t0 + timedelta(minutes=22))) is True
    compact_all(store, t0, minutes=40)
    assert client.read("m2") == 1


def test_unique_writer_crash_between_member_and_row_is_healed_by_reconcile(meetings, t0):
    _family, store, client = meetings
    client.add_member("m1", "erin", at=aware(t0))
    store.raw.add_member(("m1",), "frank", t0)  # crashed before writing its derived row
    assert client.read("m1") == 1
    [found] = engine.reconcile(store)
    assert (found.counter, found.expected, found.counted) == (("m1",), 2, 1)
    engine.reconcile(store, repair=True)
    compact_all(store, t0)
    assert client.read("m1") == 2
    assert engine.reconcile(store) == []


@pytest.mark.parametrize(
    "point",
    ["read_raw", "keys", "commit", "copy", "cleanup_read_log", "cleanup_mark", "cleanup_delete"],
)
def test_unique_crash_then_rerun_is_exact(meetings, t0, point):
    _family, store, client = meetings
    for i in range(6):
        client.add_member(f"m{i % 2}", f"u{i}", at=aware(t0 + timedelta(minutes=i)))
        client.add_member(
            f"m{i % 2}", f"u{i}", at=aware(t0 + timedelta(minutes=i) - timedelta(minutes=3))
        )

    def crash(p):
        if p == point:
            raise Crash(p)

    with pytest.raises(Crash):
        compact_all(store, t0, fault=crash, run_id="r1")
    compact_all(store, t0, run_id="r1")
    compact_all(store, t0, minutes=50)
    assert [client.read("m0"), client.read("m1")] == [3, 3]
    assert engine.reconcile(store) == []


# --- reset -------------------------------------------------------------------------------


def test_reset_is_idempotent_and_later_increments_count(make_family, t0):
    from counters.client import Increment

    _family, store, client = make_family()
    client.record(
        [Increment(("IBM",), 10, utc_aware(t0 + timedelta(minutes=i)), ("w", i)) for i in range(6)]
    )
    engine.run_family(store, t0 + timedelta(minutes=2), now=t0 + timedelta(minutes=3))
    at = t0 + timedelta(minutes=4)
    result = engine.reset_counter(store, ("IBM",), aware(at), now=t0 + timedelta(minutes=10))
    assert (result.value_before, result.already_done) == (60, False)
    assert result.rows_deleted == 2  # the rows at minutes 3 and 4: consumed by the reset
    assert client.read("IBM") == 10  # minute 5 came after the reset point
    again = engine.reset_counter(store, ("IBM",), aware(at), now=t0 + timedelta(minutes=10))
    assert again.already_done and client.read("IBM") == 10
    client.record([Increment(("IBM",), 7, utc_aware(t0 + timedelta(minutes=6)), ("w", 99))])
    engine.run_family(store, t0 + timedelta(minutes=8), now=t0 + timedelta(minutes=10))
    assert client.read("IBM") == 17
    assert store.audit.page(5)[1]["outcome"] == "reset"
    with pytest.raises(engine.EngineError, match="before its compacted epoch"):
        engine.reset_counter(store, ("IBM",), aware(t0 + timedelta(minutes=1)), reset_id="other")


def test_reset_of_rows_family_moves_its_checkpoint(orders, t0):
    _family, store, client, add = orders
    for i in range(6):
        add(1, t0 + timedelta(minutes=i), i)
    engine.reset_counter(store, (1, DAY), aware(t0 + timedelta(minutes=3)))
    assert client.read_many([(1, DAY)])[0].value == 2
    assert business_rows(store) == 6


def test_unique_family_cannot_be_reset(meetings, t0):
    _family, store, _client = meetings
    with pytest.raises(engine.EngineError, match="cannot be reset"):
        engine.reset_counter(store, ("m1",), aware(t0))


def test_unique_reader_does_not_count_a_duplicate_of_a_counted_member(meetings, t0):
    """A clock-behind winner leaves a second derived row; when it is newer than the epoch and
    the member is already counted, readers must not count it again (and reconcile must then
    see a writer that crashed before its row)."""
    _family, store, client = meetings
    client.add_member("m1", "u5", at=aware(t0 + timedelta(minutes=5)))
    client.add_member("m1", "u5", at=aware(t0 + timedelta(minutes=1)))  # behind: wins, second row
    engine.run_family(store, t0 + timedelta(minutes=3), now=t0 + timedelta(minutes=4))
    assert client.read("m1") == 1  # the row at minute 5 is a duplicate of a counted member
    store.raw.add_member(("m1",), "u0", t0 + timedelta(minutes=2))  # crashed before its row
    [found] = engine.reconcile(store, repair=True)
    assert (found.expected, found.counted) == (2, 1)
    compact_all(store, t0)
    assert client.read("m1") == 2


def test_reconcile_of_a_reset_rows_counter_recounts_from_the_reset_point(orders, t0):
    """A rows family's value counts from its last reset: reconcile recounts after that point,
    so a reset is no difference to report, and --repair never puts the old rows back."""
    _family, store, client, add = orders
    for i in range(5):
        add(1, t0 + timedelta(minutes=i), i)
    engine.run_family(store, t0 + timedelta(minutes=5), now=t0 + timedelta(minutes=6))
    engine.reset_counter(
        store, (1, DAY), aware(t0 + timedelta(minutes=5)), now=t0 + timedelta(minutes=6)
    )
    for i in range(2):
        add(1, t0 + timedelta(minutes=6, seconds=i), 10 + i)
    engine.run_family(store, t0 + timedelta(minutes=7), now=t0 + timedelta(minutes=8))
    assert client.read_many([(1, DAY)])[0].value == 2
    assert engine.reconcile(store) == []
    assert engine.reconcile(store, repair=True) == []
    assert client.read_many([(1, DAY)])[0].value == 2 and business_rows(store) == 7
    # the positive control: rows that arrive behind the checkpoint after the reset point are a
    # difference it reports; one behind the reset point is not (the reset consumed that time)
    add(1, t0 + timedelta(minutes=6, seconds=30), 20)
    add(1, t0 + timedelta(minutes=2, seconds=30), 21)
    assert engine.reconcile(store) == [engine.Discrepancy((1, DAY), 3, 2)]


def test_a_reset_repeated_without_a_point_is_one_reset(make_family, t0):
    from counters.client import Increment

    _family, store, client = make_family()
    now = t0 + timedelta(minutes=10)
    client.record(
        [Increment(("IBM",), 10, utc_aware(t0 + timedelta(minutes=i)), ("w", i)) for i in range(3)]
    )
    first = engine.reset_counter(store, ("IBM",), now=now)
    point = now - timedelta(minutes=1)  # now less the lag, truncated as an epoch is
    assert (first.value_before, first.already_done, first.at) == (30, False, point)
    client.record([Increment(("IBM",), 3, utc_aware(point + timedelta(seconds=30)), ("w", 9))])
    later = now + timedelta(minutes=5)
    again = engine.reset_counter(store, ("IBM",), now=later)  # the operator repeats it
    assert again.already_done and again.at == point
    assert client.read("IBM") == 3  # the increment after the first reset still counts
    explicit = engine.reset_counter(
        store, ("IBM",), aware(later), now=later
    )  # a point: a new reset
    assert not explicit.already_done and client.read("IBM") == 0


def test_a_reset_with_a_new_id_inside_the_window_resets_again_and_its_retry_once(make_family, t0):
    """Issue #43 item 5: the idempotency id decides when given (the one-hour window only
    without one); its retry after a run committed the counter finds the reset in the run log."""
    from counters.client import Increment

    _family, store, client = make_family()
    now = t0 + timedelta(minutes=10)
    client.record(
        [Increment(("IBM",), 10, utc_aware(t0 + timedelta(minutes=i)), ("w", i)) for i in range(3)]
    )
    engine.reset_counter(store, ("IBM",), now=now, reset_id="first")
    client.record([Increment(("IBM",), 7, utc_aware(now + timedelta(seconds=1)), ("w", 7))])
    later = now + timedelta(minutes=5)
    assert client.read("IBM") == 7
    second = engine.reset_counter(store, ("IBM",), now=later, reset_id="second")
    assert (second.already_done, second.value_before) == (False, 7)
    assert client.read("IBM") == 0
    assert second.at == later - timedelta(minutes=1)  # a point every retry computes alike
    client.record([Increment(("IBM",), 5, utc_aware(later + timedelta(seconds=1)), ("w", 5))])
    run_at = later + timedelta(minutes=2)
    engine.run_family(store, run_at, now=run_at + timedelta(minutes=1))  # the ledger moves on
    retry = engine.reset_counter(
        store, ("IBM",), now=later + timedelta(minutes=20), reset_id="second"
    )
    assert retry.already_done and retry.at == second.at
    assert client.read("IBM") == 5  # the increment after the reset still counts


def test_a_reset_without_a_point_leaves_a_write_just_before_now_to_the_new_era(make_family, t0):
    """Without --at the point is now less the lag (truncated to the minute as an epoch is): a
    write in flight with a time just before now counts after the reset, as a run would."""
    from counters.client import Increment

    _family, store, client = make_family()
    now = t0 + timedelta(minutes=10, seconds=30)
    client.record([Increment(("IBM",), 10, utc_aware(t0), ("w", 1))])
    engine.reset_counter(store, ("IBM",), now=now)
    client.record(
        [Increment(("IBM",), 4, utc_aware(now - timedelta(seconds=5)), ("w", 2))]
    )  # in flight
    assert client.read("IBM") == 4


def test_a_reset_point_in_the_future_is_refused(make_family, t0):
    from counters.client import Increment

    _family, store, client = make_family()
    client.record([Increment(("IBM",), 10, utc_aware(t0), ("w", 1))])
    now = t0 + timedelta(minutes=5)
    with pytest.raises(engine.EngineError, match="is in the future"):
        engine.reset_counter(store, ("IBM",), aware(now + timedelta(hours=1)), now=now)
    assert client.read("IBM") == 10


def remove_orders(store: Store, location: int, order_ids: set[int]) -> None:
    """Delete business rows by order id, as an application cancelling orders does."""
    f = store.family
    table = f"{f.keyspace}.{f.raw_table}"
    found = store.statements.session.execute(
        f"SELECT timestamp, order_id FROM {table} WHERE location_id = %s AND calculation_date = %s",
        (location, DAY),
    )
    for row in found:
        if row.order_id in order_ids:
            store.statements.session.execute(
                f"DELETE FROM {table} WHERE location_id = %s AND calculation_date = %s "
                "AND timestamp = %s AND order_id = %s",
                (location, DAY, row.timestamp, row.order_id),
            )


@pytest.mark.parametrize("by", ["sweep", "reconcile"])
def test_a_rows_counter_whose_rows_were_all_deleted_comes_down_to_zero(orders, t0, by):
    """A rows count is the number of rows that exist: a counter with no rows left (every
    order cancelled) is found through its checkpoint, brought to 0 and reported."""
    _family, store, client, add = orders
    for i in range(3):
        add(1, t0 + timedelta(minutes=i), i)
        add(2, t0 + timedelta(minutes=i), 10 + i)
    engine.run_family(store, t0 + timedelta(minutes=5), now=t0 + timedelta(minutes=6))
    assert [v.value for v in client.read_many([(1, DAY), (2, DAY)])] == [3, 3]
    remove_orders(store, 1, {0, 1, 2})
    if by == "reconcile":
        [found] = engine.reconcile(store)
        assert (found.counter[0], found.expected, found.counted) == (1, 0, 3)
        [repaired] = engine.reconcile(store, repair=True)
        assert repaired.repaired and repaired.difference == -3
        assert store.audit.page(1)[0]["sum_folded"] == -3
    else:
        summary = engine.run_family(store, t0 + timedelta(minutes=7), now=t0 + timedelta(minutes=8))
        assert summary.plan.sweep and summary.outcome == "success"
        assert (summary.tally.rows_gone, summary.tally.late_rows) == (3, 0)
        assert "3 counted business row(s) found deleted" in store.audit.page(1)[0]["message"]
    values = client.read_many([(1, DAY), (2, DAY)])
    assert [(v.compact_value, v.value) for v in values] == [(0, 0), (3, 3)]
    assert engine.reconcile(store) == [] and business_rows(store) == 3


@pytest.mark.parametrize("deleted, late", [(1, 1), (2, 1), (1, 2)])
def test_a_deleted_row_never_hides_a_late_row(orders, t0, deleted, late):
    """Counted rows deleted and rows written behind the checkpoint in the same interval: the
    sweep's count is exact (the rows that exist), and their net is reported as late rows or
    as rows gone."""
    _family, store, client, add = orders
    for i in range(4):
        add(1, t0 + timedelta(minutes=i), i)
    engine.run_family(store, t0 + timedelta(minutes=5), now=t0 + timedelta(minutes=6))
    assert client.read_many([(1, DAY)])[0].value == 4
    remove_orders(store, 1, set(range(deleted)))
    for j in range(late):  # behind the checkpoint (minute 4): a writer's clock behind
        add(1, t0 + timedelta(minutes=2, seconds=10 + j), 100 + j)
    add(1, t0 + timedelta(minutes=6), 200)  # a new row in the run's own slice
    exists = 4 - deleted + late + 1
    assert client.read_many([(1, DAY)])[0].value == 4 + 1  # readers: the count up to its epoch
    summary = engine.run_family(store, t0 + timedelta(minutes=7), now=t0 + timedelta(minutes=8))
    assert summary.plan.sweep and summary.outcome == "success"
    tally = summary.tally
    assert (tally.late_rows, tally.rows_gone) == (max(late - deleted, 0), max(deleted - late, 0))
    [value] = client.read_many([(1, DAY)])
    assert (value.compact_value, value.value) == (exists, exists)
    assert business_rows(store) == exists
    assert engine.reconcile(store) == []


def test_reconcile_of_a_reset_rows_counter_reports_a_row_deleted_after_the_reset(orders, t0):
    """The positive control of the test above it: a row counted after the reset point and
    deleted since is a difference reconcile reports (and --repair takes away); an order
    before the reset point, deleted too, is none (the reset consumed it)."""
    _family, store, client, add = orders
    for i in range(5):
        add(1, t0 + timedelta(minutes=i), i)
    engine.run_family(store, t0 + timedelta(minutes=5), now=t0 + timedelta(minutes=6))
    engine.reset_counter(
        store, (1, DAY), aware(t0 + timedelta(minutes=5)), now=t0 + timedelta(minutes=6)
    )
    for i in range(2):
        add(1, t0 + timedelta(minutes=6, seconds=i), 10 + i)
    engine.run_family(store, t0 + timedelta(minutes=7), now=t0 + timedelta(minutes=8))
    assert client.read_many([(1, DAY)])[0].value == 2
    remove_orders(store, 1, {0, 10})
    [found] = engine.reconcile(store)
    assert (found.expected, found.counted, found.repaired) == (1, 2, False)
    [repaired] = engine.reconcile(store, repair=True)
    assert (repaired.expected, repaired.counted, repaired.repaired) == (1, 2, True)
    assert client.read_many([(1, DAY)])[0].value == 1 and business_rows(store) == 5
    assert engine.reconcile(store) == []
