"""The commit's compare-and-set: what it must refuse whatever a run's reads returned.

A run reads a bucket's head and its counters' ledger rows in separate quorum requests. On a
cluster a read can meet a commit still landing on the replicas and see its head but not yet its
rows; a fold built on such a row and committed under that head would put the counter back one
commit. Each counter's row condition (``IF commit_id = <the commit its fold was built on>``)
refuses it. Removing that condition from ``Store.commit_bucket`` makes this test fail (checked).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from counters import engine
from counters.client import Increment
from counters.core import EMPTY_CHECKPOINT, fold_counter, to_millis

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
