"""One compaction run in its own process, for the benchmark (``python -m counters.bench_worker``).

It does what ``counterctl compact`` does — ``Store(conn, family)`` then ``engine.run_family`` —
and prints one JSON object on stdout: the run's summary, its wall time, the process's CPU time
and its peak RSS. A separate process makes the peak RSS the compaction's own, not the loader's.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from collections import Counter
from datetime import datetime
from pathlib import Path


def _status_kb(field: str) -> int:
    """``VmRSS``/``VmHWM`` of this process from /proc (``ru_maxrss`` would include the RSS the
    forked bench process had before ``exec``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


class RequestCounter:
    """Counts the requests the driver sends (one per statement or batch; later pages of a paged
    read are not counted), labelled with the Store's statement names."""

    def __init__(self) -> None:
        from cassandra.cluster import Session

        self.counts: Counter[object] = Counter()
        self._session_cls = Session
        self._original = Session._create_response_future
        counts = self.counts
        original = self._original

        def counting(session, query, *args, **kwargs):
            counts[self._label(query)] += 1
            return original(session, query, *args, **kwargs)

        Session._create_response_future = counting

    @staticmethod
    def _label(query: object) -> object:
        from cassandra.query import BatchStatement, BoundStatement, PreparedStatement

        if isinstance(query, BoundStatement):
            return query.prepared_statement.query_string
        if isinstance(query, PreparedStatement):
            return query.query_string
        if isinstance(query, BatchStatement):
            entries = getattr(query, "_statements_and_parameters", [])
            first = entries[0][1] if entries else b""
            return ("batch", first)
        return str(getattr(query, "query_string", query))[:80]

    def named(self, prepared: dict) -> dict[str, int]:
        by_text = {p.query_string: name for name, p in prepared.items()}
        by_id = {p.query_id: name for name, p in prepared.items()}
        out: Counter[str] = Counter()
        for label, count in self.counts.items():
            if isinstance(label, tuple):
                out[f"batch:{by_id.get(label[1], 'other')}"] += count
            else:
                out[by_text.get(label, " ".join(str(label).split()[:4]))] += count
        return dict(out.most_common())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m counters.bench_worker")
    parser.add_argument("--family-json", required=True, help="Family fields as JSON")
    parser.add_argument("--epoch", required=True, help="ISO time")
    parser.add_argument("--now", required=True, help="ISO time passed as run_family(now=...)")
    parser.add_argument("--run-id", default=None)
    parser.add_argument("--profile", default=None, help="write a pyinstrument profile here")
    parser.add_argument("--variant", default="baseline", help="counters.bench_variants name")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    from . import engine
    from .bench_variants import apply
    from .config import Family
    from .connection import connect
    from .store import Store

    apply(args.variant)
    family = Family.model_validate(json.loads(args.family_json))
    epoch = datetime.fromisoformat(args.epoch)
    now = datetime.fromisoformat(args.now)
    conn = connect()
    ready = time.perf_counter()
    rss_before = _status_kb("VmRSS")
    cpu_before = resource.getrusage(resource.RUSAGE_SELF)
    profiler = None
    if args.profile:
        from pyinstrument import Profiler

        profiler = Profiler(interval=0.002)
        profiler.start()
    requests = RequestCounter()
    error = None
    summary = None
    store = None
    t0 = time.perf_counter()
    try:
        store = Store(conn, family)
        summary = engine.run_family(store, epoch, args.run_id, now=now)
    except Exception as exc:  # reported, not raised: the bench records failures as results
        error = f"{type(exc).__name__}: {exc}"
    seconds = time.perf_counter() - t0
    if profiler is not None:
        profiler.stop()
        out = Path(args.profile)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".txt").write_text(profiler.output_text(unicode=False, show_all=False))
        out.with_suffix(".html").write_text(profiler.output_html())
    cpu_after = resource.getrusage(resource.RUSAGE_SELF)
    conn.close()
    result = {
        "ok": error is None,
        "variant": args.variant,
        "error": error,
        "seconds": seconds,
        "startup_seconds": ready - started,
        "client_cpu_user_s": cpu_after.ru_utime - cpu_before.ru_utime,
        "client_cpu_sys_s": cpu_after.ru_stime - cpu_before.ru_stime,
        "rss_before_kb": rss_before,
        "rss_peak_kb": _status_kb("VmHWM"),
        "summary": summary.as_dict() if summary is not None else None,
        "requests": requests.named(store._prepared if store is not None else {}),
    }
    sys.stdout.write(json.dumps(result, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
