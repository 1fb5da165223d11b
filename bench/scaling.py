"""The ``scaling`` section: the same compaction at several sizes (``--scale``)."""

from __future__ import annotations

from datetime import timedelta

from .harness import Bench, cpu_figures
from .ops import (
    Dataset,
    compare,
    count_rows,
    load_twin,
    scan_values,
    utc_now,
)


def scaling(bench: Bench) -> None:
    """The same compaction at several sizes, each on freshly (bulk) loaded data: how time,
    CPU, requests and peak memory grow with the rows."""
    t0 = (utc_now() - timedelta(days=1)).replace(second=0, microsecond=0)
    runs = []
    for counters in bench.p.scale:
        data = Dataset(f"s{counters}", counters, bench.p.rows_per_counter, t0)
        family, _store, _client = bench.make_family(f"bench_scale_{counters}")
        bench.say(f"scaling: loading {data.row_count:,} rows")
        load_twin(bench.conn, bench.keyspace, family.raw_table, data)
        run = bench.compact(family, data.epoch, f"scale-{counters}")
        found = scan_values(bench.conn, bench.keyspace, family.compact_table, ["type"], "value")
        left = count_rows(bench.conn, bench.keyspace, family.raw_table, ["type"])
        exact = compare(data.expected(), found, left)
        requests = run.get("requests") or {}
        runs.append(
            {
                "counters": counters,
                "rows": data.row_count,
                "ok": run["ok"],
                "error": run["error"],
                "seconds": round(run["seconds"], 3),
                **cpu_figures(run),
                "requests": sum(requests.values()),
                "peak_rss_mib": round(run["rss_peak_kb"] / 1024, 1),
                "exact": exact.exact,
            }
        )
        bench.say(f"scaling {data.row_count:,} rows: {run['seconds']:.1f} s, exact={exact.exact}")
        bench.reset_family(family)
    bench.results["scaling"] = {"runs": runs}
