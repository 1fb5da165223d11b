"""Sections 1-3 on the main data set (``--counters`` x ``--rows-per-counter``, loaded once
through ``CounterClient.record``): the scan floor, the required work, the naive peer, the
compaction and its next run, and the warm-up compactions before them."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from counters.config import Family
from counters.core import to_millis
from counters.engine import BUCKET_THREADS
from counters.store import Store

from .harness import Bench, cpu_figures, family_tables
from .ops import (
    Dataset,
    Meter,
    compare,
    count_rows,
    flush_tables,
    load_twin,
    load_write_path,
    naive_compact,
    naive_ddl,
    scan_raw,
    scan_values,
    sweeping_far_away,
    utc_now,
    wait_for_quiet_node,
)
from .required import required_work


def prepare_main(bench: Bench) -> None:
    p = bench.p
    t0 = (utc_now() - timedelta(days=2)).replace(second=0, microsecond=0)
    bench.main_data = Dataset("c", p.counters, p.rows_per_counter, t0)
    bench.main_family, bench.main_store, bench.main_client = bench.make_family(
        "bench_main", **sweeping_far_away()
    )
    bench.say(f"loading {bench.main_data.row_count:,} rows through CounterClient.record")
    with Meter(bench.server) as meter:
        load_write_path(bench.main_client, bench.main_data)
    bench.marks_at[bench.main_family.name] = time.time()
    bench.results["load"] = {
        "rows": bench.main_data.row_count,
        "counters": p.counters,
        "write_path": {
            **meter.as_dict(),
            "rows_per_s": round(bench.main_data.row_count / meter.seconds),
        },
    }
    bench.expected = bench.main_data.expected()
    if "naive" in p.only:
        for statement in naive_ddl(bench.keyspace, "naive_raw", "naive_compact"):
            bench.conn.session.execute(statement)
        bench.say("loading the same rows into the naive peer's twin table")
        with Meter(bench.server) as meter:
            load_twin(bench.conn, bench.keyspace, "naive_raw", bench.main_data)
        bench.results["load"]["twin_bulk"] = {
            **meter.as_dict(),
            "rows_per_s": round(bench.main_data.row_count / meter.seconds),
        }


def scan_floor(bench: Bench) -> None:
    p = bench.p
    runs = []
    quiet_waits = []
    for attempt in range(p.scan_repeats):
        quiet_waits.append(round(wait_for_quiet_node(bench.conn), 1))
        with Meter(bench.server) as meter:
            rows, total = scan_raw(bench.conn, bench.main_family, p.scan_ranges, p.scan_concurrency)
        runs.append({**meter.as_dict(), "rows": rows, "rows_per_s": round(rows / meter.seconds)})
        bench.say(f"scan floor {attempt + 1}: {rows:,} rows in {meter.seconds:.2f} s")
    best = min(runs, key=lambda r: r["seconds"])
    bench.results["scan_floor"] = {
        **best,
        "ranges": p.scan_ranges,
        "concurrency": p.scan_concurrency,
        "fetch_size": 5000,
        "all_runs_s": [r["seconds"] for r in runs],
        "quiet_wait_s": quiet_waits,
        "rows_expected": bench.main_data.row_count,
        "sum_matches": total == sum(bench.expected.values()),
    }


def required(bench: Bench) -> None:
    """The work the run's guarantees require, by the engine's primitives alone
    (``bench.required``), on the main data before the measured run. The scratch family's
    tables and Paxos state are emptied and flushed after, and the node left quiet, so none
    of it lands in the measured run."""
    family, store, _client = bench.make_family("bench_required", **sweeping_far_away())
    data = bench.main_data
    waited = wait_for_quiet_node(bench.conn)
    bench.say("required work: the run's steps by the engine's primitives alone")
    figures = required_work(
        bench.main_store,
        store,
        to_millis(data.epoch),
        bench.server,
        BUCKET_THREADS * bench.p.workers,
    )
    figures["quiet_wait_s"] = round(waited, 1)
    figures["complete"] = (
        figures["rows_read"] == data.row_count
        and figures["rows_recounted"] == data.row_count
        and figures["counters_committed"] == data.counters
        and figures["copies_read_back"] == data.counters
        and figures["rows_deleted"] == data.row_count
    )
    bench.results["required"] = figures
    total = figures["total"]
    bench.say(
        f"required work: {total['seconds']:.1f} s, cpu client {total['client_cpu_s']:.1f} s "
        f"node {total['server_cpu_s']} s, complete={figures['complete']}"
    )
    bench.reset_family(family)
    bench.say(flush_tables("system", ["paxos"], bench.local_instance))


def naive(bench: Bench) -> None:
    epoch = bench.main_data.epoch
    bench.say("naive peer: one counter at a time, synchronous calls")
    with Meter(bench.server) as meter:
        counters = naive_compact(bench.conn, bench.keyspace, "naive_raw", "naive_compact", epoch)
    found = scan_values(bench.conn, bench.keyspace, "naive_compact", ["type"], "value")
    left = count_rows(bench.conn, bench.keyspace, "naive_raw", ["type"])
    exactness = compare(bench.expected, found, left)
    rows = bench.main_data.row_count
    bench.results["naive"] = {
        **meter.as_dict(),
        "counters": counters,
        "rows": rows,
        "rows_per_s": round(rows / meter.seconds),
        "exactness": exactness.as_dict(),
    }
    bench.say(f"naive peer: {meter.seconds:.1f} s ({rows / meter.seconds:,.0f} rows/s)")


def warm_up(bench: Bench) -> None:
    """Two compactions of the same size, on their own family, before the scan floor and the
    measured runs: a first run (a sweep) and its next run (not a sweep, over the first's
    tombstones, ledger rows and compact rows), as section 3 measures them. Both measured
    runs then meet a node that has worked that way before, as one in service has. A node
    just started compiles its read, Paxos and batch paths (JIT) during its first big runs:
    10 of the node's 35 CPU-s in the first 1M-row run after a start, 7 in the second, 1.3
    in a later one; after a warm-up of a first run only, the next run still compiled 4-5
    CPU-s of paths no first run takes. The warm-up's figures are reported beside the
    measured runs'."""
    n = bench.p.counters if bench.p.warmup_counters is None else bench.p.warmup_counters
    if n < 1:
        return
    t0 = (utc_now() - timedelta(days=2)).replace(second=0, microsecond=0)
    data = Dataset("w", n, bench.p.rows_per_counter, t0)
    later = data.next_round()
    family, _store, client = bench.make_family("bench_warmup", **sweeping_far_away())
    figures = {}
    for label, round_ in (("warm-up", data), ("warm-up next run", later)):
        load_write_path(client, round_)
        run = bench.compact(family, round_.epoch, label)
        sweep = (run.get("summary") or {}).get("sweep")
        figures[label] = {
            "rows": round_.row_count,
            "ok": run["ok"],
            "sweep": sweep,
            "seconds": round(run["seconds"], 3),
            **cpu_figures(run),
        }
        bench.say(f"{label}: {round_.row_count:,} rows compacted in {run['seconds']:.1f} s")
    # Its memtables (and its Paxos state) written out now, and compacted before the scan
    # floor: left in memory, the measured runs' writes filled the commit log, which flushed
    # them in the middle of the first run, and the node compacted them there.
    flushed = [
        flush_tables(family.keyspace, family_tables(family), bench.local_instance),
        flush_tables("system", ["paxos"], bench.local_instance),
    ]
    bench.say("; ".join(flushed))
    bench.results["warmup"] = {
        **figures["warm-up"],
        "next_run": figures["warm-up next run"],
        "flushed": flushed,
    }


