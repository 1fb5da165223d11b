"""One compaction run in its own process, for the benchmark (``python -m bench.worker``).

It does what ``counterctl compact`` does — ``Store(conn, family)`` then ``engine.run_family``
with its shards in ``--workers`` processes — and prints one JSON object on stdout: the run's
summary (with the requests it sent per phase, counted by the engine), its wall time, the CPU
time of this process and its shard processes, and the peak RSS of each. A separate process
makes the peak RSS the compaction's own, not the loader's.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path


def _status_kb(field: str) -> int:
    """``VmRSS``/``VmHWM`` of this process from /proc (``ru_maxrss`` would include the RSS the
    forked bench process had before ``exec``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _cpu() -> float:
    """CPU seconds of this process and of its finished children (the shard processes)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.worker")
    parser.add_argument("--family-json", required=True, help="Family fields as JSON")
    parser.add_argument("--epoch", required=True, help="ISO time")
    parser.add_argument("--now", required=True, help="ISO time passed as run_family(now=...)")
    parser.add_argument("--run-id", default=None)
    parser.add_argument("--workers", type=int, default=2, help="shard processes")
    parser.add_argument("--profile", default=None, help="write a pyinstrument profile here")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    from counters import engine
    from counters.config import Family
    from counters.connection import connect
    from counters.core import from_text
    from counters.store import Store

    family = Family.model_validate(json.loads(args.family_json))
    epoch = from_text(args.epoch)
    now = from_text(args.now)
    conn = connect()
    # GX imported and the family's suite built before the timed run, as the scheduler's
    # preload does for every task: the run's own validation is timed, the import is startup
    from counters.gx import checks

    checks.warm([family.name])
    ready = time.perf_counter()
    rss_before = _status_kb("VmRSS")
    cpu_before = _cpu()
    profiler = None
    if args.profile:
        from pyinstrument import Profiler

        profiler = Profiler(interval=0.002)
        profiler.start()
    error = None
    summary = None
    t0 = time.perf_counter()
    try:
        summary = engine.run_family(
            Store(conn, family), epoch, args.run_id, now=now, workers=args.workers
        )
    except Exception as exc:  # reported, not raised: the bench records failures as results
        error = f"{type(exc).__name__}: {exc}"
    seconds = time.perf_counter() - t0
    if profiler is not None:
        profiler.stop()
        out = Path(args.profile)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".txt").write_text(profiler.output_text(unicode=False, show_all=False))
        out.with_suffix(".html").write_text(profiler.output_html())
    cpu_seconds = _cpu() - cpu_before
    conn.close()
    result = {
        "ok": error is None,
        "error": error,
        "seconds": seconds,
        "workers": args.workers,
        "startup_seconds": ready - started,
        "client_cpu_s": cpu_seconds,
        "rss_before_kb": rss_before,
        "rss_peak_kb": max(
            _status_kb("VmHWM"), int((summary.peak_rss_mib if summary else 0) * 1024)
        ),
        "summary": summary.summary() if summary is not None else None,
        "requests": summary.requests if summary is not None else {},
    }
    sys.stdout.write(json.dumps(result, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
