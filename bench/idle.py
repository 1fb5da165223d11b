"""Section 4, ``idle``: a minute's run over a table of mostly idle counters against one of the
active counters alone."""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from typing import Any

from counters.config import Family
from counters.core import table_time, write_timestamp

from .harness import Bench
from .ops import (
    Dataset,
    Meter,
    load_write_path,
    tombstone_index_marks,
    utc_now,
    write_folded_compact_rows,
)


def prepare_idle(bench: Bench) -> None:
    p = bench.p
    t1 = (utc_now() - timedelta(days=1)).replace(second=0, microsecond=0)
    bench.idle_data = Dataset("k", p.active_counters, p.rows_per_counter, t1)
    bench.idle_e0 = table_time(t1 - timedelta(hours=1))
    base = {bench.idle_data.key(i): 1000 + i % 100 for i in range(p.idle_counters)}
    bench.idle_base = base
    setups = {}
    for name, total in (("bench_active", p.active_counters), ("bench_idle", p.idle_counters)):
        # a day between sweeps: the measured runs are minute runs, not a sweep that comes
        # due at the family's phase while the bench waits (sweeps are timed in section 3)
        family, store, client = bench.make_family(name, sweep_interval="1d")
        keys = [bench.idle_data.key(i) for i in range(total)]
        bench.say(f"{name}: {total:,} compact rows as an earlier run left them (bulk)")
        with Meter(bench.server) as meter:
            write_folded_compact_rows(
                bench.conn,
                family,
                [(k, base[k]) for k in keys],
                bench.idle_e0,
                p.rows_per_counter,
            )
        # as in steady state: swept recently, so the measured run is a minute's run
        store.state.advance_family_epoch(bench.idle_e0, "bench-setup", swept_at=utc_now())
        with Meter(bench.server) as load:
            load_write_path(client, bench.idle_data)
        bench.marks_at[name] = time.time()
        setups[name] = {
            "compact_rows_bulk": {**meter.as_dict(), "rows": total},
            "increments_write_path": {**load.as_dict(), "rows": bench.idle_data.row_count},
        }
        setattr(bench, name.replace("bench_", "") + "_family", (family, store, client))
    bench.results["idle_setup"] = setups


def _idle_expected(bench: Bench, total: int, extra: list[Dataset]) -> dict[tuple, int]:
    expected = {
        bench.idle_data.key(i): bench.idle_base[bench.idle_data.key(i)] for i in range(total)
    }
    for data in extra:
        for i in data.indexes():
            expected[data.key(i)] += data.total(i)
    return expected


def _idle_run(
    bench: Bench, label: str, family: Family, total: int, epoch: datetime, datasets: list[Dataset]
) -> dict[str, Any]:
    return {
        **bench.checked_run(label, family, epoch, _idle_expected(bench, total, datasets)),
        "counters_in_table": total,
        "active_counters": bench.p.active_counters,
        "rows": bench.idle_data.row_count,
    }


def idle(bench: Bench) -> None:
    p = bench.p
    epoch = bench.idle_data.epoch
    active_family = bench.active_family[0]
    idle_family, idle_store, idle_client = bench.idle_family
    out = {
        "active_only": _idle_run(
            bench, "active_only", active_family, p.active_counters, epoch, [bench.idle_data]
        ),
        "idle_heavy": _idle_run(
            bench, "idle_heavy", idle_family, p.idle_counters, epoch, [bench.idle_data]
        ),
    }
    # The same idle-heavy table, but the idle counters' index marks were forgotten recently
    # (row tombstones in the index, within its gc_grace_seconds), then a new round of
    # increments for the active counters.
    later = Dataset("k", p.active_counters, p.rows_per_counter, epoch + timedelta(minutes=1))
    idle_keys = [bench.idle_data.key(i) for i in range(p.active_counters, p.idle_counters)]
    bench.say(f"idle-heavy, recent: {len(idle_keys):,} index tombstones, then new increments")
    with Meter(bench.server) as meter:
        tombstone_index_marks(
            idle_store, idle_keys, write_timestamp(utc_now() - timedelta(minutes=5))
        )
    load_write_path(idle_client, later)
    bench.marks_at[idle_family.name] = time.time()
    recent = _idle_run(
        bench,
        "idle_heavy_recent",
        idle_family,
        p.idle_counters,
        later.epoch,
        [bench.idle_data, later],
    )
    recent["index_tombstones"] = len(idle_keys)
    recent["tombstones_written_s"] = round(meter.seconds, 2)
    out["idle_heavy_recent_forgets"] = recent
    bench.results["idle"] = out
