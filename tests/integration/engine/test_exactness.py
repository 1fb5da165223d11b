"""Exact at every moment and for every caller (issue #37), each against the real node."""

from __future__ import annotations

import functools
import random
import secrets
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
import pytz
from cassandra.util import uuid_from_time
from counters import engine
from counters.client import CounterClient, Increment
from counters.connection import Connection, ConnectionSettings
from counters.core import utc_aware
from counters.identity import written_shards
from counters.schema import SchemaError
from counters.store import Store

from tests.copies import after_copy

from .conftest import Crash
from .helpers import (
    StalledRun,
    aware,
    compact_row,
    forget_table_owners,
    raw_rows,
    rows_at_or_below,
)

pytestmark = pytest.mark.integration


def test_a_retried_increment_with_its_identity_and_time_is_one_row(make_family, t0):
    _family, _store, client = make_family()
    at = t0 + timedelta(seconds=3)
    client.increment("r", 500, at=aware(at), identity=("P1", 2))
    client.increment("r", 500, at=aware(at), identity=("P1", 2))  # the caller retries the call
    assert client.read("r") == 500


def test_an_identity_without_the_events_time_is_refused_and_writes_nothing(make_family):
    _family, _store, client = make_family()
    with pytest.raises(ValueError, match=r"identity \('P1', 2\) needs its event's time"):
        client.increment("r", 500, identity=("P1", 2))
    with pytest.raises(ValueError, match=r"needs its event's time too \(at=\.\.\.\)"):
        client.increment("r", 500, actor="P1", version=2)
    assert client.read("r") == 0


@pytest.mark.parametrize(
    "bad",
    [
        Increment(("r",), 5, None, ("P1", 2)),
        Increment(("r",), 5, "2026-11-25T10:00:00", ("P1", 2)),
        Increment(("r",), 5, "t0", ("P1", None)),
    ],
    ids=["no_time", "time_as_text", "identity_with_none"],
)
def test_record_keeps_the_rules_of_increment_and_writes_nothing_when_one_event_breaks_them(
    make_family, t0, bad
):
    """Issue #43 item 8: ``record`` refuses what ``increment`` refuses (an event without its
    own time, an identity with a missing part), naming the family, the field and the value,
    before it writes any event of the call."""
    _family, store, client = make_family()
    good = Increment(("r",), 7, utc_aware(t0), ("P0", 1))
    field = "identity" if bad.time == "t0" else "time"
    if bad.time == "t0":
        bad = Increment(bad.counter, bad.increment, utc_aware(t0), bad.identity)
    with pytest.raises(ValueError, match=rf"family '{_family.name}'.*{field}"):
        client.record([good, bad])
    assert rows_at_or_below(store, ("r",), t0 + timedelta(minutes=1)) == 0
    assert client.read("r") == 0


def test_actor_without_version_is_refused_so_two_events_never_merge(make_family, t0):
    _family, _store, client = make_family()
    at = t0 + timedelta(seconds=1)
    with pytest.raises(ValueError, match="pass actor= and version= together"):
        client.increment("r", 5, at=aware(at), actor="alice")
    with pytest.raises(ValueError, match="pass actor= and version= together"):
        client.increment("r", 5, at=aware(at), version=3)
    client.increment("r", 5, at=aware(at), actor="alice", version=1)
    client.increment("r", 7, at=aware(at), actor="alice", version=2)
    assert client.read("r") == 12


def test_a_naive_time_is_refused_at_the_write_api_and_nothing_is_written(make_family, t0):
    """``at=datetime.now()`` is this host's local time: a naive time is refused, naming the
    family and saying what to pass, before any write (an increment, a reset's point)."""
    _family, store, client = make_family()
    naive = t0 + timedelta(seconds=1)
    with pytest.raises(ValueError, match=r"family '.+': at=: .* naive .* pass a tz-aware time"):
        client.increment("r", 5, at=naive, identity=("o", 1))
    client.increment("r", 5, at=aware(naive), identity=("o", 2))
    assert raw_rows(store, ("r",)) == [(naive, 5)]
    with pytest.raises(ValueError, match=r"counter r: reset point at=: .* pass a tz-aware"):
        engine.reset_counter(store, ("r",), naive, now=t0 + timedelta(minutes=5))
    assert client.read("r") == 5 and raw_rows(store, ("r",)) == [(naive, 5)]


def test_record_refuses_a_naive_event_time_and_writes_nothing_of_its_batch(make_family, t0):
    """Issue #51 item 2: ``record()`` refuses a naive ``Increment.time`` (it may be this host's
    local time), naming the family, the counter and the value and saying what to pass, before
    any event of the call is written (no row, no touched mark). The same events with tz-aware
    times, in any zone, land at the very ms and write timestamp a naive UTC time was stored at
    (the table's ms, floored)."""
    family, store, client = make_family()
    at = t0 + timedelta(seconds=1, microseconds=234_567)
    good = [Increment(("r",), 7, utc_aware(at), ("P0", i)) for i in range(3)]
    with pytest.raises(ValueError) as refused:
        client.record([*good, Increment(("s",), 5, at, ("P1", 1))])
    said = str(refused.value)
    assert f"family {family.name!r}: counter ('s',): time: {at!r} is a naive datetime" in said
    assert "pass a tz-aware time" in said and "tzinfo=UTC" in said
    assert raw_rows(store, ("r",)) == [] and raw_rows(store, ("s",)) == []
    assert store.index.touched_count(100) == 0
    kolkata = utc_aware(at).astimezone(ZoneInfo("Asia/Kolkata"))
    client.record([*good, Increment(("s",), 5, kolkata, ("P1", 1))])
    stored = at.replace(microsecond=234_000)
    assert raw_rows(store, ("r",)) == [(stored, 7)] * 3 and raw_rows(store, ("s",)) == [(stored, 5)]
    cols = family.columns
    written = store.statements.session.execute(
        f'SELECT WRITETIME("{cols.increment}") FROM {family.keyspace}.{family.raw_table} '
        f'WHERE "{cols.key[0]}" = %s',
        ("s",),
    ).one()[0]
    assert written == (stored - datetime(1970, 1, 1)) // timedelta(microseconds=1)
    assert store.index.touched_count(100) == 2
    assert client.read("r") == 21 and client.read("s") == 5


