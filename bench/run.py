"""``python -m bench``: compaction against the scan floor and the naive seed algorithm,
idle-heavy tables, read latency, DAG parse time and peak memory, side by side in one run.

Every figure comes from this run on this node (compare ratios, not absolute times: the machine
is shared and noisy). The JSON report (``--out``) holds every figure; a table goes to stdout.
All tables live in one throw-away keyspace that is dropped at the end (``--keep`` keeps it).

Sections (``--only`` picks some): scan, naive, compaction, idle, reads, limits, probes, dags,
kinds, audit (``bench.audit``: the audit trail after a year of minute runs), archive
(``bench.archive``: the 1M-row run with the archive of deleted rows on and off).
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from counters import engine
from counters.client import CounterClient, Increment
from counters.config import Family
from counters.connection import Connection, connect
from counters.core import BUCKETS, to_millis, truncate_ms, utc_naive, write_timestamp
from counters.engine import BUCKET_THREADS
from counters.schema import (
    LEASE_TABLE,
    STATE_TABLE,
    TABLES_TABLE,
    ensure_schema,
    index_table,
    ledger_table,
    q,
    quarantine_table,
    runs_table,
)
from counters.store import Store

from . import archive as bench_archive
from . import audit as bench_audit
from . import dags as bench_dags
from .kinds import KINDS, KindContext
from .nodeprofile import Recording, sampled_cpu_s, summarize
from .ops import (
    Dataset,
    Meter,
    code_state,
    compare,
    count_rows,
    engine_step_failed_in,
    flush_tables,
    load_twin,
    load_write_path,
    machine,
    naive_compact,
    naive_ddl,
    percentile,
    scan_raw,
    scan_values,
    server_pid,
    sweeping_far_away,
    tombstone_index_marks,
    utc_now,
    wait_for_quiet_node,
    write_folded_compact_rows,
)
from .probes import commit_costs, fold_io_costs, nagle_costs
from .required import STEPS as REQUIRED_STEPS
from .required import required_work

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
    out: Path = PROJECT_ROOT / "var" / "bench" / "latest.json"
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
    (None: as many as the measured one; 0: none; see ``Bench.warm_up``)."""


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
    p.add_argument("--out", type=Path, help="JSON report (var/bench/latest.json)")
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
    params = Params()
    if a.smoke:
        params = Params(
            scale=(100, 300),
            counters=300,
            rows_per_counter=5,
            idle_counters=3000,
            active_counters=60,
            history_minutes=60,
            reads=40,
            families=(1, 3),
            smoke=True,
            scan_repeats=1,
            scan_ranges=16,
            scan_concurrency=4,
            wait_marks=False,
            dag_repeats=1,
            hot_rows=2_000,
            warmup_counters=0,
            steady_counters=100,
            steady_rounds=3,
            audit_minutes=3000,
            archive_rounds=1,
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


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


class Bench:
    def __init__(self, params: Params, conn: Connection):
        self.p = params
        self.conn = conn
        self.keyspace = f"counters_bench_{secrets.token_hex(3)}"
        self.server = (
            server_pid(conn.settings.port)
            if conn.settings.hosts[0]
            in (
                "127.0.0.1",
                "localhost",
            )
            else None
        )
        self.local_instance = os.environ.get("CASSANDRA_LOCAL_INSTANCE") if self.server else None
        self.results: dict[str, Any] = {}
        self.marks_at: dict[str, float] = {}
        self.log = print

    def say(self, message: str) -> None:
        self.log(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)

    # --- families ---------------------------------------------------------------------------

    def make_family(self, name: str, **fields: Any) -> tuple[Family, Store, CounterClient]:
        values = {
            "name": name,
            "keyspace": self.keyspace,
            "raw_table": f"{name}_raw",
            "compact_table": f"{name}_compact",
            "lag": "1m",
            "shards": 4,
            # a minute's run after a sweep is what the bench measures: the smoke's small data
            # would otherwise sweep every run (sweep_every_run_below)
            "sweep_every_run_below": 0,
            **fields,
        }
        family = Family.model_validate(values)
        layout = ensure_schema(self.conn.session, family)
        store = Store(self.conn, family, layout)
        return family, store, CounterClient(self.conn, family, store)

    def reset_family(self, family: Family) -> None:
        """Empty a family's tables for reuse (many tables exhaust a small node's heap)."""
        ks = q(self.keyspace)
        for table in family_tables(family):
            self.conn.session.execute(f"TRUNCATE {ks}.{q(table)}", timeout=120)
        self.conn.session.execute(
            f"DELETE FROM {ks}.{STATE_TABLE} WHERE family = %s", (family.name,)
        )
        for table in family.tables:  # new tables: no identity recorded yet
            self.conn.session.execute(
                f"DELETE FROM {ks}.{TABLES_TABLE} WHERE table_name = %s", (table,)
            )
        for shard in range(family.shards):
            self.conn.session.execute(
                f"DELETE FROM {ks}.{LEASE_TABLE} WHERE family = %s AND shard = %s",
                (family.name, shard),
            )
        self.marks_at.pop(family.name, None)

    def reuse_family(self, family: Family, section: str) -> tuple[Family, Store, CounterClient]:
        """``family``'s tables, emptied, for another section under a name of its own: a family's
        state row is written with its epoch as timestamp, so the delete of ``reset_family``
        would hide the older epochs a later section writes under the same name."""
        self.reset_family(family)
        renamed = family.model_copy(update={"name": f"{family.name}_{section}"})
        store = Store(self.conn, renamed, ensure_schema(self.conn.session, renamed))
        return renamed, store, CounterClient(self.conn, renamed, store)

    @staticmethod
    def family_fields(family: Family) -> dict[str, Any]:
        data = family.model_dump(mode="json")
        data["lag"] = family.lag.total_seconds()
        data["freshness"] = family.freshness.total_seconds()
        data["sweep_interval"] = family.sweep_interval.total_seconds()
        if family.sweep_offset is not None:
            data["sweep_offset"] = family.sweep_offset.total_seconds()
        return data

    def _age_marks(self, family: Family) -> float | None:
        """Let the loader's index marks get older than the engine's forget margin, as they are
        in steady state when a run forgets idle counters; returns their age at the run."""
        written = self.marks_at.get(family.name)
        if written is None:
            return None
        need = engine.FORGET_MARGIN.total_seconds() + 2
        age = time.time() - written
        if self.p.wait_marks and age < need:
            self.say(f"waiting {need - age:.0f} s for index marks to age past the forget margin")
            time.sleep(need - age)
        return time.time() - written

    def compact(
        self,
        family: Family,
        epoch: datetime,
        label: str,
        profile: bool = False,
        quiet: bool = True,
    ) -> dict[str, Any]:
        """One engine run (``run_family``) over the whole family, in a worker process; with
        ``quiet``, started once the node has compacted and flushed what earlier steps left."""
        marks_age = self._age_marks(family)
        cmd = [
            sys.executable,
            "-m",
            "bench.worker",
            "--family-json",
            json.dumps(self.family_fields(family)),
            "--epoch",
            epoch.isoformat(),
            "--now",
            utc_now().replace(tzinfo=UTC).isoformat(),
            "--workers",
            str(self.p.workers),
        ]
        if profile:
            cmd += ["--profile", str(self.p.out.parent / f"profile-{label}")]
        self.say(f"compacting {family.name} ({label}) in a worker process")
        name = re.sub(r"[^a-z0-9]+", "-", label.lower())  # jcmd splits its arguments at spaces
        recording = (
            Recording(self.server, self.p.out.parent / f"node-{name}.jfr", f"bench-{name}")
            if self.p.node_profile and self.server is not None
            else nullcontext()
        )
        quiet_wait = wait_for_quiet_node(self.conn) if quiet else None
        with recording, Meter(self.server) as meter:
            proc = subprocess.run(
                cmd, capture_output=True, text=True, env=os.environ, cwd=PROJECT_ROOT
            )
        line = next((x for x in reversed(proc.stdout.splitlines()) if x.startswith("{")), None)
        if proc.returncode != 0 or line is None:
            raise RuntimeError(f"bench worker failed ({proc.returncode}): {proc.stderr[-2000:]}")
        result = json.loads(line)
        result["process_seconds"] = round(meter.seconds, 3)
        result["server_cpu_s"] = meter.server_cpu_s
        result["server_cpu_by_thread_s"] = meter.server_threads or None
        result["loadavg_1m_after"] = meter.loadavg_1m
        result["marks_age_s"] = None if marks_age is None else round(marks_age, 1)
        result["quiet_wait_s"] = None if quiet_wait is None else round(quiet_wait, 1)
        result["forget_margin_s"] = engine.FORGET_MARGIN.total_seconds()
        if profile:
            result["profile"] = str(self.p.out.parent / f"profile-{label}.txt")
        if isinstance(recording, Recording):
            try:
                result["node_profile"] = summarize(recording.path, sampled_cpu_s(meter))
            except (OSError, RuntimeError, subprocess.CalledProcessError) as exc:  # the run stands
                result["node_profile"] = {"error": f"{type(exc).__name__}: {exc}"}
                self.say(f"{label}: no node profile: {exc}")
        if not result["ok"]:
            self.say(f"{label}: engine run failed: {result['error']}")
        return result

    def read_latency(
        self, read: Any, counters: dict[str, Any], reads: int, warmup: int = 50
    ) -> dict[str, Any]:
        """Time ``read(counter)`` ``reads`` times per counter, interleaved (noise hits all)."""
        samples: dict[str, list[float]] = {name: [] for name in counters}
        for _ in range(min(warmup, reads)):
            for key in counters.values():
                read(key)
        for _ in range(reads):
            for name, key in counters.items():
                start = time.perf_counter()
                read(key)
                samples[name].append((time.perf_counter() - start) * 1000)
        return {
            name: {
                "reads": len(values),
                "p50_ms": round(percentile(values, 50), 3),
                "p90_ms": round(percentile(values, 90), 3),
                "p99_ms": round(percentile(values, 99), 3),
                "max_ms": round(max(values), 3),
                "mean_ms": round(sum(values) / len(values), 3),
            }
            for name, values in samples.items()
        }

    # --- 1-3: the main data set -------------------------------------------------------------

    def prepare_main(self) -> None:
        p = self.p
        t0 = (utc_now() - timedelta(days=2)).replace(second=0, microsecond=0)
        self.main_data = Dataset("c", p.counters, p.rows_per_counter, t0)
        self.main_family, self.main_store, self.main_client = self.make_family(
            "bench_main", **sweeping_far_away()
        )
        self.say(f"loading {self.main_data.row_count:,} rows through CounterClient.record")
        with Meter(self.server) as meter:
            load_write_path(self.main_client, self.main_data)
        self.marks_at[self.main_family.name] = time.time()
        self.results["load"] = {
            "rows": self.main_data.row_count,
            "counters": p.counters,
            "write_path": {
                **meter.as_dict(),
                "rows_per_s": round(self.main_data.row_count / meter.seconds),
            },
        }
        self.expected = self.main_data.expected()
        if "naive" in p.only:
            for statement in naive_ddl(self.keyspace, "naive_raw", "naive_compact"):
                self.conn.session.execute(statement)
            self.say("loading the same rows into the naive peer's twin table")
            with Meter(self.server) as meter:
                load_twin(self.conn, self.keyspace, "naive_raw", self.main_data)
            self.results["load"]["twin_bulk"] = {
                **meter.as_dict(),
                "rows_per_s": round(self.main_data.row_count / meter.seconds),
            }

    def scan_floor(self) -> None:
        p = self.p
        runs = []
        quiet_waits = []
        for attempt in range(p.scan_repeats):
            quiet_waits.append(round(wait_for_quiet_node(self.conn), 1))
            with Meter(self.server) as meter:
                rows, total = scan_raw(
                    self.conn, self.main_family, p.scan_ranges, p.scan_concurrency
                )
            runs.append(
                {**meter.as_dict(), "rows": rows, "rows_per_s": round(rows / meter.seconds)}
            )
            self.say(f"scan floor {attempt + 1}: {rows:,} rows in {meter.seconds:.2f} s")
        best = min(runs, key=lambda r: r["seconds"])
        self.results["scan_floor"] = {
            **best,
            "ranges": p.scan_ranges,
            "concurrency": p.scan_concurrency,
            "fetch_size": 5000,
            "all_runs_s": [r["seconds"] for r in runs],
            "quiet_wait_s": quiet_waits,
            "rows_expected": self.main_data.row_count,
            "sum_matches": total == sum(self.expected.values()),
        }

    def required(self) -> None:
        """The work the run's guarantees require, by the engine's primitives alone
        (``bench.required``), on the main data before the measured run. The scratch family's
        tables and Paxos state are emptied and flushed after, and the node left quiet, so none
        of it lands in the measured run."""
        family, store, _client = self.make_family("bench_required", **sweeping_far_away())
        data = self.main_data
        waited = wait_for_quiet_node(self.conn)
        self.say("required work: the run's steps by the engine's primitives alone")
        figures = required_work(
            self.main_store,
            store,
            to_millis(truncate_ms(utc_naive(data.epoch))),
            self.server,
            BUCKET_THREADS * self.p.workers,
        )
        figures["quiet_wait_s"] = round(waited, 1)
        figures["complete"] = (
            figures["rows_read"] == data.row_count
            and figures["rows_recounted"] == data.row_count
            and figures["counters_committed"] == data.counters
            and figures["copies_read_back"] == data.counters
            and figures["rows_deleted"] == data.row_count
        )
        self.results["required"] = figures
        total = figures["total"]
        self.say(
            f"required work: {total['seconds']:.1f} s, cpu client {total['client_cpu_s']:.1f} s "
            f"node {total['server_cpu_s']} s, complete={figures['complete']}"
        )
        self.reset_family(family)
        self.say(flush_tables("system", ["paxos"], self.local_instance))

    def naive(self) -> None:
        epoch = self.main_data.epoch
        self.say("naive peer: one counter at a time, synchronous calls")
        with Meter(self.server) as meter:
            counters = naive_compact(self.conn, self.keyspace, "naive_raw", "naive_compact", epoch)
        found = scan_values(self.conn, self.keyspace, "naive_compact", ["type"], "value")
        left = count_rows(self.conn, self.keyspace, "naive_raw", ["type"])
        exactness = compare(self.expected, found, left)
        rows = self.main_data.row_count
        self.results["naive"] = {
            **meter.as_dict(),
            "counters": counters,
            "rows": rows,
            "rows_per_s": round(rows / meter.seconds),
            "exactness": exactness.as_dict(),
        }
        self.say(f"naive peer: {meter.seconds:.1f} s ({rows / meter.seconds:,.0f} rows/s)")

    def warm_up(self) -> None:
        """Two compactions of the same size, on their own family, before the scan floor and the
        measured runs: a first run (a sweep) and its next run (not a sweep, over the first's
        tombstones, ledger rows and compact rows), as section 3 measures them. Both measured
        runs then meet a node that has worked that way before, as one in service has. A node
        just started compiles its read, Paxos and batch paths (JIT) during its first big runs:
        10 of the node's 35 CPU-s in the first 1M-row run after a start, 7 in the second, 1.3
        in a later one; after a warm-up of a first run only, the next run still compiled 4-5
        CPU-s of paths no first run takes. The warm-up's figures are reported beside the
        measured runs'."""
        n = self.p.counters if self.p.warmup_counters is None else self.p.warmup_counters
        if n < 1:
            return
        t0 = (utc_now() - timedelta(days=2)).replace(second=0, microsecond=0)
        data = Dataset("w", n, self.p.rows_per_counter, t0)
        later = data.next_round()
        family, _store, client = self.make_family("bench_warmup", **sweeping_far_away())
        figures = {}
        for label, round_ in (("warm-up", data), ("warm-up next run", later)):
            load_write_path(client, round_)
            run = self.compact(family, round_.epoch, label)
            sweep = (run.get("summary") or {}).get("sweep")
            figures[label] = {
                "rows": round_.row_count,
                "ok": run["ok"],
                "sweep": sweep,
                "seconds": round(run["seconds"], 3),
                **_cpu_figures(run),
            }
            self.say(f"{label}: {round_.row_count:,} rows compacted in {run['seconds']:.1f} s")
        # Its memtables (and its Paxos state) written out now, and compacted before the scan
        # floor: left in memory, the measured runs' writes filled the commit log, which flushed
        # them in the middle of the first run, and the node compacted them there.
        flushed = [
            flush_tables(family.keyspace, family_tables(family), self.local_instance),
            flush_tables("system", ["paxos"], self.local_instance),
        ]
        self.say("; ".join(flushed))
        self.results["warmup"] = {
            **figures["warm-up"],
            "next_run": figures["warm-up next run"],
            "flushed": flushed,
        }

    def compaction(self) -> None:
        data, family = self.main_data, self.main_family
        run = self.compact(family, data.epoch, "compaction", profile=self.p.profile)
        with Meter(self.server) as compact_scan:
            found = scan_values(self.conn, self.keyspace, family.compact_table, ["type"], "value")
        with Meter(self.server) as tombstone_scan:  # the raw table now holds only tombstones
            left = count_rows(self.conn, self.keyspace, family.raw_table, ["type"])
        exactness = compare(self.expected, found, left)
        sweep = self._sweep_after_fold(family)
        sample = list(self.expected)[:200]
        read_rule_ok = all(
            v.value == self.expected[v.counter] for v in self.main_client.read_many(sample)
        )
        summary = run.get("summary") or {}
        rows = data.row_count
        seconds = run["seconds"]
        self.results["compaction"] = {
            "ok": run["ok"],
            "error": run["error"],
            "seconds": round(seconds, 3),
            "rows": rows,
            "counters": data.counters,
            "rows_per_s": round(rows / seconds) if run["ok"] else None,
            "seconds_per_1M_rows": round(seconds * 1_000_000 / rows, 1),
            **_cpu_figures(run),
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
            and summary.get("sum_folded") == sum(self.expected.values())
            and summary.get("rows_deleted") == rows,
            "requests": run.get("requests"),
            "requests_per_counter": round(
                sum((run.get("requests") or {}).values()) / data.counters, 2
            ),
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
        self.say(
            f"compaction: {seconds:.1f} s ({rows / seconds:,.0f} rows/s), exact={exactness.exact}"
        )
        self.results["compaction"]["next_run"] = self._next_run()

    def _next_run(self) -> dict[str, Any]:
        """The family's next run, as a minute's run in service is: as many increments again on
        every counter, folded by a run that is not a sweep (the measured run above is the
        family's first, which sweeps: it reads every bucket whole; a minute's run reads its
        touched counters, by name or by range as its buckets' populations say)."""
        data, family = self.main_data, self.main_family
        later = data.next_round()
        self.say(f"next run: loading {later.row_count:,} more rows on the same counters")
        load_write_path(self.main_client, later)
        self.marks_at[family.name] = time.time()
        expected = {
            later.key(i): self.expected[later.key(i)] + later.total(i) for i in later.indexes()
        }
        run = self._checked_run("next run", family, later.epoch, expected)
        self.say(
            f"next run: {run['seconds']:.1f} s, sweep={run['sweep']}, "
            f"exact={run['exactness']['exact']}"
        )
        return {**run, "rows": later.row_count}

    def steady(self) -> None:
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
        p = self.p
        t0 = (utc_now() - timedelta(days=1)).replace(second=0, microsecond=0)
        data = Dataset("y", p.steady_counters, p.rows_per_counter, t0)
        family, store, client = self.make_family("bench_steady", **sweeping_far_away())
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
            run = self._checked_run(
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
            self.say(
                f"steady round {n}: {run['seconds']:.1f} s, node {run['server_cpu_s']} CPU-s, "
                f"exact={run['exactness']['exact']}"
            )
            data = data.next_round()
        self.results["steady"] = {
            "counters": p.steady_counters,
            "rows_per_round": data.row_count,
            "rounds": rounds,
        }

    def scaling(self) -> None:
        """The same compaction at several sizes, each on freshly (bulk) loaded data: how time,
        CPU, requests and peak memory grow with the rows."""
        t0 = (utc_now() - timedelta(days=1)).replace(second=0, microsecond=0)
        runs = []
        for counters in self.p.scale:
            data = Dataset(f"s{counters}", counters, self.p.rows_per_counter, t0)
            family, _store, _client = self.make_family(f"bench_scale_{counters}")
            self.say(f"scaling: loading {data.row_count:,} rows")
            load_twin(self.conn, self.keyspace, family.raw_table, data)
            run = self.compact(family, data.epoch, f"scale-{counters}")
            found = scan_values(self.conn, self.keyspace, family.compact_table, ["type"], "value")
            left = count_rows(self.conn, self.keyspace, family.raw_table, ["type"])
            exact = compare(data.expected(), found, left)
            requests = run.get("requests") or {}
            runs.append(
                {
                    "counters": counters,
                    "rows": data.row_count,
                    "ok": run["ok"],
                    "error": run["error"],
                    "seconds": round(run["seconds"], 3),
                    **_cpu_figures(run),
                    "requests": sum(requests.values()),
                    "peak_rss_mib": round(run["rss_peak_kb"] / 1024, 1),
                    "exact": exact.exact,
                }
            )
            self.say(
                f"scaling {data.row_count:,} rows: {run['seconds']:.1f} s, exact={exact.exact}"
            )
            self.reset_family(family)
        self.results["scaling"] = {"runs": runs}

    def _sweep_after_fold(self, family: Family) -> dict[str, Any]:
        """``discovery: scan`` (the sweep) on the family just folded: ``Store.raw.scan_counters``
        per shard, over a raw table that now holds one tombstone per folded row."""
        store = Store(self.conn, family.model_copy(update={"discovery": "scan"}))
        try:
            with Meter(self.server) as meter:
                found = sum(len(store.raw.scan_counters(s)) for s in range(family.shards))
        except Exception as exc:
            return {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        return {"ok": True, "seconds": round(meter.seconds, 3), "counters_found": found}

    # --- 4: idle-heavy ------------------------------------------------------------------------

    def prepare_idle(self) -> None:
        p = self.p
        t1 = (utc_now() - timedelta(days=1)).replace(second=0, microsecond=0)
        self.idle_data = Dataset("k", p.active_counters, p.rows_per_counter, t1)
        self.idle_e0 = truncate_ms(t1 - timedelta(hours=1))
        base = {self.idle_data.key(i): 1000 + i % 100 for i in range(p.idle_counters)}
        self.idle_base = base
        setups = {}
        for name, total in (("bench_active", p.active_counters), ("bench_idle", p.idle_counters)):
            # a day between sweeps: the measured runs are minute runs, not a sweep that comes
            # due at the family's phase while the bench waits (sweeps are timed in section 3)
            family, store, client = self.make_family(name, sweep_interval="1d")
            keys = [self.idle_data.key(i) for i in range(total)]
            self.say(f"{name}: {total:,} compact rows as an earlier run left them (bulk)")
            with Meter(self.server) as meter:
                write_folded_compact_rows(
                    self.conn,
                    family,
                    [(k, base[k]) for k in keys],
                    self.idle_e0,
                    p.rows_per_counter,
                )
            # as in steady state: swept recently, so the measured run is a minute's run
            store.control.advance_family_epoch(self.idle_e0, "bench-setup", swept_at=utc_now())
            with Meter(self.server) as load:
                load_write_path(client, self.idle_data)
            self.marks_at[name] = time.time()
            setups[name] = {
                "compact_rows_bulk": {**meter.as_dict(), "rows": total},
                "increments_write_path": {**load.as_dict(), "rows": self.idle_data.row_count},
            }
            setattr(self, name.replace("bench_", "") + "_family", (family, store, client))
        self.results["idle_setup"] = setups

    def _idle_expected(self, total: int, extra: list[Dataset]) -> dict[tuple, int]:
        expected = {
            self.idle_data.key(i): self.idle_base[self.idle_data.key(i)] for i in range(total)
        }
        for data in extra:
            for i in data.indexes():
                expected[data.key(i)] += data.total(i)
        return expected

    def _idle_run(
        self, label: str, family: Family, total: int, epoch: datetime, datasets: list[Dataset]
    ) -> dict[str, Any]:
        return {
            **self._checked_run(label, family, epoch, self._idle_expected(total, datasets)),
            "counters_in_table": total,
            "active_counters": self.p.active_counters,
            "rows": self.idle_data.row_count,
        }

    def _checked_run(
        self,
        label: str,
        family: Family,
        epoch: datetime,
        expected: dict[tuple, int],
        count_ranges: int = 32,
        quiet: bool = True,
    ) -> dict[str, Any]:
        """One engine run, then every compact value compared with ``expected`` and the raw rows
        left counted (in ``count_ranges`` token ranges): the figures every section reports of
        such a run."""
        run = self.compact(family, epoch, label, quiet=quiet)
        found = scan_values(self.conn, self.keyspace, family.compact_table, ["type"], "value")
        left = count_rows(self.conn, self.keyspace, family.raw_table, ["type"], count_ranges)
        exactness = compare(expected, found, left)
        summary = run.get("summary") or {}
        return {
            "ok": run["ok"],
            "error": run["error"],
            "seconds": round(run["seconds"], 3),
            "sweep": summary.get("sweep"),
            "phases_s": summary.get("durations_s"),
            "counters_committed": summary.get("counters_committed"),
            "requests": run.get("requests"),
            "rss_peak_kb": run["rss_peak_kb"],
            **_cpu_figures(run),
            "loadavg_1m_after": run["loadavg_1m_after"],
            "marks_age_s": run["marks_age_s"],
            "exactness": exactness.as_dict(),
        }

    def idle(self) -> None:
        p = self.p
        epoch = self.idle_data.epoch
        active_family = self.active_family[0]
        idle_family, idle_store, idle_client = self.idle_family
        out = {
            "active_only": self._idle_run(
                "active_only", active_family, p.active_counters, epoch, [self.idle_data]
            ),
            "idle_heavy": self._idle_run(
                "idle_heavy", idle_family, p.idle_counters, epoch, [self.idle_data]
            ),
        }
        # The same idle-heavy table, but the idle counters' index marks were forgotten recently
        # (row tombstones in the index, within its gc_grace_seconds), then a new round of
        # increments for the active counters.
        later = Dataset("k", p.active_counters, p.rows_per_counter, epoch + timedelta(minutes=1))
        idle_keys = [self.idle_data.key(i) for i in range(p.active_counters, p.idle_counters)]
        self.say(f"idle-heavy, recent: {len(idle_keys):,} index tombstones, then new increments")
        with Meter(self.server) as meter:
            tombstone_index_marks(
                idle_store, idle_keys, write_timestamp(utc_now() - timedelta(minutes=5))
            )
        load_write_path(idle_client, later)
        self.marks_at[idle_family.name] = time.time()
        recent = self._idle_run(
            "idle_heavy_recent", idle_family, p.idle_counters, later.epoch, [self.idle_data, later]
        )
        recent["index_tombstones"] = len(idle_keys)
        recent["tombstones_written_s"] = round(meter.seconds, 2)
        out["idle_heavy_recent_forgets"] = recent
        self.results["idle"] = out

    # --- 5: read latency ------------------------------------------------------------------------

    def reads(self) -> None:
        p = self.p
        if hasattr(self, "main_family"):
            _family, store, client = self.reuse_family(self.main_family, "reads")
        else:
            _family, store, client = self.make_family("bench_main")
        now_min = utc_now().replace(second=0, microsecond=0)
        start = now_min - timedelta(minutes=p.history_minutes)
        history = [
            (truncate_ms(start + timedelta(minutes=k)), 1 + k % 50)
            for k in range(p.history_minutes)
        ]
        keys = {
            "compacted": ("lat-compacted",),
            "uncompacted": ("lat-uncompacted",),
            "fresh": ("lat-fresh",),
        }
        self.say(f"read latency: {p.history_minutes} per-minute rows, compacted vs not vs fresh")
        client.record(
            Increment(keys["compacted"], inc, at, ("lat", k)) for k, (at, inc) in enumerate(history)
        )
        # Left uncompacted: written without an index mark, so no run ever finds it.
        store.raw.insert_raw(
            [
                (keys["uncompacted"], (at, "lat", k), inc, write_timestamp(at))
                for k, (at, inc) in enumerate(history)
            ]
        )
        fresh_at = truncate_ms(utc_now())
        client.record([Increment(keys["fresh"], 5, fresh_at, ("lat", 0))])
        # Kept compact by the job: one run over the backlog, then per-minute runs.
        runs = []
        for back in range(11, 1, -1):
            summary = engine.run_family(store, now_min - timedelta(minutes=back), now=utc_now())
            runs.append(summary.tally.rows_folded)
        total = sum(inc for _at, inc in history)
        expect = {"compacted": total, "uncompacted": total, "fresh": 5}
        values = {name: client.read(key) for name, key in keys.items()}
        stats = self.read_latency(client.read, keys, p.reads)
        for name in stats:
            stats[name]["value_exact"] = values[name] == expect[name]
        # What the engine's fold read (all of a counter's rows, tombstones included) costs on
        # the same counters: the compacted one carries a tombstone per folded row.
        fold = self.read_latency(
            lambda key: store.raw.read_rows([key]), keys, max(50, p.reads // 4), warmup=10
        )
        self.results["read_latency"] = {
            "history_minutes": p.history_minutes,
            "runs_rows_folded": runs,
            "reads_per_counter": p.reads,
            "read_call": "CounterClient.read (compact row, then the slice after its epoch)",
            "counters": stats,
            "fold_read_rows": fold,
        }

    # --- limits -------------------------------------------------------------------------------

    def limits(self) -> None:
        """One hot counter: ``hot_rows`` rows folded at once (a burst, or ~600 increments a
        minute for the raw table's 3 h gc_grace), then one more increment and another run. Every
        folded row leaves a row tombstone in the counter's partition; Cassandra refuses reads
        over ``tombstone_failure_threshold`` (100,000), so the engine must read the counter by
        parts (``engine.read_hot_counter``) and say so (``windowed_reads``)."""
        p = self.p
        if hasattr(self, "main_family"):
            family, store, client = self.reuse_family(self.main_family, "limits")
        else:
            family, store, client = self.make_family("bench_main")
        key = ("hot",)
        t0 = (utc_now() - timedelta(hours=3)).replace(second=0, microsecond=0)
        for start in range(0, p.hot_rows, 20_000):
            client.record(
                Increment(key, 1, t0 + timedelta(milliseconds=20 * j), ("hot", j))
                for j in range(start, min(p.hot_rows, start + 20_000))
            )
        epoch = t0 + timedelta(minutes=60)
        late = t0 + timedelta(minutes=61)
        folds = []
        for n, at in enumerate((epoch, late)):
            if n == 1:
                client.record([Increment(key, 5, at - timedelta(seconds=30), ("hot-new", 0))])
            self.say(f"limits: hot counter, fold {n + 1}")
            started = time.perf_counter()
            try:
                summary = engine.run_family(store, at, now=utc_now())
                folds.append(
                    {
                        "ok": True,
                        "seconds": round(time.perf_counter() - started, 3),
                        "outcome": summary.outcome,
                        "rows_folded": summary.tally.rows_folded,
                        "windowed_reads": summary.tally.windowed_reads,
                    }
                )
            except Exception as exc:
                folds.append(
                    {
                        "ok": False,
                        "seconds": round(time.perf_counter() - started, 3),
                        "failed_in": engine_step_failed_in(exc),
                        "error": f"{type(exc).__name__}: {str(exc)[:300]}",
                    }
                )
        value = client.read(key)
        self.results["limits"] = {
            "hot_counter_rows": p.hot_rows,
            "folds": folds,
            "read_value": value,
            "read_exact": value == p.hot_rows + 5,
            "family_epoch_after": str(store.control.family_epoch()),
        }
        self.reset_family(family)

    # --- probes ---------------------------------------------------------------------------------

    def probes(self) -> None:
        size = min(self.p.counters, 20_000)
        self.say(f"probes: {size:,} commits four ways")
        t0 = (utc_now() - timedelta(days=3)).replace(second=0, microsecond=0)
        self.results["probes"] = {
            "commit": commit_costs(self.conn, self.keyspace, size, self.server),
            "fold_io": fold_io_costs(self.conn, self.keyspace, size, self.server, t0),
            "nagle": nagle_costs(self.conn, self.keyspace, self.server),
        }

    # --- 6, kinds ---------------------------------------------------------------------------

    def dags(self) -> None:
        self.say(f"DAG parse time for {list(self.p.families)} families")
        self.results["dag_parse"] = bench_dags.measure(
            list(self.p.families), repeats=self.p.dag_repeats
        )

    def kinds(self) -> None:
        ctx = KindContext(self.conn, self.keyspace, self.p, self.results, self)
        self.results["kinds"] = {}
        for name, func in KINDS.items():  # one failing kind does not hide the others' lines
            if self.p.kinds and name not in self.p.kinds:
                continue
            try:
                self.results["kinds"][name] = func(ctx).as_dict()
            except Exception as exc:
                self.say(f"kind {name} failed: {type(exc).__name__}: {exc}")
                self.results.setdefault("errors", {})[f"kinds.{name}"] = (
                    f"{type(exc).__name__}: {exc}"
                )

    def audit_trail(self) -> None:
        self.results["audit"] = bench_audit.run(
            self, self.p.audit_minutes, 1 if self.p.smoke else 5
        )

    def archive(self) -> None:
        self.results["archive"] = bench_archive.run(self, max(1, self.p.archive_rounds))

    # --- the run --------------------------------------------------------------------------------

    def run(self) -> None:
        only = self.p.only
        self.conn.session.execute(
            f"CREATE KEYSPACE IF NOT EXISTS {self.keyspace} WITH replication = "
            "{'class': 'SimpleStrategy', 'replication_factor': 1}"
        )
        steps: list[tuple[str, Any]] = []
        if {"scan", "required", "naive", "compaction"} & set(only):
            steps.append(("load", self.prepare_main))
        if {"required", "compaction", "archive"} & set(only):  # before the scan floor: warm
            steps.append(("warmup", self.warm_up))
        if "idle" in only:  # loaded early: the naive peer's minutes let the index marks age
            steps.append(("idle_setup", self.prepare_idle))
        for name, func in (
            ("scan", self.scan_floor),
            ("required", self.required),
            ("naive", self.naive),
            ("compaction", self.compaction),
            ("scaling", self.scaling),
            ("steady", self.steady),
            ("idle", self.idle),
            ("reads", self.reads),
            ("limits", self.limits),
            ("probes", self.probes),
            ("dags", self.dags),
            ("kinds", self.kinds),
            ("audit", self.audit_trail),
            ("archive", self.archive),
        ):
            if name in only:
                steps.append((name, func))
        for name, func in steps:
            started = time.perf_counter()
            try:
                func()
            except Exception as exc:
                self.say(f"section {name} failed: {type(exc).__name__}: {exc}")
                self.results.setdefault("errors", {})[name] = f"{type(exc).__name__}: {exc}"
            self.results.setdefault("section_seconds", {})[name] = round(
                time.perf_counter() - started, 1
            )

    def drop(self) -> None:
        self.conn.session.execute(f"DROP KEYSPACE IF EXISTS {self.keyspace}", timeout=120)


def family_tables(family: Family) -> list[str]:
    """The tables of a family's own (the keyspace's lease and state tables are shared)."""
    return [
        family.raw_table,
        family.compact_table,
        index_table(family),
        ledger_table(family),
        runs_table(family),
        quarantine_table(family),
    ]


def _cpu_figures(run: dict[str, Any]) -> dict[str, Any]:
    """The CPU figures of a compaction run (``Bench.compact``'s result), as every section
    reports them."""
    return {
        "client_cpu_s": round(run["client_cpu_s"], 2),
        "server_cpu_s": _round(run["server_cpu_s"], 2),
        "server_cpu_by_thread_s": run.get("server_cpu_by_thread_s"),
        "quiet_wait_s": run.get("quiet_wait_s"),
        **({"node_profile": run["node_profile"]} if run.get("node_profile") else {}),
    }


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


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


def _terminate(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # run the finally blocks: drop the bench keyspace


def main(argv: list[str] | None = None) -> int:
    params = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    started = datetime.now(UTC)
    report: dict[str, Any] = {
        "started_at": started.isoformat(timespec="seconds"),
        "command": "python -m bench " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": machine(),
        "code": code_state(),
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
            bench.run()
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
    params.out.parent.mkdir(parents=True, exist_ok=True)
    params.out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(table(report))
    print(f"JSON: {params.out}")
    return 1 if results.get("errors") else 0


if __name__ == "__main__":
    sys.exit(main())
