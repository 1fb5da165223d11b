"""Adversarial: a reset's check of its point against the compacted epoch once a late backlog
has lowered that epoch below rows already folded."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from counters import engine
from counters.client import Increment
from counters.store import Store

pytestmark = pytest.mark.integration


def inc(counter: str, amount: int, at: datetime, actor: str, version: int = 0) -> Increment:
    return Increment((counter,), amount, at, (actor, version))


def run(store: Store, epoch: datetime) -> str:
    return engine.run_family(store, epoch, now=epoch + timedelta(minutes=5)).outcome


def test_a_reset_between_a_lowered_epoch_and_the_highest_folded_loses_folded_increments(
    make_family, t0, monkeypatch
):
    """``decide_reset`` refuses a point before the compacted epoch ("increments after the
    reset point are already folded in"). A late backlog lowers the epoch below rows already
    folded and deleted, so a point between the lowered epoch and the highest epoch folded
    passes that check: the reset sets the value to 0 and the folded increment after its point
    (r, deleted) is lost."""
    from counters.compaction import fold as fold_module

    monkeypatch.setattr(fold_module, "MAX_FOLD_ROWS", 2)
    _family, store, client = make_family(shards=1)
    e1, e2, e3 = (t0 + timedelta(minutes=m) for m in (1, 2, 3))
    client.record([inc("c", 1, t0 + timedelta(seconds=10), "a")])
    assert run(store, e1) == "success"
    client.record([inc("c", 10, e1 + timedelta(seconds=40), "r")])
    assert run(store, e2) == "success"  # folds r (after the point below) and deletes it
    client.record(
        [
            inc("c", 100, t0 + timedelta(seconds=20), "x", 1),
            inc("c", 100, t0 + timedelta(seconds=20), "x", 2),
            inc("c", 1_000, t0 + timedelta(seconds=30), "y"),
        ]
    )
    assert run(store, e3) == "success"
    assert client.late_horizon("c") == t0 + timedelta(seconds=20)  # lowered below r
    point = e1 + timedelta(seconds=20)  # before r, after the lowered epoch
    engine.reset_counter(store, ("c",), at=point, now=e3 + timedelta(minutes=5))
    # after the reset only the increments after its point count: r
    assert client.read("c") == 10, "the reset dropped r, folded before the epoch was lowered"
