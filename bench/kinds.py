"""One benchmark line per family kind: compaction rows/s at the default data size, and the read
p99 of a compacted counter against a fresh one.

Adding a kind is one function: decorate it with ``@kind_line("<kind>")``. It gets a
:class:`KindContext` (the connection, the bench keyspace, the sizes, the sections this run
already measured, and helpers to compact through the engine in its own process and to time
reads) and returns a :class:`KindLine`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

from cassandra.query import BatchStatement, BatchType
from cassandra.util import Date, uuid_from_time
from counters import engine
from counters.core import table_time
from counters.schema import q

from .ops import (
    Dataset,
    Meter,
    chunked,
    compare,
    count_rows,
    run_concurrent,
    scan_values,
    utc_now,
)

KindBench = Callable[["KindContext"], "KindLine"]
KINDS: dict[str, KindBench] = {}


def kind_line(name: str) -> Callable[[KindBench], KindBench]:
    def register(func: KindBench) -> KindBench:
        KINDS[name] = func
        return func

    return register


@dataclass
class KindContext:
    conn: Any
    keyspace: str
    params: Any
    results: dict[str, Any]
    bench: Any = field(repr=False, default=None)
    """The running ``bench.harness.Bench``: ``make_family``, ``compact`` (engine run in a worker
    process), ``read_latency`` (timed client reads) and ``reset_family`` are meant for kinds."""


@dataclass
class KindLine:
    kind: str
    compaction_rows_per_s: float | None
    read_p99_compacted_ms: float | None
    read_p99_fresh_ms: float | None
    exact: bool | None
    note: str = ""

    @property
    def p99_ratio(self) -> float | None:
        if self.read_p99_compacted_ms is None or not self.read_p99_fresh_ms:
            return None
        return self.read_p99_compacted_ms / self.read_p99_fresh_ms

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "p99_compacted_over_fresh": self.p99_ratio}


@kind_line("increments")
def increments(ctx: KindContext) -> KindLine:
    """The engine's first kind: the figures of the compaction and read-latency sections."""
    compaction = ctx.results.get("compaction") or {}
    reads = ctx.results.get("read_latency") or {}
    compacted = (reads.get("counters") or {}).get("compacted") or {}
    fresh = (reads.get("counters") or {}).get("fresh") or {}
    missing = [name for name, data in (("compaction", compaction), ("reads", reads)) if not data]
    return KindLine(
        kind="increments",
        compaction_rows_per_s=compaction.get("rows_per_s"),
        read_p99_compacted_ms=compacted.get("p99_ms"),
        read_p99_fresh_ms=fresh.get("p99_ms"),
        exact=(compaction.get("exactness") or {}).get("exact"),
        note=f"sections not run: {', '.join(missing)}" if missing else "",
    )


# --- shared by the kinds below ---------------------------------------------------------------

DAY = date(2026, 3, 29)
"""The ``calculation_date`` of every bench order (seed 003's composite partition key)."""


def _timed_line(
    ctx: KindContext,
    kind: str,
    family: Any,
    data: Dataset,
    load: dict[str, Any],
    check: Callable[[], tuple[bool, dict[str, Any]]],
    reads: Callable[[], dict[str, Any]],
) -> KindLine:
    """Compact ``family`` (loaded with ``data``) in a worker process exactly as the increments
    line does, check it with ``check`` and time reads with ``reads``; the details go into
    ``ctx.results['kind_details'][kind]``."""
    run = ctx.bench.compact(family, data.epoch, f"kind_{kind}")
    exact, exactness = check()
    latency = reads()
    seconds = run["seconds"]
    summary = run.get("summary") or {}
    ctx.results.setdefault("kind_details", {})[kind] = {
        "load": load,
        "rows": data.row_count,
        "counters": data.counters,
        "ok": run["ok"],
        "error": run["error"],
        "seconds": round(seconds, 3),
        "phases_s": summary.get("durations_s"),
        "tally": {
            k: summary.get(k)
            for k in ("counters_committed", "rows_folded", "rows_deleted", "conflicts")
        },
        "requests": run.get("requests"),
        "rss_peak_kb": run["rss_peak_kb"],
        "exactness": exactness,
        "read_latency": latency,
    }
    ctx.bench.say(
        f"kind {kind}: {seconds:.1f} s ({data.row_count / seconds:,.0f} rows/s), exact={exact}"
    )
    return KindLine(
        kind=kind,
        compaction_rows_per_s=round(data.row_count / seconds) if run["ok"] else None,
        read_p99_compacted_ms=latency["compacted"]["p99_ms"],
        read_p99_fresh_ms=latency["fresh"]["p99_ms"],
        exact=bool(run["ok"] and exact),
        note=f"{data.counters:,} counters x {data.rows} rows"
        + ("" if run["ok"] else f"; run failed: {run['error']}"),
    )


