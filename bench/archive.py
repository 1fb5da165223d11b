"""The ``archive`` section: what the archive of deleted rows costs a run (issue #35, part 4).

Two families of the same layout, one without an archive and one with (a local folder under the
report's, removed afterwards), each loaded with the same rows (``--counters`` x
``--rows-per-counter``, 1M by default) through ``CounterClient.record`` and compacted by its
first run (a sweep, the measured run of section 3) in the worker process, once the node is
quiet. ``--archive-rounds`` pairs, in alternate order (off then on, on then off, ...), each on
fresh counters (the families' tables emptied in between): the ratio of the medians is
``archive_over_plain`` (target: at most 1.15). Each run is checked exact (every compact value,
no raw row left), and each archived one has every row in its files once, with a sample of its
counters recounted from them.
"""

from __future__ import annotations

import shutil
import statistics
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from counters.recount import recount

from .ops import Dataset, load_write_path, sweeping_far_away, utc_now

RECOUNT_SAMPLE = 200


def run(bench: Any, rounds: int) -> dict[str, Any]:
    p = bench.p
    root = bench.out_dir / f"archive-{bench.keyspace}"
    sides = {
        "off": bench.make_family("bench_archive_off", **sweeping_far_away()),
        "on": bench.make_family("bench_archive_on", archive=str(root), **sweeping_far_away()),
    }
    figures: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    try:
        for n in range(rounds):
            t0 = (utc_now() - timedelta(days=2)).replace(second=0, microsecond=0)
            data = Dataset(f"a{n}_", p.counters, p.rows_per_counter, t0)
            for side, (family, _store, client) in sides.items():
                if n:
                    bench.reset_family(family)
                    shutil.rmtree(root / family.name, ignore_errors=True)
                bench.say(f"archive {side}: loading {data.row_count:,} rows")
                load_write_path(client, data)
                bench.marks_at[family.name] = time.time()
            order = ("off", "on") if n % 2 == 0 else ("on", "off")
            started = datetime.now(UTC)
            for side in order:
                family, store, _client = sides[side]
                label = f"archive {side} round {n}"
                result = bench.checked_run(label, family, data.epoch, data.expected())
                result["order"] = order.index(side)
                if side == "on":
                    result.update(_archived(family, store, data, started))
                figures[side].append(result)
                bench.say(
                    f"{label}: {result['seconds']:.1f} s, exact={result['exactness']['exact']}"
                )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    off = [r["seconds"] for r in figures["off"] if r["ok"]]
    on = [r["seconds"] for r in figures["on"] if r["ok"]]
    cpu_off = [_cpu(r) for r in figures["off"] if r["ok"]]
    cpu_on = [_cpu(r) for r in figures["on"] if r["ok"]]
    median_off = statistics.median(off) if off else None
    median_on = statistics.median(on) if on else None
    return {
        "rows": p.counters * p.rows_per_counter,
        "counters": p.counters,
        "rounds": rounds,
        "off": figures["off"],
        "on": figures["on"],
        "median_off_s": median_off,
        "median_on_s": median_on,
        "archive_over_plain": round(median_on / median_off, 3)
        if median_on and median_off
        else None,
        "cpu_archive_over_plain": round(statistics.median(cpu_on) / statistics.median(cpu_off), 3)
        if cpu_on and cpu_off and statistics.median(cpu_off)
        else None,
    }


def _cpu(result: dict[str, Any]) -> float:
    return (result.get("client_cpu_s") or 0) + (result.get("server_cpu_s") or 0)


def _archived(family: Any, store: Any, data: Dataset, since: datetime) -> dict[str, Any]:
    """What the archived run left: its files, their rows (each once, all of them), and a sample
    of its counters recounted from them."""
    root = Path(family.archive) / family.name
    paths = sorted(root.rglob("*.parquet"))
    rows = 0
    keys: set[tuple[Any, ...]] = set()
    for path in paths:
        table = pq.read_table(path, columns=["type", "modify_time", "version"])
        rows += table.num_rows
        if len(keys) < 2_000_000:
            keys.update(zip(*(table.column(i).to_pylist() for i in range(3)), strict=True))
    sample = [data.key(i) for i in list(data.indexes())[:RECOUNT_SAMPLE]]
    report = recount(store, sample, since=since)  # this round's runs: earlier rounds' are gone
    return {
        "archive_files": len(paths),
        "archive_bytes": sum(p.stat().st_size for p in paths),
        "archived_rows": rows,
        "archived_once": rows == len(keys) == data.row_count,
        "recount_sample": len(sample),
        "recount_sample_equal": report.ok,
    }
