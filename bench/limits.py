"""The ``limits`` section: one hot counter whose rows outnumber the node's tombstone limit."""

from __future__ import annotations

import time
from datetime import timedelta

from counters import engine
from counters.client import Increment
from counters.core import utc_aware

from .harness import Bench
from .ops import (
    engine_step_failed_in,
    utc_now,
)


def limits(bench: Bench) -> None:
    """One hot counter: ``hot_rows`` rows folded at once (a burst, or ~600 increments a
    minute for the raw table's 3 h gc_grace), then one more increment and another run. Every
    folded row leaves a row tombstone in the counter's partition; Cassandra refuses reads
    over ``tombstone_failure_threshold`` (100,000), so the engine must read the counter by
    parts (``engine.read_hot_counter``) and say so (``windowed_reads``)."""
    p = bench.p
    if hasattr(bench, "main_family"):
        family, store, client = bench.reuse_family(bench.main_family, "limits")
    else:
        family, store, client = bench.make_family("bench_main")
    key = ("hot",)
    t0 = (utc_now() - timedelta(hours=3)).replace(second=0, microsecond=0)
    for start in range(0, p.hot_rows, 20_000):
        client.record(
            Increment(key, 1, utc_aware(t0 + timedelta(milliseconds=20 * j)), ("hot", j))
            for j in range(start, min(p.hot_rows, start + 20_000))
        )
    epoch = t0 + timedelta(minutes=60)
    late = t0 + timedelta(minutes=61)
    folds = []
    for n, at in enumerate((epoch, late)):
        if n == 1:
            client.record(
                [Increment(key, 5, utc_aware(at - timedelta(seconds=30)), ("hot-new", 0))]
            )
        bench.say(f"limits: hot counter, fold {n + 1}")
        started = time.perf_counter()
        try:
            summary = engine.run_family(store, at, now=utc_now())
            folds.append(
                {
                    "ok": True,
                    "seconds": round(time.perf_counter() - started, 3),
                    "outcome": summary.outcome,
                    "rows_folded": summary.tally.rows_folded,
                    "windowed_reads": summary.tally.windowed_reads,
                }
            )
        except Exception as exc:
            folds.append(
                {
                    "ok": False,
                    "seconds": round(time.perf_counter() - started, 3),
                    "failed_in": engine_step_failed_in(exc),
                    "error": f"{type(exc).__name__}: {str(exc)[:300]}",
                }
            )
    value = client.read(key)
    bench.results["limits"] = {
        "hot_counter_rows": p.hot_rows,
        "folds": folds,
        "read_value": value,
        "read_exact": value == p.hot_rows + 5,
        "family_epoch_after": str(store.state.family_epoch()),
    }
    bench.reset_family(family)