def compaction(bench: Bench) -> None:
    data, family = bench.main_data, bench.main_family
    run = bench.compact(family, data.epoch, "compaction", profile=bench.p.profile)
    with Meter(bench.server) as compact_scan:
        found = scan_values(bench.conn, bench.keyspace, family.compact_table, ["type"], "value")
    with Meter(bench.server) as tombstone_scan:  # the raw table now holds only tombstones
        left = count_rows(bench.conn, bench.keyspace, family.raw_table, ["type"])
    exactness = compare(bench.expected, found, left)
    sweep = _sweep_after_fold(bench, family)
    sample = list(bench.expected)[:200]
    read_rule_ok = all(
        v.value == bench.expected[v.counter] for v in bench.main_client.read_many(sample)
    )
    summary = run.get("summary") or {}
    rows = data.row_count
    seconds = run["seconds"]
    bench.results["compaction"] = {
        "ok": run["ok"],
        "error": run["error"],
        "seconds": round(seconds, 3),
        "rows": rows,
        "counters": data.counters,
        "rows_per_s": round(rows / seconds) if run["ok"] else None,
        "seconds_per_1M_rows": round(seconds * 1_000_000 / rows, 1),
        **cpu_figures(run),
        "loadavg_1m_after": run["loadavg_1m_after"],
        "process_seconds": run["process_seconds"],
        "phases_s": summary.get("durations_s"),
        "tally": {
            k: summary.get(k)
            for k in (
                "counters_committed",
                "rows_folded",
                "sum_folded",
                "rows_deleted",
                "conflicts",
                "late_rows",
            )
        },
        "tally_matches": summary.get("rows_folded") == rows
        and summary.get("sum_folded") == sum(bench.expected.values())
        and summary.get("rows_deleted") == rows,
        "requests": run.get("requests"),
        "requests_per_counter": round(sum((run.get("requests") or {}).values()) / data.counters, 2),
        "rss_peak_kb": run["rss_peak_kb"],
        "rss_before_kb": run["rss_before_kb"],
        "marks_age_s": run["marks_age_s"],
        "exactness": exactness.as_dict(),
        "scan_compact_table_after_s": round(compact_scan.seconds, 3),
        "scan_raw_tombstones_after_s": round(tombstone_scan.seconds, 3),
        "read_rule_sample_exact": read_rule_ok,
        "scan_discovery_after_fold": sweep,
        "profile": run.get("profile"),
        "sweep": summary.get("sweep"),
    }
    bench.say(
        f"compaction: {seconds:.1f} s ({rows / seconds:,.0f} rows/s), exact={exactness.exact}"
    )
    bench.results["compaction"]["next_run"] = _next_run(bench)


