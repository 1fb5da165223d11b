"""The commit's compare-and-set: what it must refuse whatever a run's reads returned.

A run reads a bucket's head and its counters' ledger rows in separate quorum requests. On a
cluster a read can meet a commit still landing on the replicas and see its head but not yet its
rows; a fold built on such a row and committed under that head would put the counter back one
commit. Each counter's row condition (``IF commit_id = <the commit its fold was built on>``)
refuses it. Removing that condition from ``Store.ledger.commit_bucket`` makes this test fail
(checked).
Likewise a run reads the ledger rows, then the compact copies: a rival's commit can land in
between; without the second look at the ledger (``_compact_bucket``) the second test fails.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from cassandra import ConsistencyLevel, OperationTimedOut, WriteTimeout
from cassandra.policies import WriteType
from counters import engine
from counters.client import Increment
from counters.core import EMPTY_CHECKPOINT, fold_counter, to_millis, utc_aware
from counters.store import Store

from .helpers import raw_rows, rows_at_or_below

pytestmark = pytest.mark.integration


def test_a_fold_on_a_stale_checkpoint_is_refused_under_the_current_head(make_family, t0):
    _family, store, client = make_family()
    counter = ("X",)
    client.record(
        [Increment(counter, n, utc_aware(t0 + timedelta(minutes=n)), ("w", n)) for n in (1, 2)]
    )
    shard, bucket = store.keys.bucket(counter)
    stale = store.ledger.read_ledger(shard, bucket, [counter])  # before any commit: no row
    assert counter not in stale.checkpoints

    first = engine.run_family(store, t0 + timedelta(minutes=5), now=t0 + timedelta(minutes=7))
    assert first.outcome == "success" and client.read("X") == 3
    client.record([Increment(counter, 4, utc_aware(t0 + timedelta(minutes=6)), ("w", 6))])

    # the head as a read that met the first run's commit saw it, the row as one that did not
    head = store.ledger.read_ledger(shard, bucket, [counter]).head
    rows = store.raw.read_rows([counter])[counter]  # the raw rows as they are: only the new one
    fold = fold_counter(counter, EMPTY_CHECKPOINT, rows, to_millis(t0 + timedelta(minutes=10)))
    assert fold.commit and fold.value == 4  # what the ledger would hold: 3 increments lost
    applied = store.ledger.commit_bucket(
        shard, bucket, head, [fold], store.ledger.new_commit_id(), "stale", to_millis(t0) * 1000
    )
    assert not applied
    assert store.ledger.read_ledger(shard, bucket, [counter]).checkpoints[counter].value == 3
    assert client.read("X") == 7

    # the same fold on the checkpoint as it is commits, and stays exact
    current = store.ledger.read_ledger(shard, bucket, [counter])
    base = current.checkpoints[counter]
    fold = fold_counter(counter, base, rows, to_millis(t0 + timedelta(minutes=10)))
    assert store.ledger.commit_bucket(
        shard,
        bucket,
        current.head,
        [fold],
        store.ledger.new_commit_id(),
        "fresh",
        to_millis(t0) * 1000,
    )
    assert store.ledger.read_ledger(shard, bucket, [counter]).checkpoints[counter].value == 7


def test_a_commit_between_the_ledger_read_and_the_copies_read_is_no_tampering(
    conn, make_family, t0
):
    """Run A reads a bucket's ledger rows; run B commits the same counters and writes their
    copies; A reads the copies: newer than the rows A read. That is B's commit, not a copy
    changed outside the engine (the 3-node overlap test quarantined such counters as
    ``tampered``): A reads the rows again, finds B's commit, loses its compare-and-set and folds
    again on B's checkpoints."""
    family, store, client = make_family(shards=1)
    counters = [(f"k{i}",) for i in range(20)]
    client.record(
        [Increment(c, 1, utc_aware(t0 + timedelta(minutes=1)), ("w", 1)) for c in counters]
    )
    first = engine.run_family(store, t0 + timedelta(minutes=2), now=t0 + timedelta(minutes=4))
    assert first.outcome == "success"
    client.record(
        [Increment(c, 2, utc_aware(t0 + timedelta(minutes=3)), ("w", 3)) for c in counters]
    )
    client.record(
        [Increment(c, 4, utc_aware(t0 + timedelta(minutes=5)), ("w", 5)) for c in counters]
    )

    racing = Store(conn, family, store.layout, concurrency=8)
    store_a = Store(conn, family, store.layout, concurrency=8)
    read_copies = store_a.ledger.read_copies
    raced: list[engine.RunOutcome] = []

    def copies_after_a_rival_commit(*args, **kwargs):
        if not raced:  # once, between A's ledger read and its copies read
            raced.append(
                engine.run_family(
                    racing, t0 + timedelta(minutes=4), "B", use_lease=False,
                    now=t0 + timedelta(minutes=6),
                )
            )  # fmt: skip
        return read_copies(*args, **kwargs)

    store_a.ledger.read_copies = copies_after_a_rival_commit
    a = engine.run_family(
        store_a, t0 + timedelta(minutes=6), "A", use_lease=False, now=t0 + timedelta(minutes=8)
    )
    assert raced and raced[0].outcome == "success" and raced[0].tally.counters_committed == 20
    assert a.outcome == "success", a.message
    assert a.tally.counters_quarantined == 0 and a.tally.conflicts >= 1, a.tally
    assert all(v.value == 7 and v.compact_value == 7 for v in client.read_many(counters))


