"""counterctl reshard: another shard count, every checkpoint moved exactly (issue #37, item 4)."""

from __future__ import annotations

import secrets
import threading
from datetime import date, timedelta

import pytest
from cassandra.util import uuid_from_time
from counters import engine
from counters.client import Increment
from counters.core import utc_aware
from counters.reshard import reshard
from counters.store import Store

from .conftest import Crash
from .helpers import rows_at_or_below

pytestmark = pytest.mark.integration


def _events(counters, at, amount):
    return [Increment((c,), amount, utc_aware(at), ("w", amount)) for c in counters]


def _values(client, counters):
    return {v.counter[0]: v.value for v in client.read_many(counters)}


def _crashed_first_run(store, client, counters, t0):
    """Rows of two minutes; a first run that commits some counters and dies before its cleanup
    (counted rows still present: their keys are in the run log at their old place)."""
    client.record(_events(counters, t0 + timedelta(seconds=10), 5))
    client.record(_events(counters, t0 + timedelta(minutes=1, seconds=10), 7))
    epoch = t0 + timedelta(minutes=1)
    hits: list[str] = []

    def crash(point: str) -> None:
        if point == "verify" and len(hits) < 3:
            hits.append(point)
            if len(hits) == 3:
                raise Crash(point)

    with pytest.raises(Crash):
        engine.run_family(store, epoch, now=epoch + timedelta(minutes=5), fault=crash)


@pytest.mark.parametrize(("before", "after"), [(2, 8), (4, 1)])
def test_a_reshard_moves_every_checkpoint_and_the_next_runs_stay_exact(
    make_family, t0, before, after
):
    family, store, client = make_family(shards=before)
    counters = [f"r{i}" for i in range(120)]
    _crashed_first_run(store, client, counters, t0)
    store.quarantine.add("by-hand", [(("r7",), "bad_rows", "r7: held for the test")])
    expected = dict.fromkeys(counters, 12)
    assert _values(client, counters) == expected
    moved = reshard(store, after)
    assert moved.shards_before == before and moved.checkpoints_moved > 0
    assert moved.records_moved > 0  # counted rows still present: their keys moved too
    resharded = Store(store.conn, family.model_copy(update={"shards": after}), store.layout)
    with pytest.raises(engine.IdentityMismatch, match=rf"field 'shards' is {before} in the YAML"):
        engine.run_family(store, t0 + timedelta(minutes=2), now=t0 + timedelta(minutes=7))
    assert [q.counter for q in engine.quarantined(resharded)] == [("r7",)]
    later = t0 + timedelta(minutes=2)
    with pytest.raises(engine.ChecksFailed, match=r"1 counter.s. quarantined .* r7"):
        engine.run_family(resharded, later, now=later + timedelta(minutes=5))  # r7 held still
    assert _values(client, counters) == expected
    assert sum(rows_at_or_below(store, (c,), later) for c in counters if c != "r7") == 0
    engine.release(resharded, ("r7",))
    last = later + timedelta(minutes=1)
    engine.run_family(resharded, last, now=last + timedelta(minutes=5))
    assert _values(client, counters) == expected


def test_a_reshard_that_dies_is_finished_by_running_it_again_and_refuses_runs_meanwhile(
    make_family, t0
):
    _family, store, client = make_family(shards=2)
    counters = [f"d{i}" for i in range(80)]
    _crashed_first_run(store, client, counters, t0)
    dying = store.with_shards(2)
    move = dying.ledger.move_ledger_row
    done: list[int] = []

    def move_then_die(*args, **kwargs):
        if len(done) == 5:
            raise Crash("reshard")
        done.append(1)
        return move(*args, **kwargs)

    dying.ledger.move_ledger_row = move_then_die
    with pytest.raises(Crash):
        reshard(dying, 4)
    later = t0 + timedelta(minutes=2)
    for shards in (2, 4):
        with pytest.raises(engine.IdentityMismatch, match="reshard from 2 to 4 shards is under"):
            engine.run_family(store.with_shards(shards), later, now=later + timedelta(minutes=5))
    with pytest.raises(engine.IdentityMismatch, match="under way"):  # another count: no
        reshard(store, 8)
    assert _values(client, counters) == dict.fromkeys(counters, 12)
    finished = reshard(store, 4)
    assert finished.shards_before == 2
    four = store.with_shards(4)
    engine.run_family(four, later, now=later + timedelta(minutes=5))
    assert _values(client, counters) == dict.fromkeys(counters, 12)
    assert sum(rows_at_or_below(store, (c,), later) for c in counters) == 0