@pytest.mark.parametrize(
    "local",
    [
        # pytz's way: the second 02:30 of the night Paris leaves summer time (CET, +01:00)
        pytz.timezone("Europe/Paris").localize(datetime(2026, 10, 25, 2, 30), is_dst=False),
        # a wall time the spring change skips: Python reads it with the offset before (+01:00)
        datetime(2026, 3, 29, 2, 30, tzinfo=ZoneInfo("Europe/Paris")),
    ],
    ids=["pytz_autumn_standard_hour", "zoneinfo_spring_gap"],
)
def test_a_retry_of_the_same_instant_in_another_tz_form_is_the_same_row(make_family, local):
    """A tz-aware ``at=`` is the instant its ``utcoffset()`` says, whatever object carries it:
    the event's retry with that instant in UTC (what ``local.astimezone(UTC)`` or a JSON round
    trip of ``local.isoformat()`` gives) writes the very same row, counted once. Re-reading
    the wall time in the zone's name (pendulum's ``instance``) moved these rows by an hour."""
    _family, store, client = make_family()
    instant = local.astimezone(UTC)
    client.increment("r", 500, at=local, identity=("P1", 2))
    client.increment("r", 500, at=instant, identity=("P1", 2))  # the caller retries the call
    carried = datetime.fromisoformat(local.isoformat())  # the event's time sent on as text
    client.increment("r", 500, at=carried, identity=("P1", 2))
    assert raw_rows(store, ("r",)) == [(instant.replace(tzinfo=None), 500)]
    assert client.read("r") == 500


def _events(counters, at, amount=15):
    return [Increment((c,), amount, utc_aware(at), ("w", 1)) for c in counters]


@pytest.mark.parametrize("reader", ["cold", "warm"])
def test_a_run_that_copies_and_deletes_between_a_readers_reads_is_not_seen(
    conn, make_family, t0, reader
):
    """The interleaving that lost 73 of 8,000 reads: a reader's first request, then a whole
    run commits, copies and deletes, then the reader's next request. Forced here by running
    the compaction inside the reader's first request: a cold reader's is the copies' read, a
    warm one's (it read the counters before, and starts from the epoch it read them at) the
    raw rows' read."""
    family, store, client = make_family(shards=2)
    counters = [f"c{i}" for i in range(60)]
    client.record(_events(counters, t0 + timedelta(seconds=10)))
    engine.run_family(store, t0 + timedelta(minutes=1), now=t0 + timedelta(minutes=6))
    client.record(_events(counters, t0 + timedelta(minutes=1, seconds=10), 5))
    epoch = t0 + timedelta(minutes=2)
    reading = CounterClient(conn, family, Store(conn, family, store.layout))
    if reader == "warm":
        assert {v.value for v in reading.read_many(counters)} == {20}
    ran: list[str] = []

    def after_first_request(method):
        def wrapped(*args, **kwargs):
            result = method(*args, **kwargs)
            if result and not ran:  # the first request sent
                ran.append(
                    engine.run_family(store, epoch, now=epoch + timedelta(minutes=5)).outcome
                )
            return result

        return wrapped

    reading.store.statements.concurrent = after_first_request(reading.store.statements.concurrent)
    reading.store.statements.run = after_first_request(reading.store.statements.run)
    values = reading.read_many(counters)
    assert ran == ["success"]
    assert rows_at_or_below(store, ("c0",), epoch) == 0  # the run did delete what it folded
    assert {v.counter[0]: v.value for v in values} == dict.fromkeys(counters, 20)
    assert {v.compact_value for v in values} == {20}  # read against the run's copies


def _family_of_kind(conn, engine_keyspace, make_family, kind):
    """A family of ``kind`` and a writer that adds ``n`` to each of some counters, at a time:
    increments and unique members through the write API, business rows by plain CQL."""
    if kind == "increments":
        family, store, client = make_family()
        return family, store, lambda cs, at, n: client.record(_events(cs, at, n))
    if kind == "unique":
        family, store, client = make_family(
            kind="unique",
            raw_table=f"members_{secrets.token_hex(3)}",
            columns={"key": "meeting", "member": "user"},
        )

        def add_members(cs, at, n):
            tag = secrets.token_hex(3)
            client.add_members([(c, f"{tag}-{i}") for c in cs for i in range(n)], at=aware(at))

        return family, store, add_members
    table = f"orders_{secrets.token_hex(3)}"
    conn.session.execute(
        f"CREATE TABLE {engine_keyspace}.{table} (location text, at timeuuid, order_id int, "
        "PRIMARY KEY ((location), at, order_id))"
    )
    family, store, _client = make_family(
        kind="rows", raw_table=table, columns={"key": "location", "time": "at"}
    )
    insert = conn.session.prepare(
        f"INSERT INTO {engine_keyspace}.{table} (location, at, order_id) VALUES (?, ?, ?)"
    )

    def add_rows(cs, at, n):
        for c in cs:
            for i in range(n):
                conn.session.execute(insert, (c, uuid_from_time(at), i))

    return family, store, add_rows


