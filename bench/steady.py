"""The ``steady`` section: one family run after run, as the every-minute schedule runs it."""

from __future__ import annotations

import itertools
import time
from datetime import timedelta

from counters.core import BUCKETS

from .harness import Bench
from .ops import (
    Dataset,
    load_write_path,
    sweeping_far_away,
    utc_now,
)


def steady(bench: Bench) -> None:
    """One family run after run, as the every-minute schedule runs it on a busy family:
    every round writes ``rows_per_counter`` more increments on each of ``steady_counters``
    counters and one run folds and deletes them (the first run sweeps, the others do not).
    Each fold leaves a tombstone per row in its counter's partition for the raw table's
    ``gc_grace_seconds`` (3 h: 180 minute runs), and every later run that reads the
    partition reads them again: how a run's cost grows with them is what this measures.
    Each round is checked exact (every value the sum of all rounds so far, no raw row
    left). A run minutes apart finds only the marks of the last two minutes (older ones
    were forgotten by the runs before, ``engine.FORGET_MARGIN``); back to back, without the
    wait, the rounds forget them so: after round n, the marks written before round n.
    Rounds do not wait for the node's compactions of the rounds before: in service they
    run beside the next runs, and a round's figures include them."""
    p = bench.p
    t0 = (utc_now() - timedelta(days=1)).replace(second=0, microsecond=0)
    data = Dataset("y", p.steady_counters, p.rows_per_counter, t0)
    family, store, client = bench.make_family("bench_steady", **sweeping_far_away())
    expected = dict.fromkeys(data.expected(), 0)
    # the raw table holds up to rounds x rows tombstones per counter: ~20 partitions a range
    ranges = max(32, p.steady_counters // 20)
    kept = ("ok", "error", "seconds", "sweep", "phases_s", "requests", "client_cpu_s")
    kept += ("server_cpu_s", "server_cpu_by_thread_s")
    rounds = []
    for n in range(p.steady_rounds):
        written_from = int(time.time() * 1_000_000)
        load_write_path(client, data)
        for key, total in data.expected().items():
            expected[key] += total
        run = bench.checked_run(
            f"steady round {n}", family, data.epoch, expected, ranges, quiet=False
        )
        for shard, bucket in itertools.product(range(family.shards), range(BUCKETS)):
            store.index.forget_bucket(shard, bucket, written_from)
        rounds.append(
            {
                "round": n,
                "tombstones_per_counter_before": n * data.rows,
                **{k: run[k] for k in kept},
                "exact": run["exactness"]["exact"],
            }
        )
        bench.say(
            f"steady round {n}: {run['seconds']:.1f} s, node {run['server_cpu_s']} CPU-s, "
            f"exact={run['exactness']['exact']}"
        )
        data = data.next_round()
    bench.results["steady"] = {
        "counters": p.steady_counters,
        "rows_per_round": data.row_count,
        "rounds": rounds,
    }
