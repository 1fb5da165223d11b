"""Probes: the cost of the building blocks a faster engine could use, on this node, in this run.

They do not run the engine. They answer "what would X cost per counter?" for the choices the
engine makes per counter: a compare-and-set (Paxos) per counter, a plain write per counter, a
conditional batch covering many counters of one partition, a multi-partition unlogged batch.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from cassandra import ConsistencyLevel
from cassandra.concurrent import execute_concurrent
from cassandra.query import BatchStatement, BatchType
from cassandra.util import uuid_from_time
from counters.connection import Connection
from counters.core import write_timestamp
from counters.schema import q

from .ops import (
    Dataset,
    Meter,
    chunked,
    count_rows,
    load_twin,
    naive_ddl,
    run_concurrent,
    scan_raw,
    utc_now,
)

if TYPE_CHECKING:
    from .harness import Bench


def _setting(conn: Connection, name: str) -> str | None:
    try:
        row = conn.session.execute(
            "SELECT value FROM system_views.settings WHERE name = %s", (name,)
        ).one()
    except Exception:
        return None
    return row.value if row else None


def commit_costs(
    conn: Connection, keyspace: str, counters: int, server: int | None, bucket_size: int = 50
) -> dict[str, Any]:
    """Writes of ``counters`` compact-like rows, four ways, each at concurrency 64."""
    session = conn.session
    ks = q(keyspace)
    session.execute(
        f"CREATE TABLE IF NOT EXISTS {ks}.probe_rows (type text PRIMARY KEY, value bigint, "
        "commit_id timeuuid)"
    )
    session.execute(
        f"CREATE TABLE IF NOT EXISTS {ks}.probe_buckets (bucket int, type text, value bigint, "
        "commit_id timeuuid, PRIMARY KEY ((bucket), type))"
    )
    for table in ("probe_rows", "probe_buckets"):
        session.execute(f"TRUNCATE {ks}.{table}", timeout=120)
    keys = [f"p{i:07d}" for i in range(counters)]
    first = uuid_from_time(time.time())
    plain = session.prepare(f"UPDATE {ks}.probe_rows SET value = ?, commit_id = ? WHERE type = ?")
    cas = session.prepare(
        f"UPDATE {ks}.probe_rows SET value = ?, commit_id = ? WHERE type = ? IF commit_id = ?"
    )
    cas.serial_consistency_level = ConsistencyLevel.LOCAL_SERIAL
    bucket_plain = session.prepare(
        f"UPDATE {ks}.probe_buckets SET value = ?, commit_id = ? WHERE bucket = ? AND type = ?"
    )
    bucket_cas = session.prepare(
        f"UPDATE {ks}.probe_buckets SET value = ?, commit_id = ? WHERE bucket = ? AND type = ? "
        "IF commit_id = ?"
    )
    out: dict[str, Any] = {
        "counters": counters,
        "paxos_variant": _setting(conn, "paxos_variant"),
        "concurrency": 64,
    }

    def timed(name: str, statements: list[tuple[Any, Any]], rows: int) -> None:
        with Meter(server) as meter:
            run_concurrent(session, statements, 64)
        out[name] = {
            **meter.as_dict(),
            "requests": len(statements),
            "rows": rows,
            "rows_per_s": round(rows / meter.seconds),
        }

    # 1. a plain write per counter (seeds the rows the CAS below compares against)
    timed("plain_write_per_counter", [(plain, (1, first, k)) for k in keys], counters)
    # 2. a CAS per counter, as Store.commit does
    second = uuid_from_time(time.time())
    timed("cas_per_counter", [(cas, (2, second, k, first)) for k in keys], counters)
    # 3. many counters of one partition: seed, then one conditional batch per partition
    buckets = list(chunked(keys, bucket_size))
    seed_batches = []
    cas_batches = []
    for b, members in enumerate(buckets):
        seed = BatchStatement(batch_type=BatchType.UNLOGGED)
        batch = BatchStatement(batch_type=BatchType.LOGGED)
        batch.serial_consistency_level = ConsistencyLevel.LOCAL_SERIAL
        for k in members:
            seed.add(bucket_plain, (1, first, b, k))
            batch.add(bucket_cas, (2, second, b, k, first))
        seed_batches.append((seed, None))
        cas_batches.append((batch, None))
    run_concurrent(session, seed_batches, 64)
    timed(f"cas_batch_{bucket_size}_counters_per_partition", cas_batches, counters)
    applied = sum(
        1 for r in session.execute(f"SELECT value FROM {ks}.probe_buckets") if r.value == 2
    )
    out[f"cas_batch_{bucket_size}_counters_per_partition"]["rows_applied"] = applied
    # 4. plain writes, 10 partitions per unlogged batch (what a fence-based commit could use)
    multi = []
    third = uuid_from_time(time.time())
    for members in chunked(keys, 10):
        batch = BatchStatement(batch_type=BatchType.UNLOGGED)
        for k in members:
            batch.add(plain, (3, third, k))
        multi.append((batch, None))
    timed("plain_write_batch_10_partitions", multi, counters)
    for table in ("probe_rows", "probe_buckets"):
        session.execute(f"TRUNCATE {ks}.{table}", timeout=120)
    return out


def _load_probe_raw(conn: Connection, keyspace: str, data: Dataset) -> None:
    conn.session.execute(f"TRUNCATE {q(keyspace)}.probe_raw", timeout=120)
    load_twin(conn, keyspace, "probe_raw", data)


def fold_io_costs(
    conn: Connection, keyspace: str, counters: int, server: int | None, t0: datetime
) -> dict[str, Any]:
    """Reading every row of ``counters`` counters three ways, then deleting them three ways.

    Reads: one request per counter; ``IN`` over 50 counters per request (what Store does);
    token-range scans of the whole table. Deletes: single-row deletes in unlogged batches of
    10 counters (what Store.raw.delete_rows does); one multi-column ``IN`` delete per counter
    (``DELETE ... WHERE type = ? AND (modify_time, actor, version) IN ?``); the same, 10
    counters per unlogged batch."""
    session = conn.session
    ks = q(keyspace)
    raw = naive_ddl(keyspace, "probe_raw", "probe_unused")[0]
    session.execute(raw)
    data = Dataset("r", counters, 10, t0)
    keys = [data.key(i)[0] for i in data.indexes()]
    rows = data.row_count
    out: dict[str, Any] = {"counters": counters, "rows": rows}
    _load_probe_raw(conn, keyspace, data)

    def timed(name: str, func: Any) -> Any:
        with Meter(server) as meter:
            got = func()
        out[name] = {**meter.as_dict(), "rows_per_s": round(rows / meter.seconds)}
        return got

    one = session.prepare(
        f"SELECT modify_time, actor, version, increment FROM {ks}.probe_raw WHERE type = ?"
    )
    many = session.prepare(
        f"SELECT type, modify_time, actor, version, increment FROM {ks}.probe_raw WHERE type IN ?"
    )

    def per_counter() -> int:
        results = execute_concurrent(
            session,
            [(one, (k,)) for k in keys],
            concurrency=64,
            raise_on_first_error=True,
            execution_profile="bulk",
        )
        return sum(len(list(r)) for _ok, r in results)

    def in_50() -> int:
        results = execute_concurrent(
            session,
            [(many, (list(chunk),)) for chunk in chunked(keys, 50)],
            concurrency=64,
            raise_on_first_error=True,
            execution_profile="bulk",
        )
        return sum(len(list(r)) for _ok, r in results)

    family_like = _FamilyLike(keyspace)
    read_counts = {
        "read_per_counter": timed("read_per_counter", per_counter),
        "read_in_50": timed("read_in_50", in_50),
        "read_token_ranges": timed("read_token_ranges", lambda: scan_raw(conn, family_like)[0]),
    }
    out["reads_complete"] = all(v == rows for v in read_counts.values())

    row_delete = session.prepare(
        f"DELETE FROM {ks}.probe_raw USING TIMESTAMP ? WHERE type = ? AND modify_time = ? "
        "AND actor = ? AND version = ?"
    )
    in_delete = session.prepare(
        f"DELETE FROM {ks}.probe_raw USING TIMESTAMP ? WHERE type = ? "
        "AND (modify_time, actor, version) IN ?"
    )
    ts = write_timestamp(t0 + timedelta(days=1))

    def clusterings(i: int) -> list[tuple]:
        return [(data.time(i, j), "bench", j) for j in range(data.rows)]

    def batched_row_deletes() -> None:
        batches = []
        for group in chunked(list(data.indexes()), 10):
            batch = BatchStatement(batch_type=BatchType.UNLOGGED)
            for i in group:
                for c in clusterings(i):
                    batch.add(row_delete, (ts, data.key(i)[0], *c))
            batches.append((batch, None))
        run_concurrent(session, batches, 64)

    def in_delete_per_counter() -> None:
        run_concurrent(
            session, [(in_delete, (ts, data.key(i)[0], clusterings(i))) for i in data.indexes()], 64
        )

    def in_delete_batched() -> None:
        batches = []
        for group in chunked(list(data.indexes()), 10):
            batch = BatchStatement(batch_type=BatchType.UNLOGGED)
            for i in group:
                batch.add(in_delete, (ts, data.key(i)[0], clusterings(i)))
            batches.append((batch, None))
        run_concurrent(session, batches, 64)

    for name, func in (
        ("delete_rows_batched_10_counters", batched_row_deletes),
        ("delete_in_per_counter", in_delete_per_counter),
        ("delete_in_batched_10_counters", in_delete_batched),
    ):
        if name != "delete_rows_batched_10_counters":
            _load_probe_raw(conn, keyspace, data)
        timed(name, func)
        out[name]["rows_left"] = count_rows(conn, keyspace, "probe_raw", ["type"])
    session.execute(f"TRUNCATE {ks}.probe_raw", timeout=120)
    return out


class _FamilyLike:
    """Just enough of a Family for ``scan_raw`` over the probe's seed-schema table."""

    def __init__(self, keyspace: str):
        from counters.config import Columns

        self.keyspace = keyspace
        self.raw_table = "probe_raw"
        self.columns = Columns()