@pytest.mark.parametrize(
    ("kind", "reader", "after"),
    [
        *(
            (kind, "cold", after)
            for kind in ("increments", "rows", "unique")
            for after in (1, 2, 3)
        ),
        ("unique", "warm", 1),
        ("unique", "warm", 2),
    ],
)
def test_a_run_between_any_two_of_a_readers_requests_is_not_seen(
    conn, engine_keyspace, make_family, t0, kind, reader, after
):
    """Every read a value depends on is settled by the copy's read after it, for every kind:
    a whole run (commit, copy, marks, deletes) forced after the reader's ``after``-th request
    leaves every value exact. A unique reader read the counted marks after its settle check,
    and a run that committed and cleaned up in between made it add the old copy to zero new
    members (5 where 8 is right: the reviewer's case is ``unique``, cold 3 and warm 2)."""
    family, store, write = _family_of_kind(conn, engine_keyspace, make_family, kind)
    counters = [f"c{i}" for i in range(12)]
    write(counters, t0 + timedelta(seconds=10), 5)
    engine.run_family(store, t0 + timedelta(minutes=1), now=t0 + timedelta(minutes=6))
    write(counters, t0 + timedelta(minutes=1, seconds=10), 3)
    epoch = t0 + timedelta(minutes=2)
    reading = CounterClient(conn, family, Store(conn, family, store.layout))
    if reader == "warm":
        assert {v.value for v in reading.read_many(counters)} == {8}
    sent: list[int] = []
    ran: list[str] = []
    run = reading.store.statements.run

    def run_after_the_nth_request(*args, **kwargs):
        result = run(*args, **kwargs)
        if result:  # a request sent (a warm reader sends no read of the copies first)
            sent.append(len(result))
        if result and len(sent) == after:
            ran.append(engine.run_family(store, epoch, now=epoch + timedelta(minutes=5)).outcome)
        return result

    reading.store.statements.run = run_after_the_nth_request
    values = reading.read_many(counters)
    assert ran == ["success"]
    assert {v.counter[0]: v.value for v in values} == dict.fromkeys(counters, 8)
    assert {v.value for v in reading.read_many(counters)} == {8}  # and after the run


def test_a_late_row_is_read_from_the_next_run_and_the_horizon_says_so(make_family, t0):
    """The README's example delivered late: an increment whose own time is behind the
    counter's compacted epoch (a delay longer than ``lag``) is written once however often it
    is retried, is not in ``read()`` until the next run folds it (the documented bound), and
    ``late_horizon`` tells the caller so; the next run counts it exactly once."""
    _family, store, client = make_family()
    client.increment("IBM", 100, at=aware(t0 + timedelta(seconds=30)), identity=("P0", 1))
    assert client.late_horizon("IBM") is None  # never committed: every row is read
    epoch = t0 + timedelta(minutes=2)
    engine.run_family(store, epoch, now=epoch + timedelta(minutes=5))
    fill_time = t0 + timedelta(minutes=1, seconds=1)  # delivered after the run of minute 2
    assert client.late_horizon("IBM") == epoch >= fill_time
    client.increment("IBM", 500, at=aware(fill_time), identity=("P1", 2))
    client.increment("IBM", 500, at=aware(fill_time), identity=("P1", 2))  # a retry: the same row
    [value] = client.read_many(["IBM"])
    assert (value.value, value.epoch) == (100, epoch)  # behind by the late row, as documented
    summary = engine.run_family(
        store, epoch + timedelta(minutes=1), now=epoch + timedelta(minutes=6)
    )
    assert (summary.tally.late_rows, summary.tally.late_sum) == (1, 500)
    assert client.read("IBM") == 600
    assert client.late_horizon("IBM") == epoch + timedelta(minutes=1)


def test_readers_throughout_large_runs_read_every_value_exactly(conn, make_family, t0):
    """Readers loop over random counters while runs of many shards and buckets (in worker
    processes) fold, copy and delete; every value read is checked."""
    family, store, client = make_family(shards=4)
    counters = [f"q{i}" for i in range(12_000)]
    expected = dict.fromkeys(counters, 0)
    for minute in range(3):
        at = t0 + timedelta(minutes=minute, seconds=5)
        client.record(_events(counters, at, minute + 1))
        for c in counters:
            expected[c] += minute + 1
    reader = CounterClient(conn, family, Store(conn, family, store.layout))
    stop = threading.Event()
    reads: list[tuple[float, int]] = []  # (when, wrong values in that read)
    errors: list[BaseException] = []

    def read_loop() -> None:
        rng = random.Random(7)
        try:
            while not stop.is_set():
                sample = rng.sample(counters, 500)
                values = reader.read_many(sample)
                wrong = sum(1 for v in values if v.value != expected[v.counter[0]])
                reads.append((time.monotonic(), wrong))
        except BaseException as exc:
            errors.append(exc)

    phases: list[tuple[float, str]] = []
    thread = threading.Thread(target=read_loop, daemon=True)
    thread.start()
    try:
        for minute in (1, 2, 3):
            epoch = t0 + timedelta(minutes=minute)
            summary = engine.run_family(
                store,
                epoch,
                now=epoch + timedelta(minutes=5),
                workers=2,
                progress=lambda m: phases.append((time.monotonic(), m)),
            )
            assert summary.outcome == "success"
            phases.append((time.monotonic(), "done"))
    finally:
        stop.set()
        thread.join(timeout=60)
    assert not thread.is_alive() and not errors, errors
    cleanups = [t for t, m in phases if m == "cleaning up"]
    ends = [t for t, m in phases if m == "done"]
    during = [w for t, w in reads if any(a <= t <= b for a, b in zip(cleanups, ends, strict=True))]
    assert during, "no read finished while a run was cleaning up"
    assert sum(w for _t, w in reads) == 0, f"{sum(w for _t, w in reads)} wrong values"
    assert rows_at_or_below(store, ("q0",), t0 + timedelta(minutes=3)) == 0


# --- 4. the family's identity ------------------------------------------------------------


def _crash_after_first_copies(store, epoch, **kw):
    """A first run that commits and copies some counters, then dies before its cleanup."""
    hits: list[str] = []

    def crash(point: str) -> None:
        if point == "verify" and not hits:
            hits.append(point)
            raise Crash(point)

    with pytest.raises(Crash):
        engine.run_family(store, epoch, now=epoch + timedelta(minutes=5), fault=crash, **kw)


def _values(client, counters):
    return {v.counter[0]: v.value for v in client.read_many(counters)}


