"""Writers whose clocks are off, and rows stamped with a write timestamp of their own.

The write API stamps each raw row with its own time (``USING TIMESTAMP`` = ``modify_time``),
so a writer's clock moves only where its rows land (after the epoch, or late), never whether a
cleanup's tombstone shadows them. A writer outside it that stamps a row ahead of the cluster
(a driver's client timestamp from a clock ahead, an explicit ``USING TIMESTAMP``) outlives the
tombstone of the run that counted it: the cleanup check that finds it deletes it again at its
own write time and says so (the run succeeds); one the check does not sample stays counted
(carried in the checkpoint's ``pending``) until a cleanup whose tombstone is newer, or a check
that samples it, deletes it; it is never counted twice or lost. The clocks are compressed: a
writer's clock is ``time_machine`` around its own calls (or the time it would read, for a write made
while a run is under way), and a run later than the cluster passes the engine's ``now=``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from counters import engine
from counters.client import CounterClient
from counters.connection import Connection
from counters.core import to_micros

from .helpers import aware, plain_insert, raw_rows, real_now, rows_at_or_below, skewed

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("marks_forgotten_at_once")]

HOUR = timedelta(hours=1)


@pytest.fixture
def writer_conn(conn) -> Iterator[Connection]:
    """The skewed writers' own connection (their own hosts): a write a connection makes under
    a skewed clock before it measures the cluster's carries that clock's time, which the test
    session's connection should not."""
    writer = Connection(conn.settings)
    yield writer
    writer.close()


def test_skewed_writers_rows_are_counted_once_and_deleted_once_folded(make_family, writer_conn):
    """A writer an hour ahead and ones 10 and 40 minutes behind the cluster (lag 1 min) write
    through the write API before, during and after runs at the cluster's epochs, and retry their
    events after runs deleted them. A row written behind the epoch during a run is a late row,
    in the value from the next run (its mark names its minute, which that run reads down to);
    the ahead writer's are after every epoch until a run an hour later (the engine's ``now=``)
    folds them. Every row is counted once and deleted once folded."""
    family, store, client = make_family(lag="1m", shards=1, sweep_interval="1d")
    writer = CounterClient(writer_conn, family)
    start = real_now().replace(second=0, microsecond=0)
    epoch1, epoch2 = start - timedelta(minutes=2), start - timedelta(minutes=1)
    written: list = []

    def write(amount: int, skew: timedelta, *, version: int, replay_of: timedelta | None = None):
        """One event of the writer ``skew`` off: at its clock's now, or (``replay_of``) an
        event that long before it, given with its own time and identity (a queue's replay)."""
        with skewed(skew):
            at = None if replay_of is None else datetime.now(UTC) - replay_of
            event = writer.increment(
                "IBM", amount, **({} if at is None else {"at": at, "identity": ("q", version)})
            )
        written.append(event)
        return event

    ahead = write(1, HOUR, version=1)
    behind = write(2, -timedelta(minutes=10), version=2)
    replayed = write(4, HOUR, version=3, replay_of=HOUR + timedelta(minutes=15))
    assert client.read("IBM") == 7

    during: list = []
    once = threading.Lock()

    def write_during(point: str) -> None:
        """Once the fold is committed, a writer 40 minutes behind writes a late row (its clock's
        now is before the epoch, and before every row the fold counted). Fault points are met
        by the buckets' threads: one write."""
        with once:
            if not during and store.ledger.committed_by(("IBM",)) is not None:
                at = aware(real_now() - timedelta(minutes=40))
                during.append(client.increment("IBM", 8, at=at, identity=("late", 4)))

    first = engine.run_family(store, epoch1, fault=write_during)
    assert first.outcome == "success" and during, first.message
    assert (first.tally.rows_folded, first.tally.rows_deleted) == (2, 2)  # behind, replayed
    assert client.read("IBM") == 7  # the late row waits for the next run (documented)
    # retries of the folded and deleted events stay deleted, whatever the writer's clock
    with skewed(HOUR):
        writer.record([replayed])
    with skewed(-timedelta(minutes=10)):
        writer.record([behind])
    second = engine.run_family(store, epoch2)
    assert second.outcome == "success", second.message
    assert (second.tally.late_rows, second.tally.late_sum) == (1, 8)
    assert client.read("IBM") == 15
    assert rows_at_or_below(store, ("IBM",), epoch2) == 0
    write(16, HOUR, version=5)  # after the runs, ahead again
    assert client.read("IBM") == 31
    # a run an hour later (the cluster's clock compressed): the ahead writer's rows are folded
    later = real_now() + HOUR + timedelta(minutes=2)
    third = engine.run_family(store, later - timedelta(minutes=1), now=later)
    assert third.outcome == "success", third.message
    assert (third.tally.rows_folded, third.tally.rows_deleted) == (2, 2)
    assert raw_rows(store, ("IBM",)) == [] and client.read("IBM") == 31
    with skewed(HOUR):
        writer.record([ahead, *during])  # retried once more after their deletion
    fourth = engine.run_family(store, later, now=later + timedelta(minutes=1))
    assert fourth.outcome in ("success", "idle"), fourth.message
    assert fourth.tally.rows_folded == 0
    assert raw_rows(store, ("IBM",)) == [] and client.read("IBM") == 31 == sum(
        e.increment for e in [*written, *during]
    )