def _cas_timeout() -> WriteTimeout:
    """The error a coordinator returns when a Paxos round times out: outcome unknown."""
    return WriteTimeout(
        "Operation timed out - received only 0 responses.",
        consistency=ConsistencyLevel.SERIAL,
        required_responses=2,
        received_responses=0,
        write_type=WriteType.CAS,
    )


@pytest.mark.parametrize(
    "error",
    [_cas_timeout, lambda: OperationTimedOut("client timeout")],
    ids=["cas-write-timeout", "client-timeout"],
)
@pytest.mark.parametrize("applied", [True, False], ids=["applied", "not-applied"])
def test_a_commit_whose_outcome_is_unknown_is_settled_and_the_run_stays_exact(
    make_family, t0, error, applied
):
    """A commit's conditional batch times out (on the 3-node cluster under load it did): the
    run reads the bucket's head serially, marks the commit if it applied (cleanup deletes its
    rows in this run), folds again if it did not, and stays exact either way. Deciding
    "applied" without the head's proof (``_commit_applied`` returning True) fails the
    not-applied cases (checked): their rows would be deleted uncounted."""
    _family, store, client = make_family(shards=1)
    counters = [(f"k{i}",) for i in range(10)]
    client.record(
        [Increment(c, 3, utc_aware(t0 + timedelta(minutes=1)), ("w", 1)) for c in counters]
    )
    client.record(
        [Increment(c, 5, utc_aware(t0 + timedelta(minutes=4)), ("w", 4)) for c in counters]
    )
    commit_bucket = store.ledger.commit_bucket
    timeouts: list[tuple[bool, int]] = []  # (applied, counters) of the commit that timed out

    first = threading.Lock()  # the run commits its buckets from several threads

    def commit_then_time_out(shard, bucket, head, folds, *args):
        if not first.acquire(blocking=False):
            return commit_bucket(shard, bucket, head, folds, *args)
        timeouts.append((applied and commit_bucket(shard, bucket, head, folds, *args), len(folds)))
        raise error()

    store.ledger.commit_bucket = commit_then_time_out
    summary = engine.run_family(store, t0 + timedelta(minutes=2), now=t0 + timedelta(minutes=4))
    assert summary.outcome == "success", summary.message
    [(was_applied, in_commit)] = timeouts
    assert was_applied is applied and in_commit > 0
    assert summary.tally.conflicts == (0 if applied else in_commit), summary.tally
    assert summary.tally.rows_deleted == len(counters), summary.tally  # the folded rows, now
    assert all(v.value == 8 and v.compact_value == 3 for v in client.read_many(counters))
    for counter in counters:
        assert rows_at_or_below(store, counter, t0 + timedelta(minutes=2)) == 0
        assert len(raw_rows(store, counter)) == 1  # the one above the epoch


def test_a_write_error_that_is_not_a_timeout_fails_the_run_and_deletes_nothing(make_family, t0):
    """Only a timeout leaves a commit's outcome open; any other error fails the run, and a
    failed run deletes nothing."""
    _family, store, client = make_family(shards=1)
    counters = [(f"k{i}",) for i in range(5)]
    client.record(
        [Increment(c, 3, utc_aware(t0 + timedelta(minutes=1)), ("w", 1)) for c in counters]
    )

    def refuse(*_args, **_kwargs):
        raise WriteTimeout("batch log", write_type=WriteType.BATCH_LOG)

    store.ledger.commit_bucket = refuse
    with pytest.raises(WriteTimeout):
        engine.run_family(store, t0 + timedelta(minutes=2), now=t0 + timedelta(minutes=4))
    assert all(len(raw_rows(store, c)) == 1 for c in counters)
    del store.ledger.commit_bucket  # the table's own method again
    again = engine.run_family(store, t0 + timedelta(minutes=2), now=t0 + timedelta(minutes=4))
    assert again.outcome == "success", again.message
    assert all(v.value == 3 and v.compact_value == 3 for v in client.read_many(counters))