def test_a_shard_count_changed_after_a_crashed_first_run_is_refused_everywhere(make_family, t0):
    """The issue's case: the first run dies mid-way (nothing recorded a finished run), then
    the YAML says 8 shards. The first commit recorded the family's identity: every step of a
    run at 8 shards is refused, naming the field, and nothing is counted twice."""
    family, store, client = make_family(shards=2)
    counters = [f"k{i}" for i in range(80)]
    client.record(_events(counters, t0 + timedelta(seconds=10)))
    epoch = t0 + timedelta(minutes=1)
    _crash_after_first_copies(store, epoch, commit_chunk=5)
    assert _values(client, counters) == dict.fromkeys(counters, 15)
    eight = Store(store.conn, family.model_copy(update={"shards": 8}), store.layout)
    later = epoch + timedelta(minutes=1)
    with pytest.raises(engine.IdentityMismatch, match=r"field 'shards' is 8 in the YAML but 2 "):
        engine.run_family(eight, later, now=later + timedelta(minutes=5))
    with pytest.raises(engine.IdentityMismatch, match="counterctl reshard"):  # a worker's YAML
        engine.compact_shard(eight, 0, later, "worker-with-8")
    assert _values(client, counters) == dict.fromkeys(counters, 15)
    positions = [(s, b, store.keys.token(c)) for s, b, c in store.ledger.ledger_positions(1000)]
    assert positions and written_shards(positions) == 2  # nothing committed at 8 shards
    engine.run_family(store, later, now=later + timedelta(minutes=5))
    assert _values(client, counters) == dict.fromkeys(counters, 15)
    assert sum(rows_at_or_below(store, (c,), later) for c in counters) == 0


def test_a_family_committed_before_identities_has_its_shards_checked_against_its_ledger(
    make_family, t0
):
    """A family whose first commits came from a version that recorded no identity (and no
    finished run): the ledger's own positions tell the shard count it was written with."""
    family, store, client = make_family(shards=2)
    counters = [f"u{i}" for i in range(40)]
    client.record(_events(counters, t0 + timedelta(seconds=10)))
    epoch = t0 + timedelta(minutes=1)
    _crash_after_first_copies(store, epoch, commit_chunk=5)
    forget_table_owners(store)  # as an older version left it
    four = Store(store.conn, family.model_copy(update={"shards": 4}), store.layout)
    later = epoch + timedelta(minutes=1)
    with pytest.raises(engine.IdentityMismatch, match=r"ledger was written with 2 shards"):
        engine.run_family(four, later, now=later + timedelta(minutes=5))
    assert _values(client, counters) == dict.fromkeys(counters, 15)
    assert store.owners.table_owners() == {}  # a refused run records nothing
    engine.run_family(store, later, now=later + timedelta(minutes=5))
    assert set(store.owners.table_owners()) == set(family.tables)
    assert _values(client, counters) == dict.fromkeys(counters, 15)


def test_a_second_family_on_the_same_tables_is_refused(make_family, t0):
    family, store, client = make_family()
    client.record(_events(["a"], t0 + timedelta(seconds=1)))
    epoch = t0 + timedelta(minutes=1)
    engine.run_family(store, epoch, now=epoch + timedelta(minutes=5))
    twin = Store(store.conn, family.model_copy(update={"name": "twin"}), store.layout)
    client.record(_events(["a"], epoch + timedelta(seconds=1), 2))
    later = epoch + timedelta(minutes=1)
    with pytest.raises(engine.IdentityMismatch, match=r"belongs to family 'f_"):
        engine.run_family(twin, later, now=later + timedelta(minutes=5))
    assert _values(client, ["a"]) == {"a": 17}


def test_a_copy_naming_a_commit_the_ledger_lacks_is_quarantined_not_adopted(make_family, t0):
    """A truncated ledger (or a changed bucket count, another family's write): the copies name
    commits the ledger does not hold. Adopted as bases, the counted rows still present (the
    run died before its cleanup) would be counted again; they are quarantined instead."""
    family, store, client = make_family(shards=1)
    counters = [f"t{i}" for i in range(30)]
    client.record(_events(counters, t0 + timedelta(seconds=10)))
    epoch = t0 + timedelta(minutes=1)
    _crash_after_first_copies(store, epoch)
    store.statements.session.execute(f"TRUNCATE {family.keyspace}.{family.compact_table}_ledger")
    later = epoch + timedelta(minutes=1)
    with pytest.raises(engine.ChecksFailed, match="quarantined"):
        engine.run_family(store, later, now=later + timedelta(minutes=5))
    assert _values(client, counters) == dict.fromkeys(counters, 15)
    held = engine.quarantined(store)
    assert held and {q.reason for q in held} == {"unknown_commit"}
    for q in held:  # the ones the crashed run copied: nothing of theirs deleted
        assert rows_at_or_below(store, q.counter, later) == 1


# --- 8. cleanup deletes what its execution verified -----------------------------------


def test_a_cleanup_deletes_only_what_its_own_execution_verified(conn, make_family, t0):
    """Two executions under one run id (a zombie and its retry, a reused --run-id): A sweeps,
    commits a counter only it found (written by plain CQL, no mark) and stalls before copying
    it; B runs the whole run meanwhile. B's cleanup must not delete the rows of A's commit,
    whose copy nobody wrote or read back: readers would lose them."""
    family, store, client = make_family(shards=1, sweep_interval="1d")
    epoch1 = t0 + timedelta(minutes=1)
    client.record(_events(["seen"], t0 + timedelta(seconds=5)))
    engine.run_family(store, epoch1, now=epoch1 + timedelta(minutes=5))  # sweeps, once a day
    f = family
    for second in (10, 20):  # a foreign writer's rows: found by a sweep only
        store.statements.session.execute(
            f"INSERT INTO {f.keyspace}.{f.raw_table} (type, modify_time, actor, version, "
            "increment) VALUES ('foreign', %s, 'x', 1, 7)",
            (epoch1 + timedelta(seconds=second),),
        )
    client.record(_events(["seen"], epoch1 + timedelta(seconds=5)))  # marked: B's work
    epoch2 = epoch1 + timedelta(minutes=1)
    stalled, resume, outcome = threading.Event(), threading.Event(), []
    a_store = Store(conn, family, store.layout)
    copy = a_store.ledger.copy_compact

    def stalling_copy(commits, *args, **kwargs):
        if any(counter == ("foreign",) for counter, _cp in commits):
            stalled.set()  # its commit applied; its copy not written
            assert resume.wait(60)
        return copy(commits, *args, **kwargs)

    a_store.ledger.copy_compact = stalling_copy

    def execution_a() -> None:
        outcome.append(
            engine.compact_shard(a_store, 0, epoch2, "X", sweep=True, use_lease=False).tally
        )

    thread = threading.Thread(target=execution_a, daemon=True)
    thread.start()
    try:
        assert stalled.wait(60), "execution A never reached its copy"
        assert _values(client, ["foreign"]) == {"foreign": 14}  # A committed, copied nothing
        b = engine.run_family(
            Store(conn, family, store.layout),
            epoch2,
            run_id="X",
            use_lease=False,
            now=epoch2 + timedelta(minutes=5),
        )
        assert b.outcome == "success" and not b.plan.sweep
        assert _values(client, ["foreign", "seen"]) == {"foreign": 14, "seen": 30}
        assert rows_at_or_below(store, ("foreign",), epoch2) == 2  # A's rows: not B's to delete
    finally:
        resume.set()
        thread.join(60)
    assert not thread.is_alive() and outcome and outcome[0].counters_committed >= 1
    assert _values(client, ["foreign", "seen"]) == {"foreign": 14, "seen": 30}
    later = epoch2 + timedelta(minutes=1)
    store.index.mark_touched([("foreign",)])  # A's counted rows are cleaned by the next run of them
    engine.run_family(store, later, now=later + timedelta(minutes=5))
    assert _values(client, ["foreign", "seen"]) == {"foreign": 14, "seen": 30}
    assert rows_at_or_below(store, ("foreign",), later) == 0