def stamped_ahead_note(outcome) -> str | None:
    """The run's warning naming rows stamped ahead (a check that failed, not critical: the
    run succeeded and its audit row names them); None when it has none."""
    checks = {c.name: c for c in outcome.checks}
    assert checks["no_counted_rows_remain_after_cleanup"].success
    warning = checks.get("no_row_stamped_ahead")
    if warning is None:
        return None
    assert not warning.success and not warning.critical and outcome.outcome == "success"
    return warning.detail


@pytest.mark.parametrize("ahead", [HOUR, timedelta(days=365 * 100)], ids=["hour", "century"])
def test_a_row_stamped_ahead_of_the_cluster_is_counted_once_and_deleted_at_its_own_stamp(
    make_family, t0, ahead
):
    """A writer outside the write API stamps a row an hour (or a century: a bug's timestamp)
    ahead of the cluster. The run that counts it outlives its own tombstone for it; its
    cleanup check finds it, deletes it again just after its own write time and names it (the
    cause: a writer's clock ahead), and the run succeeds. A retry of the same row (the same
    stamp) stays deleted; nothing is counted twice or lost."""
    _family, store, client = make_family(shards=1, sweep_interval="10m")
    client.increment("IBM", 5, at=aware(t0 + timedelta(minutes=1)), identity=("w", 1))
    stamp = to_micros(real_now() + ahead)
    plain_insert(store, "IBM", t0 + timedelta(minutes=2), "p", 40, stamp)
    epoch = t0 + timedelta(minutes=10)
    first = engine.run_family(store, epoch, now=epoch + timedelta(minutes=5))  # sweeps
    assert first.outcome == "success", first.message
    note = stamped_ahead_note(first)
    assert note is not None and "IBM @ " in note and "s ahead" in note
    assert "1 counted row(s) were stamped ahead of the run's tombstones" in note
    row = store.audit.page(5)[0]
    assert row["run_id"] == first.plan.run_id and row["outcome"] == "success"
    assert json.loads(row["checks"])["no_row_stamped_ahead"].startswith("FAIL: 1 counted row(s)")
    assert raw_rows(store, ("IBM",)) == [] and client.read("IBM") == 45
    plain_insert(store, "IBM", t0 + timedelta(minutes=2), "p", 40, stamp)  # a retry: shadowed
    assert raw_rows(store, ("IBM",)) == []
    client.increment("IBM", 3, at=aware(epoch + timedelta(seconds=30)), identity=("w", 2))
    second = engine.run_family(
        store, epoch + timedelta(minutes=1), now=epoch + timedelta(minutes=2)
    )
    assert second.outcome == "success" and stamped_ahead_note(second) is None
    assert raw_rows(store, ("IBM",)) == [] and client.read("IBM") == 48
    swept = engine.run_family(store, epoch + timedelta(minutes=20), now=epoch + HOUR * 25)
    assert swept.plan.sweep and swept.tally.rows_folded == 0 and client.read("IBM") == 48
    assert engine.quarantined(store) == []


