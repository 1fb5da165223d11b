"""What every section of the bench runs on: its keyspace and families, an engine run in a
worker process checked exact, timed reads, and the figures each section reports of a run."""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import time
from contextlib import nullcontext
from datetime import datetime
from typing import Any

from counters import engine
from counters.client import CounterClient
from counters.config import Family
from counters.connection import Connection
from counters.core import to_text
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

from .nodeprofile import Recording, sampled_cpu_s, summarize
from .ops import (
    Dataset,
    Meter,
    compare,
    count_rows,
    percentile,
    scan_values,
    server_pid,
    utc_now,
    wait_for_quiet_node,
)
from .params import PROJECT_ROOT, RESULTS_DIR, Params


class Bench:
    """One run's keyspace, connection, parameters and results, and what the sections share:
    the main data set (``bench.mainset``) and the idle tables (``bench.idle``), set by the
    steps that load them (absent when those steps did not run)."""

    main_data: Dataset
    main_family: Family
    main_store: Store
    main_client: CounterClient
    expected: dict[tuple, int]
    """The main data set's counters and their totals."""
    idle_data: Dataset
    idle_e0: datetime
    idle_base: dict[tuple, int]
    active_family: tuple[Family, Store, CounterClient]
    idle_family: tuple[Family, Store, CounterClient]

    def __init__(self, params: Params, conn: Connection):
        self.p = params
        self.out_dir = params.out.parent if params.out is not None else RESULTS_DIR
        """Beside the report: profiles, node recordings, the archive section's files."""
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
            to_text(epoch),
            "--now",
            to_text(utc_now()),
            "--workers",
            str(self.p.workers),
        ]
        if profile:
            cmd += ["--profile", str(self.out_dir / f"profile-{label}")]
        self.say(f"compacting {family.name} ({label}) in a worker process")
        name = re.sub(r"[^a-z0-9]+", "-", label.lower())  # jcmd splits its arguments at spaces
        recording = (
            Recording(self.server, self.out_dir / f"node-{name}.jfr", f"bench-{name}")
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
            result["profile"] = str(self.out_dir / f"profile-{label}.txt")
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

    def checked_run(
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
            **cpu_figures(run),
            "loadavg_1m_after": run["loadavg_1m_after"],
            "marks_age_s": run["marks_age_s"],
            "exactness": exactness.as_dict(),
        }

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


def cpu_figures(run: dict[str, Any]) -> dict[str, Any]:
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
