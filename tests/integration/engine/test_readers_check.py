"""The independent conservation check: readers' copies before and after a commit (issue #43,
items 1 and 2). A fold built on a wrong base must be seen before anything is deleted, by the
per-counter check and, if that one is gone, by the family checks and the GX suite."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from counters import engine
from counters.client import CounterClient, Increment
from counters.compaction import fold as fold_module
from counters.core import to_millis, utc_aware
from counters.reshard import reshard
from counters.store import Store

from .helpers import aware, compact_row, rows_at_or_below

pytestmark = pytest.mark.integration


def _wrong_base(monkeypatch: pytest.MonkeyPatch, victim: tuple) -> None:
    """Make the fold start ``victim`` from value 0 on its right commit: the compare-and-set on
    the commit holds, and every check computed from the fold agrees with itself."""
    real = fold_module.fold_counter

    def fold_counter(counter, base, *args, **kwargs):
        if counter == victim:
            base = replace(base, value=0)
        return real(counter, base, *args, **kwargs)

    monkeypatch.setattr(fold_module, "fold_counter", fold_counter)


def _x_with_history(make_family, t0):
    """Counter X: +100 compacted (its rows deleted), then +7 newer; Y: +5 then +1."""
    family, store, client = make_family(shards=1)
    client.record([Increment(("X",), 100, utc_aware(t0 + timedelta(seconds=10)), ("w", 1))])
    client.record([Increment(("Y",), 5, utc_aware(t0 + timedelta(seconds=10)), ("w", 1))])
    first = t0 + timedelta(minutes=1)
    engine.run_family(store, first, now=first + timedelta(minutes=5))
    client.record([Increment(("X",), 7, utc_aware(first + timedelta(seconds=10)), ("w", 2))])
    client.record([Increment(("Y",), 1, utc_aware(first + timedelta(seconds=10)), ("w", 2))])
    return family, store, client, first + timedelta(minutes=1)


def test_a_fold_from_a_wrong_base_is_quarantined_before_its_commit(make_family, t0, monkeypatch):
    _family, store, client, epoch = _x_with_history(make_family, t0)
    _wrong_base(monkeypatch, ("X",))
    with pytest.raises(engine.ChecksFailed, match=r"1 counter.s. quarantined") as failed:
        engine.run_family(store, epoch, now=epoch + timedelta(minutes=5))
    alert = failed.value.outcomes
    assert any(o.name == "no_counter_quarantined" and not o.success for o in alert)
    [entry] = engine.quarantined(store)
    assert entry.counter == ("X",) and entry.reason == "check_failed"
    assert "readers' copy" in entry.detail and "holds value 100" in entry.detail
    assert compact_row(store, ("X",)).value == 100  # nothing written over what readers had
    assert rows_at_or_below(store, ("X",), epoch) == 1  # nothing of it deleted
    assert client.read("X") == 107
    assert client.read("Y") == 6 and rows_at_or_below(store, ("Y",), epoch) == 0  # the rest ran


def test_without_the_per_counter_check_the_family_checks_see_the_wrong_base(
    make_family, t0, monkeypatch
):
    """The per-counter check removed too: the commit lands, and the evidence (readers' copies
    read by key before and after) fails the family checks and the GX suite; nothing deleted."""
    from counters.gx import checks

    _family, store, _client, epoch = _x_with_history(make_family, t0)
    _wrong_base(monkeypatch, ("X",))
    real = fold_module.readers_base
    monkeypatch.setattr(
        fold_module, "readers_base", lambda fold, *a: (real(fold, *a)[0], None)
    )  # every fold may commit
    report = engine.compact_shard(store, 0, epoch, "run-wrong-base")
    verification = engine.verify_run([report])
    assert not verification.passed
    failed = {o.name for o in verification.outcomes if o.critical and not o.success}
    assert failed == {"family_total_conserved", "value_change_equals_folded_sum"}
    suite = checks.validate_evidence(store.family.name, "run-wrong-base", verification.evidence)
    assert not suite.success
    assert {o.name for o in suite.outcomes if not o.success} >= {
        "family_total_conserved",
        "value_change_equals_folded_sum",
    }
    assert rows_at_or_below(store, ("X",), epoch) == 1  # no cleanup runs after a failed verify


def test_the_check_passes_an_honest_run(make_family, t0):
    """The positive control of the two tests above: the same history, no fault, no alarm."""
    _family, store, client, epoch = _x_with_history(make_family, t0)
    report = engine.compact_shard(store, 0, epoch, "run-honest")
    verification = engine.verify_run([report])
    assert verification.passed
    evidence = verification.evidence
    assert sum(e.readers_before for e in evidence) == 105
    assert sum(e.readers_after for e in evidence) == 113
    assert sum(e.value_delta for e in evidence) == sum(e.sum_folded for e in evidence) == 8
    assert client.read("X") == 107


def test_a_writer_with_the_old_shard_count_after_a_reshard_loses_nothing(conn, make_family, t0):
    """Issue #43 item 2: X +100, a reshard from 2 to 8 shards, then a writer still configured
    with 2 shards writes X +7: its mark lands in a bucket that, under 8 shards, holds other
    counters, 40 of which were just written (so that bucket is read whole, by token range,
    where X's copy is not). The run moves X's mark to X's bucket and folds X there, from its
    checkpoint; nothing is lost and nothing quarantined. No run after the first sweeps (a
    sweep would fold X's row without its mark): the moved mark alone gets X's row folded."""
    family, store, client = make_family(shards=2, sweep_interval="1d")
    client.record([Increment(("X",), 100, utc_aware(t0 + timedelta(seconds=10)), ("w", 1))])
    first = t0 + timedelta(minutes=1)
    engine.run_family(store, first, now=first + timedelta(minutes=5))
    reshard(store, 8)
    eight = store.with_shards(8)
    stale = CounterClient(conn, family, Store(conn, family, store.layout))  # shards: 2
    filed = stale.store.keys.bucket(("X",))  # where the stale writer files X's mark
    assert filed != eight.keys.bucket(("X",))
    near = [c for c in (f"n{i}" for i in range(12000)) if eight.keys.bucket((c,)) == filed][:40]
    assert len(near) == 40
    reader = CounterClient(conn, eight.family, eight)
    reader.record(
        [Increment((c,), 1, utc_aware(first + timedelta(seconds=10)), ("w", 1)) for c in near]
    )
    second = first + timedelta(minutes=15)
    for shard in range(8):  # a sweep counts every bucket: the next run may read one whole
        engine.compact_shard(eight, shard, second, "sweep-after-reshard", sweep=True)
    # no mark of X where it belongs (the marks of the first writes may still be there: the
    # runs here come seconds after them, within the forget margin)
    conn.session.execute(f'TRUNCATE {family.keyspace}."{family.raw_table}_touched"')
    reader.record(
        [Increment((c,), 1, utc_aware(second + timedelta(seconds=10)), ("w", 2)) for c in near]
    )
    stale.increment(
        "X", 7, at=aware(first + timedelta(seconds=20)), identity=("w", 2)
    )  # read by name
    epoch = second + timedelta(minutes=1)
    for shard in range(8):  # no sweep: the marks decide what is read
        engine.compact_shard(eight, shard, epoch, "run-after-stale-write")
        assert reader.read("X") == 107
    # X's mark left the bucket the stale writer filed it in, for X's own, with its minute
    filed_shard, filed_bucket = filed
    assert ("X",) not in {t.counter for t in eight.index.touched(filed_shard)[filed_bucket]}
    own_shard, own_bucket = eight.keys.bucket(("X",))
    marks = {t.counter: t for t in eight.index.touched(own_shard)[own_bucket]}
    assert marks[("X",)].earliest_ms == to_millis(first)  # the stale write's minute
    for minutes in (2, 3):  # the mark moved is folded, the rows deleted
        epoch = second + timedelta(minutes=minutes)
        summary = engine.run_family(eight, epoch, now=epoch + timedelta(minutes=5))
        assert not summary.plan.sweep
        assert reader.read("X") == 107
    assert engine.quarantined(eight) == []
    assert rows_at_or_below(eight, ("X",), epoch) == 0
    assert compact_row(eight, ("X",)).value == 107
    assert {v.counter[0]: v.value for v in reader.read_many(near)} == dict.fromkeys(near, 2)
