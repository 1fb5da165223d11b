"""Adversarial: the read rule when a late backlog lowers a counter's epoch back to a value a
reader's first requests were bounded by (an ABA on the copy's epoch)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from counters import engine
from counters.client import CounterClient, Increment
from counters.store import Store

pytestmark = pytest.mark.integration


def inc(counter: str, amount: int, at: datetime, actor: str, version: int = 0) -> Increment:
    return Increment((counter,), amount, at, (actor, version))


def run(store: Store, epoch: datetime) -> str:
    return engine.run_family(store, epoch, now=epoch + timedelta(minutes=5)).outcome


@pytest.mark.parametrize("reader", ["cold", "warm"])
def test_a_lowered_epoch_equal_to_a_readers_bound_double_counts(
    conn, make_family, t0, monkeypatch, reader
):
    """A reader reads the copy (epoch E1) and the rows after E1 (a row r). Then two runs: the
    first folds r and deletes it (epoch E2), the second folds a late backlog of rows stamped
    exactly E1 (a minute boundary) over a commit's limit and lowers the epoch to E1. The
    reader's settling read finds epoch E1 again, the bound its row read used, and accepts:
    r is counted in the copy and again as a newer row, and the late row after E1 is missed.
    Before epoch lowering, epochs only moved forward and the check could not be fooled."""
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
