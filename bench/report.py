"""The bench's report: ratios against the targets, the table on stdout, and the JSON file,
which is never written over (a run that finds its file there writes a new one)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .params import RESULTS_DIR, SECTIONS
from .required import STEPS as REQUIRED_STEPS

TARGETS = {
    "compaction_over_scan_floor": ("<=", 8.0),
    "naive_over_compaction": (">=", 10.0),
    "idle_heavy_over_active_only": ("<=", 1.2),
    "p99_compacted_over_fresh": ("<=", 1.5),
    "compaction_seconds_per_1M_rows": ("<=", 20.0),
    "dag_parse_s_100_families": ("<", 1.0),
    "archive_over_plain": ("<=", 1.15),
}
"""Issue #12's targets: a 1M-row compaction in at most 20 s on 2 cores (stretch 10 s), at least
10x faster than the naive peer, at most 8x the time of reading every row once; and issue #35's:
the 1M-row run with the archive of deleted rows on costs at most 15 % more than without it."""


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


# --- ratios, targets, report -------------------------------------------------------------------


def ratios(results: dict[str, Any]) -> dict[str, float | None]:
    scan = results.get("scan_floor") or {}
    naive = results.get("naive") or {}
    comp = results.get("compaction") or {}
    later = comp.get("next_run") or {}
    idle = results.get("idle") or {}
    reads = (results.get("read_latency") or {}).get("counters") or {}
    parse = ((results.get("dag_parse") or {}).get("sizes") or {}).get("100") or {}
    active = (idle.get("active_only") or {}).get("seconds")
    required = (results.get("required") or {}).get("total") or {}
    out = {
        # how many times longer than reading every raw row once
        "compaction_over_scan_floor": _ratio(scan.get("rows_per_s"), comp.get("rows_per_s")),
        "next_run_over_scan_floor": _ratio(
            later.get("seconds") if later.get("ok") else None, scan.get("seconds")
        ),
        "naive_over_compaction": _ratio(naive.get("seconds"), comp.get("seconds")),
        # the design's own floor: the steps its guarantees require, without the engine's logic
        "required_over_scan_floor": _ratio(required.get("seconds"), scan.get("seconds")),
        "required_cpu_over_scan_floor_cpu": _ratio(_cpu_sum(required), _cpu_sum(scan)),
        # what the engine's own logic adds to it, in CPU (the steps run in one process, the
        # engine's shards in two: their wall times do not compare)
        "compaction_cpu_over_required_cpu": _ratio(
            _cpu_sum(comp) if comp.get("ok") else None, _cpu_sum(required)
        ),
        "idle_heavy_over_active_only": _ratio(
            (idle.get("idle_heavy") or {}).get("seconds"), active
        ),
        "idle_heavy_recent_over_active_only": _ratio(
            (idle.get("idle_heavy_recent_forgets") or {}).get("seconds")
            if (idle.get("idle_heavy_recent_forgets") or {}).get("ok")
            else None,
            active,
        ),
        "p99_compacted_over_fresh": _ratio(
            (reads.get("compacted") or {}).get("p99_ms"), (reads.get("fresh") or {}).get("p99_ms")
        ),
        "p99_uncompacted_over_fresh": _ratio(
            (reads.get("uncompacted") or {}).get("p99_ms"),
            (reads.get("fresh") or {}).get("p99_ms"),
        ),
        "compaction_seconds_per_1M_rows": comp.get("seconds_per_1M_rows")
        if comp.get("ok")
        else None,
        "dag_parse_s_100_families": parse.get("parse_s"),
        "archive_over_plain": (results.get("archive") or {}).get("archive_over_plain"),
        "archive_cpu_over_plain_cpu": (results.get("archive") or {}).get("cpu_archive_over_plain"),
    }
    return {k: None if v is None else round(v, 4) for k, v in out.items()}


def _cpu_sum(figures: dict[str, Any]) -> float | None:
    """Client and node CPU seconds of a step (None when the node's is unknown)."""
    client, node = figures.get("client_cpu_s"), figures.get("server_cpu_s")
    return None if client is None or node is None else client + node


def targets(rat: dict[str, float | None]) -> dict[str, dict[str, Any]]:
    out = {}
    for name, (op, goal) in TARGETS.items():
        value = rat.get(name)
        met = None
        if value is not None:
            met = value >= goal if op == ">=" else value <= goal if op == "<=" else value < goal
        out[name] = {"target": f"{op} {goal:g}", "value": value, "met": met}
    return out


def _fmt(value: Any, unit: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        text = f"{value:,.3f}" if abs(value) < 10 else f"{value:,.1f}"
    elif isinstance(value, int):
        text = f"{value:,}"
    else:
        text = str(value)
    return f"{text}{unit}"


def _cpu(measured: dict[str, Any]) -> str:
    """A measurement's client and node CPU seconds, as the table shows them."""
    return (
        f"cpu client {_fmt(measured['client_cpu_s'])} s server {_fmt(measured['server_cpu_s'])} s"
    )


def _run_cells(measured: dict[str, Any]) -> tuple[str, ...]:
    """A whole run's cells: time, rows/s, exactness and CPU."""
    return (
        _fmt(measured["seconds"], " s"),
        _fmt(measured["rows_per_s"], " rows/s"),
        f"exact={measured['exactness']['exact']}",
        _cpu(measured),
    )


def table(report: dict[str, Any]) -> str:
    r = report["results"]
    lines: list[str] = []

    def row(name: str, *cells: Any) -> None:
        lines.append(f"  {name:<44} " + "  ".join(str(c) for c in cells))

    lines.append(f"counters bench — {report['started_at']} — {report['machine']['cpus']} cores")
    load = r.get("load")
    if load:
        wp = load["write_path"]
        lines.append(
            f"data set: {load['counters']:,} counters x "
            f"{load['rows'] // max(load['counters'], 1)} rows = {load['rows']:,} raw rows"
        )
        row(
            "load via CounterClient.record",
            _fmt(wp["seconds"], " s"),
            _fmt(wp["rows_per_s"], " rows/s"),
        )
        if "twin_bulk" in load:
            row(
                "load naive twin (bulk batches)",
                _fmt(load["twin_bulk"]["seconds"], " s"),
                _fmt(load["twin_bulk"]["rows_per_s"], " rows/s"),
            )
    if "scan_floor" in r:
        s = r["scan_floor"]
        row(
            "1. scan floor (token ranges, paged)",
            _fmt(s["seconds"], " s"),
            _fmt(s["rows_per_s"], " rows/s"),
            _cpu(s),
        )
    if "required" in r:
        s = r["required"]
        total = s["total"]
        row(
            "1b. required work (engine primitives only)",
            _fmt(total["seconds"], " s"),
            f"complete={s['complete']}",
            _cpu(total),
        )
        row(
            "   steps (s, cpu client/server)",
            ", ".join(
                f"{k} {_fmt(s[k]['seconds'])} ({_fmt(s[k]['client_cpu_s'])}/"
                f"{_fmt(s[k]['server_cpu_s'])})"
                for k in REQUIRED_STEPS
                if k in s
            ),
        )
    if "naive" in r:
        row("2. naive peer (sync, per counter)", *_run_cells(r["naive"]))
    if "compaction" in r:
        s = r["compaction"]
        row("3. compaction (engine.run_family)", *_run_cells(s))
        if s.get("phases_s"):
            row("   phases", ", ".join(f"{k} {v:.1f}" for k, v in s["phases_s"].items()))
        if s.get("server_cpu_by_thread_s"):
            threads = list(s["server_cpu_by_thread_s"].items())[:6]
            row("   node CPU by thread", ", ".join(f"{k} {v:.1f} s" for k, v in threads))
        warm = r.get("warmup") or {}
        for label, w in (("run before it", warm), ("next run", warm.get("next_run"))):
            if w:
                row(
                    f"   warm-up {label} (same size)",
                    f"{w['rows']:,} rows in {_fmt(w['seconds'], ' s')}, sweep={w.get('sweep')}",
                    _cpu(w),
                )
        requests = s.get("requests") or {}
        row(
            "   requests",
            f"{sum(requests.values()):,} in all ({_fmt(s['requests_per_counter'])} per counter): "
            + ", ".join(f"{k} {v:,}" for k, v in requests.items()),
        )
        sweep = s.get("scan_discovery_after_fold") or {}
        if sweep:
            row(
                "   sweep (discovery: scan) after the fold",
                _fmt(sweep.get("seconds"), " s") if sweep["ok"] else f"FAILED: {sweep['error']}",
            )
        later = s.get("next_run") or {}
        if later:
            row(
                f"   next run (sweep={later['sweep']}), {later['rows']:,} more rows",
                _fmt(later["seconds"], " s") if later["ok"] else f"FAILED: {later['error']}",
                f"exact={later['exactness']['exact']}",
                _cpu(later),
            )
            requests = later.get("requests") or {}
            row("   its requests", ", ".join(f"{k} {v:,}" for k, v in requests.items()))
        if s.get("error"):
            row("   error", s["error"][:200])
    if "idle" in r:
        for name, s in r["idle"].items():
            row(
                f"4. {name} ({s['counters_in_table']:,} counters)",
                _fmt(s["seconds"], " s") if s["ok"] else f"FAILED: {(s['error'] or '')[:120]}",
                f"exact={s['exactness']['exact']}",
                f"rss {_fmt(s['rss_peak_kb'] // 1024, ' MiB')}",
            )
    if "archive" in r:
        a = r["archive"]
        for side in ("off", "on"):
            for n, s in enumerate(a[side]):
                extra = (
                    f"{s['archive_files']} files, {s['archived_rows']:,} rows once="
                    f"{s['archived_once']} recount={s['recount_sample_equal']}"
                    if side == "on" and "archive_files" in s
                    else ""
                )
                row(
                    f"9. archive {side}, round {n} ({a['rows']:,} rows)",
                    _fmt(s["seconds"], " s") if s["ok"] else f"FAILED: {(s['error'] or '')[:120]}",
                    f"exact={s['exactness']['exact']}",
                    _cpu(s),
                    extra,
                )
        row(
            "   archive on / off (medians)",
            _fmt(a["archive_over_plain"]),
            f"cpu {_fmt(a['cpu_archive_over_plain'])}",
        )
    if "read_latency" in r:
        for name, s in r["read_latency"]["counters"].items():
            row(
                f"5. read {name}",
                f"p50 {_fmt(s['p50_ms'], ' ms')}",
                f"p99 {_fmt(s['p99_ms'], ' ms')}",
                f"exact={s['value_exact']}",
            )
        for name, s in (r["read_latency"].get("fold_read_rows") or {}).items():
            row(
                f"   fold read (Store.raw.read_rows) {name}",
                f"p50 {_fmt(s['p50_ms'], ' ms')}",
                f"p99 {_fmt(s['p99_ms'], ' ms')}",
            )
    if "limits" in r:
        lim = r["limits"]
        for n, fold in enumerate(lim["folds"]):
            row(
                f"limit: hot counter ({lim['hot_counter_rows']:,} rows), run {n + 1}",
                f"{_fmt(fold['seconds'], ' s')}, read by parts: {fold.get('windowed_reads')}"
                if fold["ok"]
                else f"FAILED in {fold['failed_in']}: {fold['error'][:120]}",
            )
        row("limit: hot counter read", f"exact={lim['read_exact']}")
    for run in (r.get("scaling") or {}).get("runs", []):
        row(
            f"   scaling: {run['rows']:,} rows",
            _fmt(run["seconds"], " s") if run["ok"] else f"FAILED: {run['error']}",
            f"exact={run['exact']}",
            _cpu(run),
            f"requests {run['requests']:,}",
            f"rss {_fmt(run['peak_rss_mib'], ' MiB')}",
        )
    steady = r.get("steady") or {}
    for run in steady.get("rounds", []):
        row(
            f"   steady: round {run['round']} ({steady['rows_per_round']:,} rows, "
            f"{run['tombstones_per_counter_before']} tombstones/counter)",
            _fmt(run["seconds"], " s") if run["ok"] else f"FAILED: {run['error']}",
            f"exact={run['exact']} sweep={run['sweep']}",
            _cpu(run),
        )
    if "probes" in r:
        probes = {
            **r["probes"]["commit"],
            **r["probes"].get("fold_io", {}),
            **r["probes"].get("nagle", {}),
        }
        for name, s in probes.items():
            if isinstance(s, dict):
                row(
                    f"probe {name}",
                    _fmt(s["rows_per_s"], " rows/s")
                    + (f" ({s['ms_per_request']} ms each)" if "ms_per_request" in s else ""),
                    _cpu(s),
                )
    if "dag_parse" in r:
        d = r["dag_parse"]
        if d["status"] != "measured":
            row("6. DAG parse", f"{d['status']} ({d['path']})")
        for n, s in d["sizes"].items():
            if s is None:
                continue
            if "error" in s:
                row(f"6. DAG parse, {n} families", f"ERROR {s['error'][:160]}")
                continue
            row(
                f"6. DAG parse, {n} families",
                _fmt(s["parse_s"], " s"),
                f"{s['dags']} dags",
                f"{len(s['import_errors'])} import errors",
                f"(airflow import {_fmt(s['import_airflow_s'], ' s')})",
            )
    if "compaction" in r:
        row(
            "7. peak RSS of the compaction process",
            _fmt(r["compaction"]["rss_peak_kb"] // 1024, " MiB"),
        )
    if "kinds" in r:
        for name, k in r["kinds"].items():
            row(
                f"kind {name}",
                _fmt(k["compaction_rows_per_s"], " rows/s"),
                f"p99 compacted {_fmt(k['read_p99_compacted_ms'], ' ms')}",
                f"fresh {_fmt(k['read_p99_fresh_ms'], ' ms')}",
                f"ratio {_fmt(k['p99_compacted_over_fresh'])}",
                f"exact={k['exact']}",
                k["note"],
            )
    if "audit" in r:
        a = r["audit"]
        for layout, stats in a["tablestats"].items():
            row(
                f"8. audit, {a['rows']:,} rows: {layout}",
                f"{_fmt(stats.get('partitions'))} partition(s)",
                f"max {_fmt(stats.get('partition_max_bytes'), ' B')}",
                f"mean {_fmt(stats.get('partition_mean_bytes'), ' B')}",
            )
        row(
            "8. audit family page (health + 60 rows)",
            f"newest {_fmt(a['family_page_newest']['median_s'], ' s')}",
            f"6 months back {_fmt(a['family_page_six_months_back']['median_s'], ' s')}",
        )
        for fmt, e in a["export"].items():
            row(
                f"8. audit export of {a['month_exported']} ({fmt})",
                _fmt(e["median_s"], " s"),
                f"{e['result']['rows']:,} rows",
                f"{_fmt(e['rows_per_s'], ' rows/s')}",
                f"{e['result']['bytes']:,} B",
            )
    lines.append("ratios and targets:")
    for name, t in report["targets"].items():
        mark = {True: "met", False: "MISSED", None: "-"}[t["met"]]
        row(name, _fmt(t["value"]), t["target"], mark)
    extra = report["ratios"]
    for name in ("idle_heavy_recent_over_active_only", "p99_uncompacted_over_fresh"):
        row(name, _fmt(extra.get(name)))
    if r.get("errors"):
        lines.append("errors: " + json.dumps(r["errors"]))
    return "\n".join(lines)


# --- the result file --------------------------------------------------------------------------


def stamp(started: datetime) -> str:
    """A run's start time as the head of its file name: UTC, no colons, sorts as runs started."""
    return started.astimezone(UTC).strftime("%Y-%m-%dT%H%M%SZ")


def result_name(started: datetime, commit: str | None, sections: Sequence[str]) -> str:
    """``<start>-<commit>-<sections>.json``: the name a run's file keeps in bench/results."""
    label = "all" if set(sections) == set(SECTIONS) else "-".join(sections)
    return f"{stamp(started)}-{commit or 'nocommit'}-{label}.json"


def result_path(started: datetime, commit: str | None, sections: Sequence[str]) -> Path:
    return RESULTS_DIR / result_name(started, commit, sections)


def write_new(path: Path, report: dict[str, Any], started: datetime) -> Path:
    """Write ``report`` to a file that was not there: ``path``, or, when a file appeared there
    during the run, ``path`` with the start time (and a number) added. A result is never written
    over: one kept result was once replaced in place by a later run."""
    text = json.dumps(report, indent=2, default=str) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    named = [path, path.with_name(f"{path.stem}-{stamp(started)}{path.suffix}")]
    named += [
        path.with_name(f"{path.stem}-{stamp(started)}-{n}{path.suffix}") for n in range(2, 100)
    ]
    for candidate in named:
        try:
            with candidate.open("x") as out:  # "x": fails if the file exists, never truncates
                out.write(text)
        except FileExistsError:
            continue
        if candidate != path:
            print(
                f"{path} appeared during the run: the results went to {candidate}", file=sys.stderr
            )
        return candidate
    raise FileExistsError(f"{path}: it and {len(named) - 1} new names beside it are taken")
