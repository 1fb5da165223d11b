"""The cleanup check's re-delete of a counted row stamped ahead, attacked by a fresh-context
reader (2026-11-30): a row's liveness is not its increment cell's alone: another column of the
row can be newer (a plain-CQL process that updates another column of raw rows, with a clock
ahead), and a stamp can be the largest one Cassandra takes. The check reads the newest write
time of the row's own columns and deletes the row again just after it (at most at the largest
timestamp: a tombstone wins a tie); each test asserts the counted row is deleted, the run
succeeds, and the total is exact.
"""

from __future__ import annotations

import contextlib
from datetime import datetime, timedelta

import pytest
from counters import engine
from counters.client import CounterClient
from counters.core import to_micros
from counters.schema import read_raw_layout
from counters.store import Store

from .helpers import aware, plain_insert, raw_rows, real_now

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("marks_forgotten_at_once")]

HOUR = timedelta(hours=1)
LONG_MAX = 2**63 - 1


def table(store) -> str:
    f = store.family
    return f"{f.keyspace}.{f.raw_table}"


@pytest.fixture
def noted(make_family, conn):
    """A family whose raw table has one more column, as an application's table may have (a
    source, a note): the engine reads only the columns the family names, and its store reads
    the table's layout (what a row's write time is read from) as it is."""
    family, store, _client = make_family(shards=1, sweep_interval="10m", fresh=True)
    store.statements.session.execute(f"ALTER TABLE {table(store)} ADD note text")
    store = Store(conn, family, read_raw_layout(conn.session, family), concurrency=8)
    assert store.statements.layout.written == ("increment", "note")
    return store, CounterClient(conn, family, store)


def set_note(store, counter: str, at: datetime, actor: str, version: int, stamp_us: int) -> None:
    """Another process (plain CQL, its driver's clock ``stamp_us``) sets the note of a row."""
    store.statements.session.execute(
        f"UPDATE {table(store)} USING TIMESTAMP {stamp_us} SET note = 'enriched' "
        "WHERE type = %s AND modify_time = %s AND actor = %s AND version = %s",
        (counter, at, actor, version),
    )


def cleanup_check(outcome):
    (check,) = [c for c in outcome.checks if c.name == "no_counted_rows_remain_after_cleanup"]
    return check


def test_a_row_kept_alive_by_another_column_stamped_ahead_is_deleted_not_a_crash(noted, t0):
    """A write-API row (its increment stamped at its own time) whose note another process set
    with a clock an hour ahead: the run's tombstone shadows the increment cell but not the
    note, so the counted row is still present, its increment null. The check reads the
    note's write time and deletes the row after it (it raised on the null increment's write
    time, in every run until the cluster passed the note's stamp)."""
    store, client = noted
    client.increment("IBM", 5, at=aware(t0 + timedelta(minutes=1)), identity=("w", 1))
    at = t0 + timedelta(minutes=2)
    client.increment("IBM", 7, at=aware(at), identity=("w", 2))
    set_note(store, "IBM", at, "w", 2, to_micros(real_now() + HOUR))
    epoch = t0 + timedelta(minutes=10)
    first = engine.run_family(store, epoch, now=epoch + timedelta(minutes=5))
    assert first.outcome == "success", first.message
    assert cleanup_check(first).success
    assert raw_rows(store, ("IBM",)) == []
    assert client.read("IBM") == 12


def test_a_column_newer_than_the_increment_keeps_the_row_after_the_redelete(noted, t0):
    """A plain-CQL row stamped an hour ahead, and its note set a minute later by the same
    clock-ahead host: the row is deleted again after its newest cell (deleted after its
    increment's alone, the note kept it, the run failed and the next one raised)."""
    store, client = noted
    client.increment("IBM", 5, at=aware(t0 + timedelta(minutes=1)), identity=("w", 1))
    at = t0 + timedelta(minutes=2)
    stamp = to_micros(real_now() + HOUR)
    plain_insert(store, "IBM", at, "p", 40, stamp)
    set_note(store, "IBM", at, "p", 1, stamp + 60_000_000)
    epoch = t0 + timedelta(minutes=10)
    try:
        first = engine.run_family(store, epoch, now=epoch + timedelta(minutes=5))
        first_ok = (first.outcome, cleanup_check(first).success)
    except Exception as exc:
        first_ok = (f"{type(exc).__name__}: {exc}", False)
    left = raw_rows(store, ("IBM",))
    try:
        second = engine.run_family(
            store, epoch + timedelta(minutes=1), now=epoch + timedelta(minutes=6)
        )
        second_ok: object = second.outcome
    except Exception as exc:
        second_ok = f"{type(exc).__name__}: {exc}"
    assert client.read("IBM") == 45
    assert (first_ok, left, second_ok) == (("success", True), [], "idle")


