"""The bench's command line: its sections, sizes and flags (``python -m bench --help``)."""

from __future__ import annotations

import argparse
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from .kinds import KINDS

SECTIONS = (
    "scan",
    "required",
    "naive",
    "compaction",
    "scaling",
    "steady",
    "idle",
    "reads",
    "limits",
    "probes",
    "dags",
    "kinds",
    "audit",
    "archive",
)
PROJECT_ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = PROJECT_ROOT / "var" / "bench"
"""Where a run's JSON goes without ``--out`` (git-ignored; the kept ones are in bench/results)."""


@dataclass
class Params:
    scale: tuple[int, ...] = (10_000, 100_000, 300_000)
    """Counters (x ``rows_per_counter``) of each compaction in the scaling section."""
    counters: int = 100_000
    rows_per_counter: int = 10
    idle_counters: int = 1_000_000
    active_counters: int = 10_000
    history_minutes: int = 1440
    reads: int = 2000
    families: tuple[int, ...] = (1, 10, 100)
    only: tuple[str, ...] = SECTIONS
    smoke: bool = False
    out: Path | None = None
    """The JSON report, a new file (None: ``var/bench/<start>-<commit>-<sections>.json``)."""
    keep: bool = False
    profile: bool = False
    node_profile: bool = False
    """A JFR recording of the local node over each compaction, summarized by kind of work."""
    scan_ranges: int = 64
    scan_concurrency: int = 16
    scan_repeats: int = 3
    wait_marks: bool = True
    dag_repeats: int = 3
    hot_rows: int = 110_000
    workers: int = 2
    kinds: tuple[str, ...] = ()
    steady_counters: int = 20_000
    steady_rounds: int = 20
    audit_minutes: int = 525_600
    """Audit rows of the ``audit`` section: a row a minute for a year."""
    archive_rounds: int = 2
    """Pairs of runs (archive off and on, in alternate order) of the ``archive`` section."""
    warmup_counters: int | None = None
    """Counters (x ``rows_per_counter``) of the warm-up compaction before the measured one
    (None: as many as the measured one; 0: none; see ``mainset.warm_up``)."""


def parse_args(argv: list[str] | None) -> Params:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    p.add_argument("--counters", type=int, help="counters in the main data set (100000)")
    p.add_argument("--rows-per-counter", type=int, help="increments per counter (10)")
    p.add_argument("--idle-counters", type=int, help="counters in the idle-heavy table (1000000)")
    p.add_argument("--active-counters", type=int, help="of which active since last run (10000)")
    p.add_argument("--history-minutes", type=int, help="per-minute history of read counters (1440)")
    p.add_argument("--reads", type=int, help="timed reads per read-latency counter (2000)")
    p.add_argument("--hot-rows", type=int, help="rows of the one hot counter in 'limits' (110000)")
    p.add_argument("--steady-counters", type=int, help="counters of the 'steady' family (20000)")
    p.add_argument("--steady-rounds", type=int, help="runs of the 'steady' family (20)")
    p.add_argument("--families", help="DAG parse sizes, comma separated (1,10,100)")
    p.add_argument("--only", action="append", choices=SECTIONS, help="run only these sections")
    p.add_argument("--smoke", action="store_true", help="tiny sizes (CI): seconds, not minutes")
    p.add_argument(
        "--out",
        type=Path,
        help="JSON report, a new file (var/bench/<start>-<commit>-<sections>.json); "
        "an existing one is refused",
    )
    p.add_argument("--keep", action="store_true", help="do not drop the bench keyspace")
    p.add_argument(
        "--profile",
        action="store_true",
        help="pyinstrument profile of the compaction's main thread (its bucket threads and shard "
        "processes are not sampled); needs pyinstrument in .venv",
    )
    p.add_argument(
        "--node-profile",
        action="store_true",
        help="JFR recording of the local node over each compaction (bench.nodeprofile)",
    )
    p.add_argument("--scan-ranges", type=int)
    p.add_argument("--scan-concurrency", type=int)
    p.add_argument(
        "--no-wait", action="store_true", help="do not let index marks age (docs/benchmarks.md)"
    )
    p.add_argument("--workers", type=int, help="shard processes of each compaction (2)")
    p.add_argument(
        "--warmup-counters",
        type=int,
        help="counters of the warm-up compaction before the measured one (as --counters; 0: none)",
    )
    p.add_argument(
        "--scale", help="counters per scaling run, comma separated (10000,100000,300000)"
    )
    p.add_argument("--kind", action="append", choices=sorted(KINDS), help="kind lines to run (all)")
    p.add_argument(
        "--audit-minutes", type=int, help="audit rows of 'audit', a minute each (525600)"
    )
    p.add_argument(
        "--archive-rounds",
        type=int,
        help="pairs of runs of 'archive' (off and on, alternate order) (2)",
    )
    a = p.parse_args(argv)
    if a.out is not None and a.out.exists():
        p.error(
            f"--out {a.out}: a file is there already, and a bench result is never written over "
            "(name a new file, or leave --out out for var/bench/<start>-<commit>-<sections>.json)"
        )
    params = Params()
    if a.smoke:  # every section's code once, at tiny sizes: no size or round repeated
        params = Params(
            scale=(100,),
            counters=300,
            rows_per_counter=5,
            idle_counters=3000,
            active_counters=60,
            history_minutes=60,
            reads=40,
            families=(1,),
            smoke=True,
            scan_repeats=1,
            scan_ranges=16,
            scan_concurrency=4,
            wait_marks=False,
            dag_repeats=1,
            hot_rows=2_000,
            warmup_counters=0,
            steady_counters=100,
            steady_rounds=2,
            audit_minutes=3000,
            archive_rounds=1,
            # the shards in the worker process: two spawned shard processes per compaction
            # (imports and a connection each per step) cost the smoke more than its tiny runs
            # do; the bench's own code is the same, and the engine tests run shard processes
            workers=1,
        )
    for name in (
        "counters",
        "rows_per_counter",
        "idle_counters",
        "active_counters",
        "history_minutes",
        "reads",
        "hot_rows",
        "steady_counters",
        "steady_rounds",
        "audit_minutes",
        "archive_rounds",
        "out",
        "scan_ranges",
        "scan_concurrency",
    ):
        value = getattr(a, name)
        if value is not None:
            setattr(params, name, value)
    if a.workers:
        params.workers = a.workers
    if a.warmup_counters is not None:
        params.warmup_counters = max(0, a.warmup_counters)
    if a.scale:
        params.scale = tuple(int(n) for n in a.scale.split(","))
    if a.kind:
        params.kinds = tuple(dict.fromkeys(a.kind))
    if a.families:
        params.families = tuple(int(x) for x in a.families.split(",") if x.strip())
    if a.only:
        params.only = tuple(dict.fromkeys(a.only))
    params.keep = a.keep
    if a.profile and importlib.util.find_spec("pyinstrument") is None:
        p.error(
            "--profile needs pyinstrument, which requirements.txt leaves out: "
            ".venv/bin/pip install pyinstrument"
        )
    params.profile = a.profile
    params.node_profile = a.node_profile
    if a.no_wait:
        params.wait_marks = False
    for name in ("counters", "rows_per_counter", "active_counters", "history_minutes", "reads"):
        if getattr(params, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if params.idle_counters < params.active_counters:
        p.error("--idle-counters must be >= --active-counters")
    if params.history_minutes < 12:
        p.error("--history-minutes must be >= 12")
    return params