def _foreign_rows(store, at) -> None:
    """Two rows of counter 'foreign' by a writer outside the API (no mark): only a sweep
    finds them."""
    f = store.family
    for second in (10, 20):
        store.statements.session.execute(
            f"INSERT INTO {f.keyspace}.{f.raw_table} (type, modify_time, actor, version, "
            "increment) VALUES ('foreign', %s, 'x', 1, 7)",
            (at + timedelta(seconds=second),),
        )


def test_a_cleanup_leaves_the_commits_of_an_execution_whose_report_never_reached_verify(
    conn, make_family, t0
):
    """Safeguard 2 alone: A sweeps, commits, copies and verifies a counter only it found,
    marks the commit as its own, and stalls before its report exists (a zombie whose task was
    retried). B runs the whole run under the same run id; B's cleanup is given B's execution
    only, so A's verified commit is not B's to delete. Given A's execution, it is."""
    family, store, client = make_family(shards=1, sweep_interval="1d")
    epoch1 = t0 + timedelta(minutes=1)
    client.record(_events(["seen"], t0 + timedelta(seconds=5)))
    engine.run_family(store, epoch1, now=epoch1 + timedelta(minutes=5))  # sweeps, once a day
    _foreign_rows(store, epoch1)
    client.record(_events(["seen"], epoch1 + timedelta(seconds=5)))  # marked: B's work
    epoch2 = epoch1 + timedelta(minutes=1)
    foreign_bucket = store.keys.bucket(("foreign",))[1]
    stalled, resume, outcome = threading.Event(), threading.Event(), []
    a_store = Store(conn, family, store.layout)
    mark = a_store.runs.mark_verified
    marked: dict[int, int] = {}  # bucket worker thread -> the bucket whose commits it marked

    def watched_mark(run_id, shard, bucket, commit_ids, execution):
        mark(run_id, shard, bucket, commit_ids, execution)
        if commit_ids:
            marked[threading.get_ident()] = bucket

    def stall_after_verify(point: str) -> None:
        if point == "verify" and marked.get(threading.get_ident()) == foreign_bucket:
            stalled.set()  # verified and marked by A; A's report does not exist yet
            assert resume.wait(60)

    a_store.runs.mark_verified = watched_mark

    def execution_a() -> None:
        outcome.append(
            engine.compact_shard(
                a_store, 0, epoch2, "X", sweep=True, use_lease=False, fault=stall_after_verify
            )
        )

    thread = threading.Thread(target=execution_a, daemon=True)
    thread.start()
    try:
        assert stalled.wait(60), "execution A never marked its commit"
        assert compact_row(store, ("foreign",)).value == 14  # A's copy, read back by A
        b = engine.run_family(
            Store(conn, family, store.layout),
            epoch2,
            run_id="X",
            use_lease=False,
            now=epoch2 + timedelta(minutes=5),
        )
        assert b.outcome == "success" and not b.plan.sweep
        assert rows_at_or_below(store, ("seen",), epoch2) == 0  # B's own: deleted
        assert rows_at_or_below(store, ("foreign",), epoch2) == 2  # A's: not B's to delete
    finally:
        resume.set()
        thread.join(60)
    assert not thread.is_alive() and outcome, "execution A did not finish"
    assert _values(client, ["foreign", "seen"]) == {"foreign": 14, "seen": 30}
    a_cleanup = engine.cleanup_shard(store, 0, "X", [outcome[0].execution])
    assert a_cleanup.rows_deleted >= 2 and not a_cleanup.leftovers  # A's verified commit
    assert rows_at_or_below(store, ("foreign",), epoch2) == 0
    assert _values(client, ["foreign", "seen"]) == {"foreign": 14, "seen": 30}


