"""The commit's compare-and-set: what it must refuse whatever a run's reads returned.

A run reads a bucket's head and its counters' ledger rows in separate quorum requests. On a
cluster a read can meet a commit still landing on the replicas and see its head but not yet its
rows; a fold built on such a row and committed under that head would put the counter back one
commit. Each counter's row condition (``IF commit_id = <the commit its fold was built on>``)
refuses it. Removing that condition from ``Store.commit_bucket`` makes this test fail (checked).
Likewise a run reads the ledger rows, then the compact copies: a rival's commit can land in
between; without the second look at the ledger (``_compact_bucket``) the second test fails.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from counters import engine
from counters.client import Increment
from counters.core import EMPTY_CHECKPOINT, fold_counter, to_millis
from counters.store import Store

pytestmark = pytest.mark.integration


def test_a_fold_on_a_stale_checkpoint_is_refused_under_the_current_head(make_family, t0):
    _family, store, client = make_family()
    counter = ("X",)
    client.record([Increment(counter, n, t0 + timedelta(minutes=n), ("w", n)) for n in (1, 2)])
    shard, bucket = store.bucket(counter)
    stale = store.read_ledger(shard, bucket, [counter])  # before any commit: no row
    assert counter not in stale.checkpoints

    first = engine.run_family(store, t0 + timedelta(minutes=5), now=t0 + timedelta(minutes=7))
    assert first.outcome == "success" and client.read("X") == 3
    client.record([Increment(counter, 4, t0 + timedelta(minutes=6), ("w", 6))])

    # the head as a read that met the first run's commit saw it, the row as one that did not
    head = store.read_ledger(shard, bucket, [counter]).head
    rows = store.read_rows([counter])[counter]  # the raw rows as they are: only the new one
    fold = fold_counter(counter, EMPTY_CHECKPOINT, rows, to_millis(t0 + timedelta(minutes=10)))
    assert fold.commit and fold.value == 4  # what the ledger would hold: 3 increments lost
    applied = store.commit_bucket(
        shard, bucket, head, [fold], store.new_commit_id(), "stale", to_millis(t0) * 1000
    )
    assert not applied
    assert store.read_ledger(shard, bucket, [counter]).checkpoints[counter].value == 3
    assert client.read("X") == 7

    # the same fold on the checkpoint as it is commits, and stays exact
    current = store.read_ledger(shard, bucket, [counter])
    base = current.checkpoints[counter]
    fold = fold_counter(counter, base, rows, to_millis(t0 + timedelta(minutes=10)))
    assert store.commit_bucket(
        shard, bucket, current.head, [fold], store.new_commit_id(), "fresh", to_millis(t0) * 1000
    )
    assert store.read_ledger(shard, bucket, [counter]).checkpoints[counter].value == 7


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
    client.record([Increment(c, 1, t0 + timedelta(minutes=1), ("w", 1)) for c in counters])
    first = engine.run_family(store, t0 + timedelta(minutes=2), now=t0 + timedelta(minutes=4))
    assert first.outcome == "success"
    client.record([Increment(c, 2, t0 + timedelta(minutes=3), ("w", 3)) for c in counters])
    client.record([Increment(c, 4, t0 + timedelta(minutes=5), ("w", 5)) for c in counters])

    racing = Store(conn, family, store.layout, concurrency=8)
    store_a = Store(conn, family, store.layout, concurrency=8)
    read_copies = store_a.read_copies
    raced: list[engine.RunSummary] = []

    def copies_after_a_rival_commit(*args, **kwargs):
        if not raced:  # once, between A's ledger read and its copies read
            raced.append(
                engine.run_family(
                    racing, t0 + timedelta(minutes=4), "B", use_lease=False,
                    now=t0 + timedelta(minutes=6),
                )
            )  # fmt: skip
        return read_copies(*args, **kwargs)

    store_a.read_copies = copies_after_a_rival_commit
    a = engine.run_family(
        store_a, t0 + timedelta(minutes=6), "A", use_lease=False, now=t0 + timedelta(minutes=8)
    )
    assert raced and raced[0].outcome == "success" and raced[0].tally.counters_committed == 20
    assert a.outcome == "success", a.message
    assert a.tally.counters_quarantined == 0 and a.tally.conflicts >= 1, a.tally
    assert all(v.value == 7 and v.compact_value == 7 for v in client.read_many(counters))
