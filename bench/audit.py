"""The ``audit`` section: the audit trail after a year of minute runs.

Writes ``minutes`` synthetic audit rows of one family (one a minute, as a scheduled family
leaves them; realistic sizes: every check, the phases, who ran it) into the month partitions,
and the same rows into a table of the layout before them (one partition per family) for the
partition sizes; flushes both and reads ``nodetool tablestats``. Then times what people do with
the trail, through the functions the UI and the CLI call:

* the family page: ``status.family_health`` and ``status.audit_page`` (60 rows), newest and
  six months back ("Older runs");
* a month's export: ``status.audit_stream`` through ``audit_export`` as CSV and Parquet.
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime, timedelta
from itertools import islice
from pathlib import Path
from typing import Any

from counters import audit_export, status
from counters.audit import Provenance, month_start, next_month, stamped
from counters.schema import AUDIT_TABLE, q
from counters.store import Store
from counters.store.auditlog import LEGACY_COLUMNS

from .ops import Meter, flush_tables

LEGACY_TABLE = "bench_audit_one_partition"
CHECKS = {
    name: "pass"
    for name in (
        "value_change_equals_folded_sum",
        "recount_equals_counted_rows",
        "family_total_conserved",
        "no_counter_quarantined",
        "cleanup_left_nothing_counted",
        "family_epoch_advanced",
        "gx:value_change_equals_folded_sum",
        "gx:recount_equals_counted_rows",
        "gx:sum_folded_is_integer",
        "gx:value_delta_is_integer",
        "gx:pending_sum_is_integer",
        "gx:recount_sum_is_integer",
        "gx:family_total_conserved",
        "gx:no_counter_quarantined",
    )
}
DURATIONS = {"plan": 0.021, "compact": 0.412, "verify": 0.301, "cleanup": 0.088, "finish": 0.01}


def synthetic_rows(family: Any, end: datetime, minutes: int) -> Iterator[dict[str, Any]]:
    """A row a minute up to ``end``, as a scheduled family's runs write them (made as they are
    written: a year of them held at once took ~3 GB)."""
    start = end - timedelta(minutes=minutes)
    for i in range(minutes):
        at = start + timedelta(minutes=i, seconds=1, microseconds=617_000)
        run_id = f"scheduled__{(at - timedelta(seconds=1)).isoformat(timespec='minutes')}+00:00"
        record = {
            "family": family.name,
            "started_at": at,
            "run_id": run_id,
            "kind": "increments",
            "outcome": "success",
            "dry_run": False,
            "sweep": i % 15 == 0,
            "epoch_before": at - timedelta(minutes=2, seconds=1),
            "epoch_after": at - timedelta(minutes=1, seconds=1),
            "counters": 120 + i % 40,
            "rows_folded": 1200 + i % 400,
            "sum_folded": 60_000 + i,
            "late_rows": int(i % 97 == 0),
            "late_sum": 3 if i % 97 == 0 else 0,
            "max_lateness_ms": 0,
            "conflicts": 0,
            "rows_deleted": 1200 + i % 400,
            "checks": CHECKS,
            "durations": DURATIONS,
            "message": "",
            "gx_suite": "cbf3c627f2f2525c",
            "gx_result": f"s3://audit-evidence/counters/{family.name}/{at:%Y-%m-%d}/"
            f"{at:%Y%m%dT%H%M%S.%fZ}__{run_id.replace(':', '_').replace('+', '_')}",
        }
        yield stamped(
            record,
            family,
            Provenance("scheduled", None, {"dag_id": family.dag_id, "dag_run_id": run_id}),
            "compactor",
        )


def write_all(store: Store, statements: Iterable[tuple[Any, Any]], chunk: int = 5_000) -> int:
    """Write (statement, values) pairs ``chunk`` at a time; a request that timed out (a node
    busy with the one-partition table's writes) is sent again, up to three times."""
    written = 0
    pairs = iter(statements)
    while part := list(islice(pairs, chunk)):
        todo = part
        for _attempt in range(3):
            results = store.statements.run(todo, raise_first=False)
            todo = [s for s, r in zip(todo, results, strict=True) if isinstance(r, Exception)]
            if not todo:
                break
        else:
            raise RuntimeError(f"{len(todo)} audit row(s) still failing after 3 attempts")
        written += len(part)
    return written


def tablestats(instance: str | None, keyspace: str, table: str) -> dict[str, Any]:
    """Partition figures of ``nodetool tablestats`` (after a flush): count, max and mean."""
    if not instance:
        return {"error": "no local instance (CASSANDRA_LOCAL_INSTANCE)"}
    script = Path(__file__).resolve().parents[1] / "scripts" / "cassandra_node.py"
    command = [
        sys.executable,
        str(script),
        "nodetool",
        "--instance",
        instance,
        "--",
        "tablestats",
        f"{keyspace}.{table}",
    ]
    for _attempt in range(12):  # a node that serves CQL may still refuse nodetool a while
        proc = subprocess.run(command, capture_output=True, text=True, timeout=300)
        if proc.returncode == 0 or "not initialized yet" not in proc.stderr + proc.stdout:
            break
        time.sleep(5)
    if proc.returncode != 0:
        return {"error": (proc.stderr or proc.stdout).strip()[:300]}
    wanted = {
        "partitions": r"Number of partitions \(estimate\): (\d+)",
        "partition_max_bytes": r"Compacted partition maximum bytes: (\d+)",
        "partition_mean_bytes": r"Compacted partition mean bytes: (\d+)",
        "space_used_bytes": r"Space used \(live\): (\d+)",
    }
    found: dict[str, Any] = {}
    for name, pattern in wanted.items():
        match = re.search(pattern, proc.stdout)
        found[name] = int(match.group(1)) if match else None
    return found


def _timed(repeats: int, func: Any) -> dict[str, Any]:
    seconds = []
    result = None
    for _ in range(repeats):
        started = time.perf_counter()
        result = func()
        seconds.append(time.perf_counter() - started)
    return {
        "median_s": round(statistics.median(seconds), 4),
        "max_s": round(max(seconds), 4),
        "repeats": repeats,
        "result": result,
    }


def run(bench: Any, minutes: int, repeats: int = 5) -> dict[str, Any]:
    family, store, _client = bench.make_family("audit_trail", shards=1)
    keyspace = bench.keyspace
    end = datetime.now(UTC).replace(tzinfo=None, second=0, microsecond=0)
    bench.say(f"audit: writing {minutes:,} synthetic audit rows (a row a minute)")
    rows_by_month: Counter[str] = Counter()

    def months_counted() -> Iterator[dict[str, Any]]:
        for row in synthetic_rows(family, end, minutes):
            if row["month"] not in rows_by_month:
                store.audit._add_month(row["month"])
            rows_by_month[row["month"]] += 1
            yield row

    with Meter(bench.server) as write:
        write_all(store, (store.audit._insert(row) for row in months_counted()))
    bench.say("audit: the same rows in one partition per family (the layout before)")
    session = store.statements.session
    session.execute(
        f"CREATE TABLE IF NOT EXISTS {q(keyspace)}.{LEGACY_TABLE} (family text, "
        "started_at timestamp, run_id text, kind text, outcome text, dry_run boolean, "
        "epoch_before timestamp, epoch_after timestamp, counters int, rows_folded bigint, "
        "sum_folded bigint, late_rows bigint, late_sum bigint, max_lateness_ms bigint, "
        "conflicts int, rows_deleted bigint, checks text, durations text, message text, "
        "PRIMARY KEY ((family), started_at, run_id)) "
        "WITH CLUSTERING ORDER BY (started_at DESC, run_id ASC)"
    )
    legacy = session.prepare(
        f"INSERT INTO {q(keyspace)}.{LEGACY_TABLE} ({', '.join(LEGACY_COLUMNS)}) "
        f"VALUES ({', '.join('?' for _ in LEGACY_COLUMNS)})"
    )
    write_all(
        store,
        (
            (
                legacy,
                [
                    json.dumps(r.get(c), sort_keys=True) if isinstance(r.get(c), dict) else r.get(c)
                    for c in LEGACY_COLUMNS
                ],
            )
            for r in synthetic_rows(family, end, minutes)
        ),
    )
    flushed = flush_tables(keyspace, [AUDIT_TABLE, LEGACY_TABLE], bench.local_instance)
    now = end + timedelta(minutes=1)

    def family_page(before: datetime | None = None) -> int:
        store_ = Store(bench.conn, family, store.layout)  # a request's own store, as the UI's
        status.family_health(store_, now)
        return len(status.audit_page(store_, 60, before=before))

    months = store.audit.months()
    month = months[len(months) // 2]
    low, high = month_start(month), month_start(next_month(month))

    def export(fmt: str) -> dict[str, int]:
        store_ = Store(bench.conn, family, store.layout)
        size = 0
        count = 0

        def counted() -> Any:
            nonlocal count
            for row in status.audit_stream(store_, low, high):
                count += 1
                yield row

        for chunk in audit_export.chunks(fmt, counted(), family.name, low, high):
            size += len(chunk)
        return {"rows": count, "bytes": size}

    bench.say("audit: timing the family page and a month's export")
    family_page()  # prepare the statements once, as a running API server has
    newest = _timed(repeats, family_page)
    older = _timed(repeats, lambda: family_page(end - timedelta(days=182)))
    exports = {
        fmt: _timed(max(1, repeats // 2), lambda fmt=fmt: export(fmt)) for fmt in ("csv", "parquet")
    }
    for figures in exports.values():
        figures["rows_per_s"] = round(figures["result"]["rows"] / figures["median_s"])
    return {
        "rows": minutes,
        "months": len(months),
        "write": {"seconds": round(write.seconds, 1), "rows_per_s": round(minutes / write.seconds)},
        "flush": flushed,
        "tablestats": {
            "month_partitions": tablestats(bench.local_instance, keyspace, AUDIT_TABLE),
            "one_partition_per_family": tablestats(bench.local_instance, keyspace, LEGACY_TABLE),
        },
        "family_page_newest": newest,
        "family_page_six_months_back": older,
        "month_exported": month,
        "month_rows": rows_by_month[month],
        "export": exports,
    }