def test_a_commit_its_execution_never_verified_is_not_cleaned_even_for_that_execution(
    conn, make_family, t0
):
    """Safeguard 1 alone: the mark is per verified commit, written after the verification,
    not when the commit applies. Execution A sweeps: one bucket's commit is verified and
    marked; the bucket of a counter only A found dies between its commit and its copy. Even a
    cleanup given A's execution deletes only the verified commit's rows (readers would read
    the other counter as 0), and the next run restores that copy as its ordinary work: the
    run log says it was never verified, so it is no removed copy (no quarantine, no alarm)."""
    family, store, client = make_family(shards=1)
    foreign_bucket = store.keys.bucket(("foreign",))[1]
    other = next(
        n for n in (f"o{i}" for i in range(100)) if store.keys.bucket((n,))[1] != foreign_bucket
    )
    client.record(_events([other], t0 + timedelta(seconds=5)))
    _foreign_rows(store, t0)
    epoch = t0 + timedelta(minutes=1)
    a_store = Store(conn, family, store.layout)
    executions: dict[int, str] = {}  # bucket -> the execution that marked its commits
    other_marked = threading.Event()
    mark, copy = a_store.runs.mark_verified, a_store.ledger.copy_compact

    def watched_mark(run_id, shard, bucket, commit_ids, execution):
        mark(run_id, shard, bucket, commit_ids, execution)
        if commit_ids:
            executions[bucket] = execution
            other_marked.set()

    def dying_copy(commits, *args, **kwargs):
        if any(counter == ("foreign",) for counter, _cp in commits):
            assert other_marked.wait(60), "the other bucket was never verified"
            raise Crash("copy")  # the commit applied; its copy never written
        return copy(commits, *args, **kwargs)

    a_store.runs.mark_verified, a_store.ledger.copy_compact = watched_mark, dying_copy
    with pytest.raises(Crash):
        engine.compact_shard(a_store, 0, epoch, "X", sweep=True, use_lease=False)
    assert store.keys.bucket((other,))[1] in executions and len(set(executions.values())) == 1
    assert compact_row(store, ("foreign",)) is None  # committed, never copied
    assert _values(client, ["foreign", other]) == {"foreign": 14, other: 15}
    cleaned = engine.cleanup_shard(store, 0, "X", list(executions.values()))
    assert cleaned.rows_deleted == 1 and not cleaned.leftovers
    assert rows_at_or_below(store, (other,), epoch) == 0  # A's verified commit: cleaned
    assert rows_at_or_below(store, ("foreign",), epoch) == 2  # its unverified one: kept
    assert _values(client, ["foreign", other]) == {"foreign": 14, other: 15}
    later = epoch + timedelta(minutes=1)
    store.index.mark_touched([("foreign",)])
    assert engine.run_family(store, later, now=later + timedelta(minutes=5)).outcome == "success"
    assert not engine.quarantined(store)
    assert compact_row(store, ("foreign",)).value == 14
    assert rows_at_or_below(store, ("foreign",), later) == 0
    assert _values(client, ["foreign", other]) == {"foreign": 14, other: 15}


# --- 5. a copy removed by hand -------------------------------------------------------------


@pytest.mark.parametrize("how", ["deleted", "expired"])
@pytest.mark.parametrize("found_by", ["mark", "sweep"])
def test_a_removed_copy_is_restored_at_once_quarantined_and_alerted(make_family, t0, how, found_by):
    """A compact row deleted by hand (or written with a TTL that ran out): readers read the
    counter as 0. The next run that reads the counter restores the copy from the ledger with a
    commit whose version wins over the tombstone, and quarantines and alerts."""
    family, store, client = make_family(
        shards=1, sweep_interval="1d" if found_by == "mark" else "1m"
    )
    client.record(_events(["v", "w"], t0 + timedelta(seconds=5)))
    epoch = t0 + timedelta(minutes=1)
    engine.run_family(store, epoch, now=epoch + timedelta(minutes=5))
    f = family
    if how == "deleted":
        table = f"{f.keyspace}.{f.compact_table}"
        stamp = after_copy(store.statements.session, table, "v")
        store.statements.session.execute(
            f"DELETE FROM {table} USING TIMESTAMP {stamp} WHERE type = 'v'"
        )
    else:
        row = compact_row(store, ("v",))
        stamp = after_copy(store.statements.session, f"{f.keyspace}.{f.compact_table}", "v")
        store.statements.session.execute(
            f"UPDATE {f.keyspace}.{f.compact_table} USING TTL 1 AND TIMESTAMP {stamp} "
            "SET value = %s, epoch = %s, "
            "commit_id = %s, run_id = %s WHERE type = 'v'",
            (row.value, row.epoch, row.commit_id, row.run_id),
        )
        time.sleep(2.5)
    assert _values(client, ["v"]) == {"v": 0}  # what readers get until a run restores it
    if found_by == "mark":
        store.index.mark_touched([("v",)])
    later = epoch + timedelta(minutes=1)
    with pytest.raises(engine.ChecksFailed, match="quarantined") as failed:
        engine.run_family(store, later, now=later + timedelta(minutes=5))
    assert "its compact row was gone" in str(failed.value) or any(
        "its compact row was gone" in "; ".join(o.counters) for o in failed.value.outcomes
    )
    assert _values(client, ["v", "w"]) == {"v": 15, "w": 15}
    assert [(q.counter, q.reason) for q in engine.quarantined(store)] == [(("v",), "copy_missing")]
    engine.release(store, ("v",))
    last = later + timedelta(minutes=1)
    assert engine.run_family(store, last, now=last + timedelta(minutes=5)).outcome in (
        "success",
        "idle",
    )
    assert _values(client, ["v", "w"]) == {"v": 15, "w": 15}


def test_a_copy_a_crash_never_wrote_is_restored_without_an_alarm(make_family, t0):
    """The first commit of a counter applied, the run died before its copy: the next run
    writes the copy as its ordinary work, quarantining nothing."""
    _family, store, client = make_family(shards=1)
    # no sweep due: only the counter's bucket is worked (a crash in another one would come first)
    store.state.advance_family_epoch(
        t0 - timedelta(days=1), "setup", swept_at=t0 + timedelta(days=2)
    )
    client.record(_events(["n"], t0 + timedelta(seconds=5)))
    epoch = t0 + timedelta(minutes=1)
    hits: list[str] = []

    def crash(point: str) -> None:
        if point == "commit" and not hits:
            hits.append(point)
            raise Crash(point)

    with pytest.raises(Crash):
        engine.run_family(store, epoch, now=epoch + timedelta(minutes=5), fault=crash)
    assert compact_row(store, ("n",)) is None and _values(client, ["n"]) == {"n": 15}
    store.index.mark_touched([("n",)])
    later = epoch + timedelta(minutes=1)
    assert engine.run_family(store, later, now=later + timedelta(minutes=5)).outcome == "success"
    assert compact_row(store, ("n",)).value == 15 and not engine.quarantined(store)
    assert _values(client, ["n"]) == {"n": 15}