def test_one_row_found_stamped_ahead_has_the_check_look_at_its_whole_bucket(
    make_family, t0, monkeypatch
):
    """The check samples one counter of a bucket (``CLEANUP_CHECK_SAMPLE`` 1 here); when it
    finds a row stamped ahead there, it checks the bucket's other cleaned counters too: the
    same writer's other rows are ahead as well, and each is deleted again in the same run."""
    monkeypatch.setattr("counters.compaction.cleanup.CLEANUP_CHECK_SAMPLE", 1)
    _family, store, client = make_family(shards=1, sweep_interval="10m")
    by_bucket: dict[tuple[int, int], list[str]] = {}
    for n in range(500):
        by_bucket.setdefault(store.keys.bucket((f"C{n}",)), []).append(f"C{n}")
    names = next(group for group in by_bucket.values() if len(group) >= 3)[:3]
    stamp = to_micros(real_now() + HOUR)
    for n, name in enumerate(names):
        client.increment(name, 1, at=aware(t0 + timedelta(minutes=1)), identity=("w", n))
        plain_insert(store, name, t0 + timedelta(minutes=2), "p", 10 + n, stamp + n)
    epoch = t0 + timedelta(minutes=10)
    run = engine.run_family(store, epoch, now=epoch + timedelta(minutes=5))
    assert run.outcome == "success", run.message
    assert "3 counted row(s) were stamped ahead" in (stamped_ahead_note(run) or "")
    assert all(raw_rows(store, (name,)) == [] for name in names)
    assert [client.read(name) for name in names] == [11, 12, 13]


def test_a_row_stamped_ahead_that_the_cleanup_check_does_not_sample_stays_counted(
    make_family, t0, monkeypatch
):
    """The same row when its counter is not in the cleanup check's sample (a bucket of more
    counters than ``CLEANUP_CHECK_SAMPLE``; 0 here): the run succeeds and leaves it, counted.
    The next run is no sweep and reads the counter only from its new mark's minute, above the
    row: the checkpoint's ``low_ms`` still takes it down to the row, which it carries (counted,
    not again); the run an hour later deletes it, and a sweep then has nothing to count again.
    A fold that forgot it would leave it uncounted in its checkpoint, and the sweep would
    count it a second time (88 where 48 is right)."""
    monkeypatch.setattr("counters.compaction.cleanup.CLEANUP_CHECK_SAMPLE", 0)
    _family, store, client = make_family(shards=1, sweep_interval="10m")
    client.increment("IBM", 5, at=aware(t0 + timedelta(minutes=1)), identity=("w", 1))
    plain_insert(store, "IBM", t0 + timedelta(minutes=2), "p", 40, to_micros(real_now() + HOUR))
    epoch = t0 + timedelta(minutes=10)
    first = engine.run_family(store, epoch, now=epoch + timedelta(minutes=5))
    assert first.outcome == "success" and first.plan.sweep, first.message
    assert len(raw_rows(store, ("IBM",))) == 1 and client.read("IBM") == 45  # left, counted
    client.increment("IBM", 3, at=aware(epoch + timedelta(minutes=3)), identity=("w", 2))
    second = engine.run_family(
        store, epoch + timedelta(minutes=4), now=epoch + timedelta(minutes=5, seconds=30)
    )
    assert second.outcome == "success" and not second.plan.sweep, second.message
    assert (second.tally.counted_present, second.tally.rows_folded) == (1, 1)
    assert len(raw_rows(store, ("IBM",))) == 1 and client.read("IBM") == 48
    later = real_now() + HOUR + timedelta(minutes=5)  # a sweep too: a day after t0
    third = engine.run_family(store, epoch + timedelta(minutes=5), now=later)
    assert third.outcome == "success" and third.plan.sweep, third.message
    assert (third.tally.counted_present, third.tally.rows_folded) == (1, 0)
    assert raw_rows(store, ("IBM",)) == [] and client.read("IBM") == 48
    swept = engine.run_family(store, epoch + timedelta(minutes=20), now=later + HOUR)
    assert swept.plan.sweep and swept.tally.rows_folded == 0 and client.read("IBM") == 48