def test_a_run_planned_before_a_reshard_commits_nothing_after_it(conn, make_family, t0):
    """A run that read the ledger at the old count and stalled before its commits (every
    bucket of its one shard): the reshard fences every old partition first and opens the new
    ones with the new count, so no commit of it lands where no run will look; it is refused."""
    family, store, client = make_family(shards=1)
    counters = [f"s{i}" for i in range(40)]
    client.record(_events(counters, t0 + timedelta(seconds=10), 5))
    epoch = t0 + timedelta(minutes=1)
    engine.run_family(store, epoch, now=epoch + timedelta(minutes=5))
    client.record(_events(counters, epoch + timedelta(seconds=10), 7))
    stalled, resume, ended = threading.Event(), threading.Event(), []

    def stall(point: str) -> None:
        if point == "keys":  # every bucket's first commit waits
            stalled.set()
            assert resume.wait(60)

    later = epoch + timedelta(minutes=1)
    old = Store(conn, family, store.layout)

    def stale_run() -> None:
        try:
            ended.append(
                engine.run_family(old, later, now=later + timedelta(minutes=5), fault=stall)
            )
        except BaseException as exc:
            ended.append(exc)

    thread = threading.Thread(target=stale_run, daemon=True)
    thread.start()
    try:
        assert stalled.wait(60), "the stale run never reached its commit"
        reshard(store, 4)
    finally:
        resume.set()
        thread.join(60)
    assert not thread.is_alive() and len(ended) == 1
    assert isinstance(ended[0], engine.IdentityMismatch), ended[0]
    four = store.with_shards(4)
    engine.run_family(four, later, now=later + timedelta(minutes=5))
    assert _values(client, counters) == dict.fromkeys(counters, 12)
    assert sum(rows_at_or_below(store, (c,), later) for c in counters) == 0


def test_a_reshard_between_verify_and_cleanup_keeps_a_quarantined_counters_rows(make_family, t0):
    """Issue #43 item 8: the run's cleanup finds a counter's quarantine entry wherever a
    reshard moved it (its shard under the new count), not only under the run's numbering."""
    from counters.core import bucket_of

    _family, store, client = make_family(shards=2)
    counters = [f"q{i}" for i in range(40)]
    client.record(_events(counters, t0 + timedelta(seconds=10), 5))
    held = next(
        c for c in counters if bucket_of(store.keys.token((c,)), 8)[0] != store.keys.bucket((c,))[0]
    )
    epoch = t0 + timedelta(minutes=1)
    resharded: list[str] = []

    def reshard_before_cleanup(point: str) -> None:
        if point == "cleanup_read_log" and not resharded:
            store.quarantine.add(
                "verify", [((held,), "check_failed", f"{held}: held for the test")]
            )
            resharded.append(point)
            reshard(store, 8)

    engine.run_family(store, epoch, now=epoch + timedelta(minutes=5), fault=reshard_before_cleanup)
    assert resharded
    assert rows_at_or_below(store, (held,), epoch) == 1  # quarantined: none of its rows deleted
    others = [c for c in counters if c != held]
    assert sum(rows_at_or_below(store, (c,), epoch) for c in others) == 0


def test_a_copy_a_crash_never_wrote_is_restored_without_an_alarm_after_a_reshard(
    conn, make_family, engine_keyspace, t0
):
    """A rows family (its commits record no counted keys, so a reshard copies no record): a
    run commits and dies before its copies; a reshard moves checkpoints to other partitions,
    their commits' records (unverified) staying at the old place. The next run writes the
    missing copies as ordinary work. Before ``commit_verified`` told a young commit's record
    at another place from an expired one, every moved counter was quarantined as
    ``copy_missing`` (the model test's false quarantine of a rows counter)."""
    table = f"orders_{secrets.token_hex(3)}"
    conn.session.execute(
        f"CREATE TABLE {engine_keyspace}.{table} (location text, day date, at timeuuid, "
        "order_id int, PRIMARY KEY ((location, day), at, order_id))"
    )
    _family, store, client = make_family(
        kind="rows", raw_table=table, shards=1, columns={"key": ["location", "day"], "time": "at"}
    )
    day = date(2026, 3, 29)
    insert = conn.session.prepare(
        f"INSERT INTO {engine_keyspace}.{table} (location, day, at, order_id) VALUES (?, ?, ?, ?)"
    )
    counters = [(f"c{i}", day) for i in range(12)]
    for i, counter in enumerate(counters):
        conn.session.execute(insert, (*counter, uuid_from_time(t0 + timedelta(seconds=5)), i))
    epoch = t0 + timedelta(minutes=1)

    def crash(point: str) -> None:
        if point == "commit":
            raise Crash(point)

    with pytest.raises(Crash):
        engine.run_family(store, epoch, now=epoch + timedelta(minutes=5), fault=crash)
    assert {v.value for v in client.read_many(counters)} == {1}  # committed, not copied
    moved = reshard(store, 3)
    assert moved.checkpoints_moved > 0 and moved.records_moved == 0
    resharded = store.with_shards(3)
    later = epoch + timedelta(minutes=1)
    summary = engine.run_family(resharded, later, now=later + timedelta(minutes=5))
    assert summary.outcome == "success", summary.message
    assert not engine.quarantined(resharded)
    copies = {}
    for counter in counters:
        copies.update(resharded.ledger.read_copies(*resharded.keys.bucket(counter), [counter]))
    assert {c: copy.value for c, copy in copies.items()} == dict.fromkeys(counters, 1)
