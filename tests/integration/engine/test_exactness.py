"""Exact at every moment and for every caller (issue #37), each against the real node."""

from __future__ import annotations

import random
import threading
import time
from datetime import timedelta

import pytest
from counters import engine
from counters.client import CounterClient, Increment
from counters.identity import written_shards
from counters.store import Store

from .conftest import Crash
from .helpers import forget_table_owners, rows_at_or_below

pytestmark = pytest.mark.integration


def test_a_retried_increment_with_its_identity_and_time_is_one_row(make_family, t0):
    _family, _store, client = make_family()
    at = t0 + timedelta(seconds=3)
    client.increment("r", 500, at=at, identity=("P1", 2))
    client.increment("r", 500, at=at, identity=("P1", 2))  # the caller retries the call
    assert client.read("r") == 500


def test_an_identity_without_the_events_time_is_refused_and_writes_nothing(make_family):
    _family, _store, client = make_family()
    with pytest.raises(ValueError, match=r"identity \('P1', 2\) needs its event's time"):
        client.increment("r", 500, identity=("P1", 2))
    with pytest.raises(ValueError, match=r"needs its event's time too \(at=\.\.\.\)"):
        client.increment("r", 500, actor="P1", version=2)
    assert client.read("r") == 0


def test_actor_without_version_is_refused_so_two_events_never_merge(make_family, t0):
    _family, _store, client = make_family()
    at = t0 + timedelta(seconds=1)
    with pytest.raises(ValueError, match="pass actor= and version= together"):
        client.increment("r", 5, at=at, actor="alice")
    with pytest.raises(ValueError, match="pass actor= and version= together"):
        client.increment("r", 5, at=at, version=3)
    client.increment("r", 5, at=at, actor="alice", version=1)
    client.increment("r", 7, at=at, actor="alice", version=2)
    assert client.read("r") == 12


def _events(counters, at, amount=15):
    return [Increment((c,), amount, at, ("w", 1)) for c in counters]


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

    reading.store._concurrent = after_first_request(reading.store._concurrent)
    reading.store._run = after_first_request(reading.store._run)
    values = reading.read_many(counters)
    assert ran == ["success"]
    assert rows_at_or_below(store, ("c0",), epoch) == 0  # the run did delete what it folded
    assert {v.counter[0]: v.value for v in values} == dict.fromkeys(counters, 20)
    assert {v.compact_value for v in values} == {20}  # read against the run's copies


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
    positions = [(s, b, store.token(c)) for s, b, c in store.ledger_positions(1000)]
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
    assert store.table_owners() == {}  # a refused run records nothing
    engine.run_family(store, later, now=later + timedelta(minutes=5))
    assert set(store.table_owners()) == set(family.tables)
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
    store.session.execute(f"TRUNCATE {family.keyspace}.{family.compact_table}_ledger")
    later = epoch + timedelta(minutes=1)
    with pytest.raises(engine.ChecksFailed, match="quarantined"):
        engine.run_family(store, later, now=later + timedelta(minutes=5))
    assert _values(client, counters) == dict.fromkeys(counters, 15)
    held = engine.quarantined(store)
    assert held and {q.reason for q in held} == {"unknown_commit"}
    for q in held:  # the ones the crashed run copied: nothing of theirs deleted
        assert rows_at_or_below(store, q.counter, later) == 1
