"""The quarantine metric is a gauge of the counters quarantined now, read from the real node:
a counter that stays quarantined through several runs counts once, in whichever shard it is."""

from __future__ import annotations

from datetime import timedelta

import pytest
from counters import engine, health
from counters.metrics import run_metrics

from .helpers import aware, rows_at_or_below

pytestmark = pytest.mark.integration


def run(store, epoch):
    return engine.run_family(store, epoch, now=epoch + timedelta(minutes=5))


def test_a_counter_that_stays_quarantined_counts_once_until_released(make_family, t0):
    family, store, client = make_family(shards=4)
    client.increment("AAPL", 5, at=aware(t0 + timedelta(seconds=10)), identity=("w", 1))
    store.statements.session.execute(
        f"INSERT INTO {family.keyspace}.{family.raw_table} (type, modify_time, actor, version) "
        "VALUES ('IBM', %s, 'bad', 1)",  # a NULL increment: IBM is quarantined
        (t0 + timedelta(seconds=20),),
    )
    assert health.quarantined_now(store) == 0
    epoch = t0 + timedelta(minutes=10)
    for minutes in (0, 1, 2):  # three runs, each finding IBM still quarantined
        with pytest.raises(engine.ChecksFailed, match="quarantined"):
            run(store, epoch + timedelta(minutes=minutes))
        count = health.quarantined_now(store)
        assert count == 1
        record = store.audit.page(1)[0]
        gauge = {m.name: m for m in run_metrics(record, epoch, quarantined=count)}
        assert gauge["counters.quarantined"].kind == "gauge"
        assert gauge["counters.quarantined"].value == 1
    assert rows_at_or_below(store, ("IBM",), epoch) == 1  # nothing of it deleted

    # counters held in other shards count too: every shard's partition is read
    held = [f"H{i}" for i in range(12)]
    assert len({store.keys.bucket((c,))[0] for c in held}) > 1
    store.quarantine.add("by-hand", [((c,), "bad_rows", "held for the test") for c in held])
    assert health.quarantined_now(store) == 1 + len(held)

    engine.release(store, ("H0",))
    assert health.quarantined_now(store) == len(held)