def _read_p99(
    ctx: KindContext, client: Any, keys: dict[str, Any], expect: dict[str, int]
) -> dict[str, Any]:
    """``CounterClient.read`` timed on a compacted and a fresh counter, values checked."""
    stats = ctx.bench.read_latency(client.read, keys, ctx.params.reads)
    for name, key in keys.items():
        stats[name]["value_exact"] = client.read(key) == expect[name]
    return stats


def _minutes(ctx: KindContext) -> list[datetime]:
    """One moment a minute over the read history, ending two minutes ago."""
    now_min = utc_now().replace(second=0, microsecond=0)
    start = now_min - timedelta(minutes=ctx.params.history_minutes + 2)
    return [table_time(start + timedelta(minutes=k)) for k in range(ctx.params.history_minutes)]


# --- rows: business rows counted, never deleted -------------------------------------------------


def _orders_family(ctx: KindContext, name: str) -> tuple[Any, Any, Any, Any]:
    """Seed 003's location_orders: the business table (created here, as the application would),
    then a ``rows`` family over it; returns (family, store, client, insert statement)."""
    table = f"{name}_orders"
    ctx.conn.session.execute(
        f"CREATE TABLE IF NOT EXISTS {q(ctx.keyspace)}.{q(table)} (location_id int, "
        "calculation_date date, timestamp timeuuid, order_id int, "
        "PRIMARY KEY ((location_id, calculation_date), timestamp, order_id)) "
        "WITH CLUSTERING ORDER BY (timestamp ASC, order_id ASC)"
    )
    family, store, client = ctx.bench.make_family(
        name,
        kind="rows",
        raw_table=table,
        columns={"key": ["location_id", "calculation_date"], "time": "timestamp"},
    )
    insert = ctx.conn.session.prepare(
        f"INSERT INTO {q(ctx.keyspace)}.{q(table)} (location_id, calculation_date, timestamp, "
        "order_id) VALUES (?, ?, ?, ?)"
    )
    return family, store, client, insert


def _insert_orders(ctx: KindContext, insert: Any, orders: Sequence[tuple[int, datetime, int]]):
    """(location, moment, order id) rows, one unlogged batch per location."""
    by_location: dict[int, BatchStatement] = {}
    for location, moment, order_id in orders:
        batch = by_location.setdefault(location, BatchStatement(batch_type=BatchType.UNLOGGED))
        batch.add(insert, (location, DAY, uuid_from_time(moment), order_id))
    run_concurrent(ctx.conn.session, [(b, None) for b in by_location.values()], 64)


@kind_line("rows")
def rows(ctx: KindContext) -> KindLine:
    """``counters`` locations x ``rows_per_counter`` orders (seed 003's table: composite key,
    timeuuid clustering), counted by one run; the business rows must all still be there."""
    p = ctx.params
    t0 = (utc_now() - timedelta(days=2)).replace(second=0, microsecond=0)
    data = Dataset("o", p.counters, p.rows_per_counter, t0)
    family, _store, _client, insert = _orders_family(ctx, "kind_rows")
    ctx.bench.say(f"kind rows: loading {data.row_count:,} business rows")
    with Meter(ctx.bench.server) as meter:
        for chunk in chunked(list(data.indexes()), 5000):
            _insert_orders(
                ctx, insert, [(i, data.time(i, j), j) for i in chunk for j in range(data.rows)]
            )
    load = {**meter.as_dict(), "rows_per_s": round(data.row_count / meter.seconds)}
    key = ["location_id", "calculation_date"]

    def check() -> tuple[bool, dict[str, Any]]:
        found = scan_values(ctx.conn, ctx.keyspace, family.compact_table, key, "count")
        expected = {(i, Date(DAY)): data.rows for i in data.indexes()}  # as the driver reads
        counted = compare(expected, found, raw_rows_left=0).as_dict()
        business = count_rows(ctx.conn, ctx.keyspace, family.raw_table, key)
        exact = counted["exact"] and business == data.row_count
        return exact, {**counted, "business_rows_after": business}

    def reads() -> dict[str, Any]:
        _r_family, r_store, r_client, r_insert = _orders_family(ctx, "kind_rows_reads")
        history = _minutes(ctx)
        _insert_orders(ctx, r_insert, [(1, moment, k) for k, moment in enumerate(history)])
        engine.run_family(r_store, history[-1] + timedelta(seconds=1), now=utc_now())
        _insert_orders(ctx, r_insert, [(2, table_time(utc_now()), 0)])
        return _read_p99(
            ctx,
            r_client,
            {"compacted": (1, DAY), "fresh": (2, DAY)},
            {"compacted": len(history), "fresh": 1},
        )

    return _timed_line(ctx, "rows", family, data, load, check, reads)


