"""A late backlog folded over several runs lowers its counter's epoch (issue 49, item 1): the
read rule and a reset's point, which assumed epochs only move forward. Found by a fresh
adversarial read of that change; both tests failed on it."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from counters import engine
from counters.client import CounterClient, Increment
from counters.core import utc_aware
from counters.errors import EngineError
from counters.store import Store

from .helpers import aware

pytestmark = pytest.mark.integration


def inc(counter: str, amount: int, at: datetime, actor: str, version: int = 0) -> Increment:
    return Increment((counter,), amount, utc_aware(at), (actor, version))


def run(store: Store, epoch: datetime) -> str:
    return engine.run_family(store, epoch, now=epoch + timedelta(minutes=5)).outcome


@pytest.mark.parametrize("reader", ["cold", "warm"])
def test_a_read_spanning_a_commit_that_lowers_the_epoch_back_to_its_bound_is_exact(
    conn, make_family, t0, monkeypatch, reader
):
    """A reader reads the copy (epoch E1) and the rows after E1 (a row r). Then two runs: the
    first folds r and deletes it (epoch E2), the second folds a late backlog of rows stamped
    exactly E1 (a minute boundary) over a commit's limit and lowers the epoch to E1. The
    reader's settling read finds epoch E1 again, the bound its row read used: by the epoch
    alone it would accept, counting r in the copy and again as a newer row and missing the
    late row after E1 (read 221). The copy's commit tells the copies apart: the reader reads
    again. Mutation: ``ReadBase.settles`` by the epoch alone -> 221."""
    from counters.compaction import fold as fold_module

    monkeypatch.setattr(fold_module, "MAX_FOLD_ROWS", 2)
    family, store, client = make_family(shards=1)
    e1, e2, e3 = (t0 + timedelta(minutes=m) for m in (1, 2, 3))
    client.record([inc("c", 1, t0 + timedelta(seconds=10), "a")])
    assert run(store, e1) == "success"
    client.record([inc("c", 10, e1 + timedelta(seconds=10), "r")])
    reading = CounterClient(conn, family, Store(conn, family, store.layout))
    if reader == "warm":
        assert reading.read("c") == 11  # keeps E1 as the next read's bound (READ_HINT_S)
    raw = reading.store.reader.raw
    read_newer = raw.read_newer
    ran: list[str] = []

    def two_runs_after_the_row_read(counters, bounds):
        result = read_newer(counters, bounds)
        if not ran:
            ran.append(run(store, e2))  # folds r, deletes it
            client.record(  # a late backlog, stamped on E1's minute boundary and after it
                [
                    inc("c", 100, e1, "x", 1),
                    inc("c", 100, e1, "x", 2),
                    inc("c", 1_000, e1 + timedelta(seconds=30), "y"),
                ]
            )
            ran.append(run(store, e3))  # folds the two rows at E1, lowers the epoch to E1
        return result

    monkeypatch.setattr(raw, "read_newer", two_runs_after_the_row_read)
    value = reading.read("c")
    assert ran == ["success", "success"]
    after = client.read("c")  # 1 + 10 + 200 + 1_000: the late row after E1 counted at once
    # a read that spans the runs returns the value before them (11) or after them
    assert value in (11, after), f"read {value} (before 11, after {after}): r counted twice"
    assert client.late_horizon("c") == e1  # the epoch went back to the reader's bound


def test_a_reset_point_below_an_epoch_a_lowered_counter_had_is_refused(
    make_family, t0, monkeypatch
):
    """A reset refuses a point before the compacted epoch: increments after it are folded in
    already. A late backlog lowers the epoch below rows already folded and deleted (r), so a
    point between the lowered epoch and the highest epoch folded must be refused too, by the
    dry run as by the reset, until the backlog has drained; a point at or after that epoch is
    a reset. Without it the reset set 0 and r was lost (read 0 where 10 is right). Mutation:
    no ``high_ms`` check in ``decide_reset`` -> the reset goes through."""
    from counters.compaction import fold as fold_module

    monkeypatch.setattr(fold_module, "MAX_FOLD_ROWS", 2)
    _family, store, client = make_family(shards=1)
    e1, e2, e3, e4 = (t0 + timedelta(minutes=m) for m in (1, 2, 3, 4))
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
    assert client.read("c") == 1_211
    point = e1 + timedelta(seconds=20)  # before r, after the lowered epoch
    for attempt in (engine.plan_reset, engine.reset_counter):
        with pytest.raises(EngineError, match=r"before 20\d\d-.*folded it to") as refused:
            attempt(store, ("c",), at=aware(point), now=e3 + timedelta(minutes=5))
        assert store.family.name in str(refused.value) and "counter c" in str(refused.value)
    assert client.read("c") == 1_211  # the refused reset wrote nothing
    assert run(store, e4) == "success"  # the backlog drains: the epoch is past r's again
    assert client.late_horizon("c") >= e2
    with pytest.raises(EngineError, match="before its compacted epoch"):
        engine.reset_counter(store, ("c",), at=aware(point), now=e4 + timedelta(minutes=5))
    done = engine.reset_counter(store, ("c",), at=aware(e4), now=e4 + timedelta(minutes=5))
    assert done.value_before == 1_211 and client.read("c") == 0