def test_a_copy_its_own_run_writes_between_a_rivals_reads_is_no_removal(conn, make_family, t0):
    """Run A commits a counter's first checkpoint and stalls before its copy; run B reads the
    ledger (A's commit) and the copies (none yet); A then copies, verifies and marks its commit
    verified; B finds the copy missing and the commit verified. The copy was never removed (it
    is there now): B restores it as ordinary work, quarantining nothing. Before B read the copy
    again, this was a false ``copy_missing`` quarantine (a busy node widens the window)."""
    family, store, client = make_family(shards=1)
    store.state.advance_family_epoch(
        t0 - timedelta(days=1), "setup", swept_at=t0 + timedelta(days=2)
    )
    client.record(_events(["n"], t0 + timedelta(seconds=5)))
    epoch = t0 + timedelta(minutes=1)
    a_store = Store(conn, family, store.layout)

    def run_a(fault):
        return engine.run_family(
            a_store, epoch, "A", now=epoch + timedelta(minutes=5), use_lease=False, fault=fault
        )

    with StalledRun("commit", run_a, bound_s=120) as a:
        assert a.start()
        copies_read: list[str] = []

        def release_a_after_the_reads(point: str) -> None:
            if point == "read_compact" and not copies_read:  # B read the ledger and copies
                copies_read.append(point)
                a.release()  # A copies, verifies, marks verified, cleans up, ends

        later = epoch + timedelta(minutes=1)
        b = engine.run_family(
            store,
            later,
            "B",
            now=later + timedelta(minutes=5),
            use_lease=False,
            fault=release_a_after_the_reads,
        )
    assert a.overlapped and a.error is None and a.summary.outcome == "success", a.outcome()
    assert copies_read and b.outcome == "success", b.message
    assert not engine.quarantined(store)
    assert compact_row(store, ("n",)).value == 15 and _values(client, ["n"]) == {"n": 15}


def test_a_commit_superseded_and_cleaned_by_a_rival_during_its_verify_is_no_failure(
    conn, make_family, t0
):
    """Run A commits; a late row makes its recount find more rows, so it looks row by row; in
    between, run B commits on top of A's commit (counting A's rows as present) and deletes
    them. A's commit was right and is superseded: nothing to quarantine."""
    family, store, client = make_family(shards=1)
    store.state.advance_family_epoch(
        t0 - timedelta(days=1), "setup", swept_at=t0 + timedelta(days=2)
    )
    names = [f"s{i}" for i in range(4)]
    client.record(
        [
            Increment((c,), i + 1, utc_aware(t0 + timedelta(seconds=10 * i)), ("w", i))
            for c in names
            for i in range(4)
        ]
    )
    epoch = t0 + timedelta(minutes=1)
    a_store = Store(conn, family, store.layout)
    stalled, resume, ended = threading.Event(), threading.Event(), []
    read_rows = a_store.raw.read_rows

    def stalling_read_rows(*args, **kwargs):
        if a_store.statements.current_phase == "verify" and not stalled.is_set():
            stalled.set()
            assert resume.wait(60)
        return read_rows(*args, **kwargs)

    a_store.raw.read_rows = stalling_read_rows

    def late_rows(point: str) -> None:
        if point == "commit":
            client.record(_events(names, t0 + timedelta(seconds=45), 100))

    def run_a() -> None:
        try:
            ended.append(
                engine.run_family(
                    a_store,
                    epoch,
                    now=epoch + timedelta(minutes=5),
                    fault=late_rows,
                    use_lease=False,
                )
            )
        except BaseException as exc:
            ended.append(exc)

    thread = threading.Thread(target=run_a, daemon=True)
    thread.start()
    try:
        assert stalled.wait(60), "run A never looked at its rows one by one"
        later = epoch + timedelta(minutes=1)
        b = engine.run_family(store, later, now=later + timedelta(minutes=5), use_lease=False)
        assert b.outcome == "success" and b.tally.counted_present >= 16
    finally:
        resume.set()
        thread.join(60)
    assert not thread.is_alive() and len(ended) == 1
    assert not isinstance(ended[0], BaseException), ended[0]
    assert not engine.quarantined(store)
    assert _values(client, names) == dict.fromkeys(names, 110)


# --- 6. options of adopted tables ------------------------------------------------------


def test_a_raw_table_with_a_short_gc_grace_is_refused_by_init(conn, engine_keyspace, make_family):
    table = f"raw_grace_{secrets.token_hex(3)}"
    conn.session.execute(
        f"CREATE TABLE {engine_keyspace}.{table} (type text, modify_time timestamp, actor text, "
        "version bigint, increment bigint, PRIMARY KEY ((type), modify_time, actor, version)) "
        "WITH gc_grace_seconds = 600"
    )
    with pytest.raises(SchemaError) as refused:
        make_family(raw_table=table)
    assert f"table {engine_keyspace}.{table} has gc_grace_seconds = 600, under 10800" in str(
        refused.value
    )
    assert f"ALTER TABLE {engine_keyspace}.{table} WITH gc_grace_seconds = 10800" in str(
        refused.value
    )


@pytest.fixture
def unaware_conn() -> Iterator[Connection]:
    """A connection whose driver ignores schema events: what another client changes in the
    schema, it learns only by asking (the compactor's process, an operator's ALTER elsewhere)."""
    import counters.connection

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            counters.connection,
            "Cluster",
            functools.partial(counters.connection.Cluster, schema_event_refresh_window=-1),
        )
        connection = Connection(ConnectionSettings.from_env())
    yield connection
    connection.close()


