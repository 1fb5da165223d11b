"""``python -m bench``: compaction against the scan floor and the naive seed algorithm,
idle-heavy tables, read latency, DAG parse time and peak memory, side by side in one run.

Every figure comes from this run on this node (compare ratios, not absolute times: the machine
is shared and noisy). The JSON report holds every figure (``--out``, by default
``var/bench/<start>-<commit>-<sections>.json``; never written over); a table goes to stdout.
All tables live in one throw-away keyspace that is dropped at the end (``--keep`` keeps it).

One module per section, each a function of the running ``bench.harness.Bench``:
``bench.mainset`` (scan, required, naive, compaction, on the main data set), ``bench.scaling``,
``bench.steady``, ``bench.idle``, ``bench.reads``, ``bench.limits``, ``bench.probes``,
``bench.dags``, ``bench.kinds``, ``bench.audit`` (the audit trail after a year of minute runs),
``bench.archive`` (the 1M-row run with the archive of deleted rows on and off). This module
orders them; ``bench.params`` reads the command line, ``bench.report`` writes the results.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from counters.connection import connect

from . import archive as bench_archive
from . import audit as bench_audit
from . import dags as bench_dags
from . import idle, kinds, limits, mainset, probes, reads, scaling, steady
from .harness import Bench
from .ops import code_state, machine
from .params import parse_args
from .report import ratios, result_path, table, targets, write_new

Section = Callable[[Bench], None]


def _dags(bench: Bench) -> None:
    bench.say(f"DAG parse time for {list(bench.p.families)} families")
    bench.results["dag_parse"] = bench_dags.measure(
        list(bench.p.families), repeats=bench.p.dag_repeats
    )


def _audit(bench: Bench) -> None:
    bench.results["audit"] = bench_audit.run(
        bench, bench.p.audit_minutes, 1 if bench.p.smoke else 5
    )


def _archive(bench: Bench) -> None:
    bench.results["archive"] = bench_archive.run(bench, max(1, bench.p.archive_rounds))


SECTION_STEPS: tuple[tuple[str, Section], ...] = (
    ("scan", mainset.scan_floor),
    ("required", mainset.required),
    ("naive", mainset.naive),
    ("compaction", mainset.compaction),
    ("scaling", scaling.scaling),
    ("steady", steady.steady),
    ("idle", idle.idle),
    ("reads", reads.reads),
    ("limits", limits.limits),
    ("probes", probes.probes),
    ("dags", _dags),
    ("kinds", kinds.kinds),
    ("audit", _audit),
    ("archive", _archive),
)
"""Every section in the order it runs (``params.SECTIONS`` names the same ones)."""


def steps(only: tuple[str, ...]) -> list[tuple[str, Section]]:
    """The steps of a run of the sections ``only``: the loads and warm-ups they need first."""
    chosen: list[tuple[str, Section]] = []
    if {"scan", "required", "naive", "compaction"} & set(only):
        chosen.append(("load", mainset.prepare_main))
    if {"required", "compaction", "archive"} & set(only):  # before the scan floor: warm
        chosen.append(("warmup", mainset.warm_up))
    if "idle" in only:  # loaded early: the naive peer's minutes let the index marks age
        chosen.append(("idle_setup", idle.prepare_idle))
    chosen += [(name, func) for name, func in SECTION_STEPS if name in only]
    return chosen


def run_sections(bench: Bench) -> None:
    """Every chosen step in order; a failed one is recorded in ``errors`` and the next runs."""
    bench.conn.session.execute(
        f"CREATE KEYSPACE IF NOT EXISTS {bench.keyspace} WITH replication = "
        "{'class': 'SimpleStrategy', 'replication_factor': 1}"
    )
    for name, func in steps(bench.p.only):
        started = time.perf_counter()
        try:
            func(bench)
        except Exception as exc:
            bench.say(f"section {name} failed: {type(exc).__name__}: {exc}")
            bench.results.setdefault("errors", {})[name] = f"{type(exc).__name__}: {exc}"
        bench.results.setdefault("section_seconds", {})[name] = round(
            time.perf_counter() - started, 1
        )


def _terminate(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # run the finally blocks: drop the bench keyspace


def main(argv: list[str] | None = None) -> int:
    params = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    started = datetime.now(UTC)
    code = code_state()
    if params.out is None:
        params.out = result_path(started, code["commit"], params.only)
    report: dict[str, Any] = {
        "started_at": started.isoformat(timespec="seconds"),
        "command": "python -m bench " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": machine(),
        "code": code,
        "params": {k: str(v) if isinstance(v, Path) else v for k, v in params.__dict__.items()},
    }
    needs_cassandra = set(params.only) - {"dags"}
    bench = None
    conn = connect() if needs_cassandra else None
    try:
        if conn is not None:
            report["cassandra"] = {
                "hosts": list(conn.settings.hosts),
                "port": conn.settings.port,
                "release_version": conn.session.execute(
                    "SELECT release_version FROM system.local"
                ).one()[0],
            }
            bench = Bench(params, conn)
            report["keyspace"] = bench.keyspace
            run_sections(bench)
            results = bench.results
        else:
            results = {}
            if "dags" in params.only:
                results["dag_parse"] = bench_dags.measure(
                    list(params.families), repeats=params.dag_repeats
                )
    finally:
        if bench is not None and not params.keep:
            bench.drop()
        if conn is not None:
            conn.close()
    report["results"] = results
    report["ratios"] = ratios(results)
    report["targets"] = targets(report["ratios"])
    report["total_seconds"] = round((datetime.now(UTC) - started).total_seconds(), 1)
    written = write_new(params.out, report, started)
    print(table(report))
    print(f"JSON: {written}")
    return 1 if results.get("errors") else 0


if __name__ == "__main__":
    sys.exit(main())