# --- unique: first-write-wins members, counted once ----------------------------------------------


@kind_line("unique")
def unique(ctx: KindContext) -> KindLine:
    """``counters`` meetings x ``rows_per_counter`` members through ``add_members`` (then a
    tenth of them again, later: retries must not count), folded and deleted by one run."""
    p = ctx.params
    t0 = (utc_now() - timedelta(days=2)).replace(second=0, microsecond=0)
    data = Dataset("m", p.counters, p.rows_per_counter, t0)
    fields = {"kind": "unique", "columns": {"key": "meeting", "member": "user"}}
    family, _store, client = ctx.bench.make_family("kind_unique", **fields)
    ctx.bench.say(f"kind unique: adding {data.row_count:,} members through add_members")
    retried = 0
    with Meter(ctx.bench.server) as meter:
        for j in range(data.rows):
            for chunk in chunked(list(data.indexes()), 5000):
                client.add_members(
                    [(data.key(i), f"u{j}") for i in chunk],
                    at=(t0 + data.step * j).replace(tzinfo=UTC),
                )
        for chunk in chunked(list(data.indexes())[::10], 5000):
            firsts = client.add_members(
                [(data.key(i), "u0") for i in chunk], at=data.epoch.replace(tzinfo=UTC)
            )
            if any(firsts):
                raise AssertionError("a retried add_member answered 'first'")
            retried += len(chunk)
    ctx.bench.marks_at[family.name] = time.time()
    load = {
        **meter.as_dict(),
        "members_per_s": round((data.row_count + retried) / meter.seconds),
        "retried_members": retried,
    }

    def check() -> tuple[bool, dict[str, Any]]:
        found = scan_values(ctx.conn, ctx.keyspace, family.compact_table, ["meeting"], "value")
        left = count_rows(ctx.conn, ctx.keyspace, family.fold_table, ["meeting"])
        counted = compare({data.key(i): data.rows for i in data.indexes()}, found, left)
        return counted.exact, counted.as_dict()

    def reads() -> dict[str, Any]:
        _r_family, r_store, r_client = ctx.bench.make_family("kind_unique_reads", **fields)
        history = _minutes(ctx)
        for k, moment in enumerate(history):
            r_client.add_member("compacted", f"u{k}", at=moment.replace(tzinfo=UTC))
        engine.run_family(r_store, history[-1] + timedelta(seconds=1), now=utc_now())
        r_client.add_member("fresh", "u0")
        return _read_p99(
            ctx,
            r_client,
            {"compacted": ("compacted",), "fresh": ("fresh",)},
            {"compacted": len(history), "fresh": 1},
        )

    return _timed_line(ctx, "unique", family, data, load, check, reads)


def kinds(bench: Any) -> None:
    """The ``kinds`` section: a line per kind (``--kind``), on the running ``harness.Bench``."""
    ctx = KindContext(bench.conn, bench.keyspace, bench.p, bench.results, bench)
    bench.results["kinds"] = {}
    for name, func in KINDS.items():  # one failing kind does not hide the others' lines
        if bench.p.kinds and name not in bench.p.kinds:
            continue
        try:
            bench.results["kinds"][name] = func(ctx).as_dict()
        except Exception as exc:
            bench.say(f"kind {name} failed: {type(exc).__name__}: {exc}")
            bench.results.setdefault("errors", {})[f"kinds.{name}"] = f"{type(exc).__name__}: {exc}"