def nagle_costs(
    conn: Connection, keyspace: str, server: int | None, requests: int = 50
) -> dict[str, Any]:
    """One synchronous insert after another, of 1 KB, 25 KB and 100 KB blobs, on a connection
    with Nagle's algorithm on (the driver's default) and off (``build_cluster``'s
    ``TCP_NODELAY``): a request over one TCP segment waits for the node's delayed ACK with it on."""
    from counters.connection import build_cluster

    ks = q(keyspace)
    conn.session.execute(f"CREATE TABLE IF NOT EXISTS {ks}.probe_blobs (k int PRIMARY KEY, b blob)")
    out: dict[str, Any] = {}
    for nodelay in (False, True):
        cluster = build_cluster(conn.settings)
        if not nodelay:
            cluster.sockopts = None  # the driver's default
        try:
            session = cluster.connect()
            insert = session.prepare(f"INSERT INTO {ks}.probe_blobs (k, b) VALUES (?, ?)")
            for size in (1_000, 25_000, 100_000):
                blob = bytes(size)
                for k in range(5):  # warm the connection and the statement
                    session.execute(insert, (k, blob))
                with Meter(server) as meter:
                    for k in range(requests):
                        session.execute(insert, (k, blob))
                out[f"insert_{size // 1000}kb_nodelay_{'on' if nodelay else 'off'}"] = {
                    **meter.as_dict(),
                    "rows_per_s": round(requests / meter.seconds),
                    "ms_per_request": round(meter.seconds / requests * 1000, 2),
                }
        finally:
            cluster.shutdown()
    conn.session.execute(f"DROP TABLE {ks}.probe_blobs")
    return out


def probes(bench: Bench) -> None:
    """The ``probes`` section: the three probes above, on the bench's keyspace."""
    size = min(bench.p.counters, 20_000)
    bench.say(f"probes: {size:,} commits four ways")
    t0 = (utc_now() - timedelta(days=3)).replace(second=0, microsecond=0)
    bench.results["probes"] = {
        "commit": commit_costs(bench.conn, bench.keyspace, size, bench.server),
        "fold_io": fold_io_costs(bench.conn, bench.keyspace, size, bench.server, t0),
        "nagle": nagle_costs(bench.conn, bench.keyspace, bench.server),
    }
