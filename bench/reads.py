"""Section 5, ``reads``: read latency of a compacted, an uncompacted and a fresh counter."""

from __future__ import annotations

from datetime import timedelta

from counters import engine
from counters.client import Increment
from counters.core import table_time, utc_aware, write_timestamp

from .harness import Bench
from .ops import (
    utc_now,
)


def reads(bench: Bench) -> None:
    p = bench.p
    if hasattr(bench, "main_family"):
        _family, store, client = bench.reuse_family(bench.main_family, "reads")
    else:
        _family, store, client = bench.make_family("bench_main")
    now_min = utc_now().replace(second=0, microsecond=0)
    start = now_min - timedelta(minutes=p.history_minutes)
    history = [
        (table_time(start + timedelta(minutes=k)), 1 + k % 50) for k in range(p.history_minutes)
    ]
    keys = {
        "compacted": ("lat-compacted",),
        "uncompacted": ("lat-uncompacted",),
        "fresh": ("lat-fresh",),
    }
    bench.say(f"read latency: {p.history_minutes} per-minute rows, compacted vs not vs fresh")
    client.record(
        Increment(keys["compacted"], inc, utc_aware(at), ("lat", k))
        for k, (at, inc) in enumerate(history)
    )
    # Left uncompacted: written without an index mark, so no run ever finds it.
    store.raw.insert_raw(
        [
            (keys["uncompacted"], (at, "lat", k), inc, write_timestamp(at))
            for k, (at, inc) in enumerate(history)
        ]
    )
    fresh_at = table_time(utc_now())
    client.record([Increment(keys["fresh"], 5, utc_aware(fresh_at), ("lat", 0))])
    # Kept compact by the job: one run over the backlog, then per-minute runs.
    runs = []
    for back in range(11, 1, -1):
        summary = engine.run_family(store, now_min - timedelta(minutes=back), now=utc_now())
        runs.append(summary.tally.rows_folded)
    total = sum(inc for _at, inc in history)
    expect = {"compacted": total, "uncompacted": total, "fresh": 5}
    values = {name: client.read(key) for name, key in keys.items()}
    stats = bench.read_latency(client.read, keys, p.reads)
    for name in stats:
        stats[name]["value_exact"] = values[name] == expect[name]
    # What the engine's fold read (all of a counter's rows, tombstones included) costs on
    # the same counters: the compacted one carries a tombstone per folded row.
    fold = bench.read_latency(
        lambda key: store.raw.read_rows([key]), keys, max(50, p.reads // 4), warmup=10
    )
    bench.results["read_latency"] = {
        "history_minutes": p.history_minutes,
        "runs_rows_folded": runs,
        "reads_per_counter": p.reads,
        "read_call": "CounterClient.read (compact row, then the slice after its epoch)",
        "counters": stats,
        "fold_read_rows": fold,
    }