def _next_run(bench: Bench) -> dict[str, Any]:
    """The family's next run, as a minute's run in service is: as many increments again on
    every counter, folded by a run that is not a sweep (the measured run above is the
    family's first, which sweeps: it reads every bucket whole; a minute's run reads its
    touched counters, by name or by range as its buckets' populations say)."""
    data, family = bench.main_data, bench.main_family
    later = data.next_round()
    bench.say(f"next run: loading {later.row_count:,} more rows on the same counters")
    load_write_path(bench.main_client, later)
    bench.marks_at[family.name] = time.time()
    expected = {
        later.key(i): bench.expected[later.key(i)] + later.total(i) for i in later.indexes()
    }
    run = bench.checked_run("next run", family, later.epoch, expected)
    bench.say(
        f"next run: {run['seconds']:.1f} s, sweep={run['sweep']}, exact={run['exactness']['exact']}"
    )
    return {**run, "rows": later.row_count}


def _sweep_after_fold(bench: Bench, family: Family) -> dict[str, Any]:
    """``discovery: scan`` (the sweep) on the family just folded: ``Store.raw.scan_counters``
    per shard, over a raw table that now holds one tombstone per folded row."""
    store = Store(bench.conn, family.model_copy(update={"discovery": "scan"}))
    try:
        with Meter(bench.server) as meter:
            found = sum(len(store.raw.scan_counters(s)) for s in range(family.shards))
    except Exception as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    return {"ok": True, "seconds": round(meter.seconds, 3), "counters_found": found}