@pytest.mark.parametrize("table", ["raw", "compact"])
def test_a_table_given_a_ttl_after_init_refuses_every_run(conn, make_family, t0, table, request):
    """The ALTER comes from another client, and the compactor's driver ignores schema events:
    the run must read the options from the node itself, not from the driver's copy."""
    family, store, client = make_family(fresh=True)  # its table gets a TTL
    client.record(_events(["a"], t0 + timedelta(seconds=1)))
    epoch = t0 + timedelta(minutes=1)
    engine.run_family(store, epoch, now=epoch + timedelta(minutes=5))
    compactor = Store(request.getfixturevalue("unaware_conn"), family, store.layout)
    name = family.raw_table if table == "raw" else family.compact_table
    conn.session.execute(f"ALTER TABLE {family.keyspace}.{name} WITH default_time_to_live = 86400")
    client.record(_events(["a"], epoch + timedelta(seconds=1), 2))
    later = epoch + timedelta(minutes=1)
    with pytest.raises(SchemaError, match=rf"{name} has default_time_to_live = 86400"):
        engine.run_family(compactor, later, now=later + timedelta(minutes=5))
    assert rows_at_or_below(store, ("a",), later) == 1  # nothing folded or deleted
    assert _values(client, ["a"]) == {"a": 17}


# --- 9. settings that cannot hold their promise ------------------------------------------


def test_a_pending_sum_past_a_bigint_quarantines_its_counter_not_the_family(make_family, t0):
    """A value that fits, with a sum of rows that does not: the ledger keeps the sum of the
    counted rows and of what a fold added, 64-bit both. The counter is quarantined; the rest
    of the family is compacted."""
    _family, store, client = make_family(shards=1)
    half = 2**62
    client.record([Increment(("big",), -half, utc_aware(t0 + timedelta(seconds=1)), ("w", 1))])
    client.record(_events(["other"], t0 + timedelta(seconds=1)))
    epoch = t0 + timedelta(minutes=1)
    engine.run_family(store, epoch, now=epoch + timedelta(minutes=5))
    client.record(
        [
            Increment(("big",), half, utc_aware(epoch + timedelta(seconds=s)), ("w", s))
            for s in (1, 2)
        ]
        + _events(["other"], epoch + timedelta(seconds=1), 5)
    )
    later = epoch + timedelta(minutes=1)
    with pytest.raises(engine.ChecksFailed, match="would overflow a bigint"):
        engine.run_family(store, later, now=later + timedelta(minutes=5))
    assert [(q.counter, q.reason) for q in engine.quarantined(store)] == [(("big",), "overflow")]
    assert _values(client, ["big", "other"]) == {"big": half, "other": 20}
    assert rows_at_or_below(store, ("big",), later) == 2  # nothing of it deleted


def test_rows_written_behind_a_rows_checkpoint_are_folded_by_the_next_sweep(
    conn, engine_keyspace, make_family, t0
):
    """A rows family's value counts the business rows up to its checkpoint; a row written
    behind it (a writer's clock behind by more than the lag) is folded by the next sweep,
    every run by default for a rows family (discovery: scan), with no reconcile."""
    table = f"orders_{secrets.token_hex(3)}"
    conn.session.execute(
        f"CREATE TABLE {engine_keyspace}.{table} (loc int, at timestamp, id int, "
        "PRIMARY KEY ((loc), at, id))"
    )
    _family, store, client = make_family(
        kind="rows", raw_table=table, columns={"key": "loc", "time": "at"}
    )
    insert = conn.session.prepare(
        f"INSERT INTO {engine_keyspace}.{table} (loc, at, id) VALUES (?, ?, ?)"
    )
    for i in range(3):
        conn.session.execute(insert, (1, t0 + timedelta(seconds=i), i))
    epoch = t0 + timedelta(minutes=1)
    engine.run_family(store, epoch, now=epoch + timedelta(minutes=5))
    conn.session.execute(insert, (1, t0 + timedelta(seconds=30), 99))  # behind the checkpoint
    conn.session.execute(insert, (1, epoch + timedelta(seconds=5), 100))
    later = epoch + timedelta(minutes=1)
    summary = engine.run_family(store, later, now=later + timedelta(minutes=5))
    assert summary.plan.sweep and summary.tally.late_rows == 1
    assert client.read_many([(1,)])[0].value == 5
    assert engine.reconcile(store) == []


@pytest.mark.parametrize("below", [10_000, 0])
def test_a_family_whose_sweeps_are_small_sweeps_every_run(conn, make_family, t0, below):
    """Rows of a writer outside the write API (plain CQL, no mark) below a counter's epoch are
    folded by the next run when the family's last sweep was small (``sweep_every_run_below``),
    by the next interval's sweep otherwise."""
    family, store, client = make_family(shards=1, sweep_interval="1d", sweep_every_run_below=below)
    insert = (
        f"INSERT INTO {family.keyspace}.{family.raw_table} (type, modify_time, actor, version, "
        "increment) VALUES ('p', %s, 'cql', %s, %s)"
    )
    store.statements.session.execute(
        insert, (t0 + timedelta(seconds=5), 1, 15)
    )  # no mark: a sweep's
    epoch = t0 + timedelta(minutes=1)
    assert engine.run_family(store, epoch, now=epoch + timedelta(minutes=5)).plan.sweep
    assert store.state.family_state().last_sweep_size == 2  # one row, one counter
    store.statements.session.execute(insert, (t0 + timedelta(seconds=30), 2, 4))  # below p's epoch
    later = epoch + timedelta(minutes=1)
    summary = engine.run_family(store, later, now=later + timedelta(minutes=5))
    assert summary.plan.sweep == bool(below)
    assert _values(client, ["p"]) == {"p": 19 if below else 15}


def test_a_stores_kept_buckets_are_bounded_and_agree_with_the_token(
    make_family, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store keeps each counter's (shard, bucket) (a run asks it of a counter more than
    once); a warm pool's store lives for days, so what it keeps is bounded, and a bucket
    asked again after the store started over is the same."""
    from counters.core import bucket_of
    from counters.store import keys

    family, store, _client = make_family(shards=4)
    monkeypatch.setattr(keys, "BUCKETS_KEPT", 3)
    counters = [(f"k{i}",) for i in range(10)]
    first = [store.keys.bucket(c) for c in counters]
    assert len(store.keys._buckets) <= 3
    assert first == [bucket_of(store.keys.token(c), family.shards) for c in counters]
    assert [store.keys.bucket(c) for c in reversed(counters)] == first[::-1]