def test_a_row_stamped_at_the_largest_timestamp_is_deleted_not_an_overflow(make_family, t0):
    """A bug's stamp: ``USING TIMESTAMP`` Long.MAX (Cassandra takes it). The check deletes it
    again at Long.MAX (a tombstone wins a tie with a cell), not at Long.MAX + 1, which no
    bigint holds (that raised, in every run, for good)."""
    _family, store, client = make_family(shards=1, sweep_interval="10m")
    client.increment("IBM", 5, at=aware(t0 + timedelta(minutes=1)), identity=("w", 1))
    plain_insert(store, "IBM", t0 + timedelta(minutes=2), "p", 40, LONG_MAX)
    epoch = t0 + timedelta(minutes=10)
    first = engine.run_family(store, epoch, now=epoch + timedelta(minutes=5))
    assert first.outcome == "success", first.message
    assert raw_rows(store, ("IBM",)) == []
    assert client.read("IBM") == 45


def test_the_total_stays_exact_while_the_runs_fail_on_a_row_kept_alive_ahead(noted, t0):
    """Rows kept alive ahead by their notes, over several runs: no total goes wrong, nothing is
    counted again, and the rows are gone."""
    store, client = noted
    client.increment("IBM", 5, at=aware(t0 + timedelta(minutes=1)), identity=("w", 1))
    at = t0 + timedelta(minutes=2)
    client.increment("IBM", 7, at=aware(at), identity=("w", 2))
    stamp = to_micros(real_now() + HOUR)
    plain_insert(store, "IBM", at, "p", 40, stamp)
    set_note(store, "IBM", at, "w", 2, stamp + 60_000_000)
    set_note(store, "IBM", at, "p", 1, stamp + 60_000_000)
    epoch = t0 + timedelta(minutes=10)
    for n, minutes in enumerate([5, 6, 7]):
        with contextlib.suppress(Exception):
            engine.run_family(
                store, epoch + timedelta(minutes=n), now=epoch + timedelta(minutes=minutes)
            )
        assert client.read("IBM") == 52
    client.increment(
        "IBM", 1, at=aware(epoch + timedelta(minutes=2, seconds=30)), identity=("w", 3)
    )
    later = real_now() + HOUR + timedelta(minutes=5)
    last = engine.run_family(store, epoch + timedelta(minutes=3), now=later)
    assert last.outcome == "success", last.message
    assert raw_rows(store, ("IBM",)) == [] and client.read("IBM") == 53


def test_the_redelete_spares_a_late_row_next_to_the_counted_one(make_family, t0):
    """A door found closed: the check's tombstone a century ahead names exact rows. A late row
    at the same millisecond (another actor), written during the run after the fold by the
    same clock-ahead writer, is not counted by this run, survives the re-delete, and the
    next run counts it once."""
    _family, store, client = make_family(shards=1, sweep_interval="10m")
    at = t0 + timedelta(minutes=2)
    stamp = to_micros(real_now() + timedelta(days=365 * 100))
    plain_insert(store, "IBM", at, "p", 40, stamp)
    epoch = t0 + timedelta(minutes=10)
    wrote: list[int] = []

    def late_writer(point: str) -> None:
        if point == "cleanup_read_log" and not wrote:
            wrote.append(1)
            plain_insert(store, "IBM", at, "q", 9, stamp + 5)

    first = engine.run_family(store, epoch, now=epoch + timedelta(minutes=5), fault=late_writer)
    assert first.outcome == "success" and wrote, first.message
    assert "stamped ahead" in {c.name: c for c in first.checks}["no_row_stamped_ahead"].detail
    assert len(raw_rows(store, ("IBM",))) == 1 and client.read("IBM") == 40
    second = engine.run_family(store, epoch + timedelta(minutes=1), now=epoch + HOUR * 25)
    assert second.outcome == "success", second.message
    assert raw_rows(store, ("IBM",)) == [] and client.read("IBM") == 49
