"""Building blocks of the benchmark: synthetic data, bulk loaders, the scan floor, the naive peer,
exactness checks, and CPU/latency accounting. ``bench`` puts them together.

Only the benchmark's own shortcuts live here (bulk-written compact rows for idle counters, the
naive peer's tables); the project's data goes through the project's write path
(``CounterClient.record``) and is compacted by the project's engine.
"""

from __future__ import annotations

import math
import os
import platform
import re
import resource
import subprocess
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from cassandra.concurrent import execute_concurrent
from cassandra.query import BatchStatement, BatchType
from counters import compaction
from counters.client import CounterClient, Increment
from counters.config import Family
from counters.connection import BULK_PROFILE, Connection
from counters.core import shard_bounds, table_time, utc_aware, write_timestamp
from counters.schema import q

# --- accounting ----------------------------------------------------------------------------


def server_pid(port: int) -> int | None:
    """The pid of the local process listening on ``port`` (the Cassandra node), if visible."""
    try:
        import psutil

        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
                return conn.pid
    except Exception:  # remote cluster, no permission: server CPU is then not reported
        return None
    return None


def _proc_cpu_s(pid: int | None) -> float | None:
    if pid is None:
        return None
    try:
        import psutil

        times = psutil.Process(pid).cpu_times()
        return times.user + times.system
    except Exception:
        return None


_THREAD_NUMBER = re.compile(r"[-:#_ ]?\d+$")
_REQUEST_STAGES = (
    "ReadStage",
    "MutationStage",
    "Native-Transpor",
    "CounterMutation",
    "ViewMutation",
)
"""Cassandra's shared worker pool renames its threads after the stage they serve at the moment,
so those threads' CPU is one group: serving requests (reads, writes, Paxos)."""


def thread_cpu_s(pid: int | None) -> dict[int, tuple[str, float]]:
    """Per thread of a (local) process: its name and its CPU seconds so far."""
    if pid is None:
        return {}
    tick = os.sysconf("SC_CLK_TCK")
    threads: dict[int, tuple[str, float]] = {}
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return {}
    for task in tasks:
        try:
            stat = (task / "stat").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        threads[int(task.name)] = (name, (int(fields[11]) + int(fields[12])) / tick)
    return threads


def thread_groups(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]
) -> dict[str, float]:
    """CPU seconds spent between two ``thread_cpu_s`` snapshots, per thread group: the thread
    names without their numbers (``CompactionExec``, ``GC Thread``, ``C2 CompilerThre``, ...),
    the request stages as one group, largest first."""
    groups: dict[str, float] = {}
    for tid, (name, seconds) in after.items():
        spent = seconds - before.get(tid, (name, 0.0))[1]
        group = _THREAD_NUMBER.sub("", name).strip() or name
        if group.startswith(_REQUEST_STAGES):
            group = "request stages"
        groups[group] = groups.get(group, 0.0) + spent
    return {k: round(v, 2) for k, v in sorted(groups.items(), key=lambda kv: -kv[1]) if v >= 0.05}


_BACKGROUND_POOLS = ("CompactionExecutor", "MemtableFlushWriter", "MemtablePostFlush")
"""The node's thread pools whose work is left over from earlier writes: SSTable compactions and
memtable flushes."""


def node_background_tasks(conn: Connection) -> int:
    """Active and pending tasks of the node's compactions and flushes (``system_views``, the
    node the session asks), and SSTable operations under way."""
    rows = conn.session.execute(
        "SELECT name, active_tasks, pending_tasks FROM system_views.thread_pools"
    )
    pools = sum(r.active_tasks + r.pending_tasks for r in rows if r.name in _BACKGROUND_POOLS)
    return pools + len(list(conn.session.execute("SELECT kind FROM system_views.sstable_tasks")))


def wait_for_quiet_node(conn: Connection, most_s: float = 60.0, poll_s: float = 0.5) -> float:
    """Wait until the node has no compaction or flush left from earlier writes (at most
    ``most_s``: a minute's schedule gives them no more) -> the seconds waited. A measured step
    started while the node still compacts an earlier step's tables is charged that work: the
    warm-up's compactions ran through the scan floor and the first 8 s of the first run."""
    start = time.perf_counter()
    while node_background_tasks(conn) and time.perf_counter() - start < most_s:
        time.sleep(poll_s)
    return time.perf_counter() - start


def flush_tables(keyspace: str, tables: Sequence[str], instance: str | None) -> str:
    """``nodetool flush`` of ``keyspace``'s ``tables`` on the local node ``instance`` (the
    memtables of a step done: written out now, not by the commit log's flush in the middle of
    the next measured step, which then also compacts them) -> what was done, for the report."""
    if not instance:
        return "not flushed: no local instance (CASSANDRA_LOCAL_INSTANCE)"
    script = Path(__file__).resolve().parents[1] / "scripts" / "cassandra_node.py"
    cmd = [sys.executable, str(script), "nodetool", "--instance", instance, "--"]
    proc = subprocess.run(
        [*cmd, "flush", keyspace, *tables], capture_output=True, text=True, timeout=300
    )
    if proc.returncode != 0:
        said = (proc.stderr.strip() or proc.stdout.strip()).splitlines() or [""]
        return f"not flushed: nodetool exited {proc.returncode}: {said[0][:300]}"
    return f"flushed {keyspace}: {', '.join(tables)}"


@dataclass
class Meter:
    """Wall time, this process's CPU and (when local) the Cassandra node's CPU over a block,
    with the node's CPU per thread group (threads that ended inside the block are not counted
    there, so the groups may sum to less than ``server_cpu_s``)."""

    server: int | None = None
    seconds: float = 0.0
    client_cpu_s: float = 0.0
    server_cpu_s: float | None = None
    loadavg_1m: float | None = None
    server_threads: dict[str, float] = field(default_factory=dict)

    def __enter__(self) -> Meter:
        self._t = time.perf_counter()
        usage = resource.getrusage(resource.RUSAGE_SELF)
        self._c = usage.ru_utime + usage.ru_stime
        self._s = _proc_cpu_s(self.server)
        self._threads = thread_cpu_s(self.server)
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self._t
        usage = resource.getrusage(resource.RUSAGE_SELF)
        self.client_cpu_s = usage.ru_utime + usage.ru_stime - self._c
        end = _proc_cpu_s(self.server)
        self.server_cpu_s = None if end is None or self._s is None else end - self._s
        self.server_threads = thread_groups(self._threads, thread_cpu_s(self.server))
        try:
            self.loadavg_1m = os.getloadavg()[0]
        except OSError:
            self.loadavg_1m = None

    def as_dict(self) -> dict[str, float | None]:
        return {
            "seconds": round(self.seconds, 4),
            "client_cpu_s": round(self.client_cpu_s, 3),
            "server_cpu_s": None if self.server_cpu_s is None else round(self.server_cpu_s, 3),
            "loadavg_1m_after": self.loadavg_1m,
            "server_cpu_by_thread_s": self.server_threads or None,
        }


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile (no interpolation) of a non-empty sample."""
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]


def utc_now() -> datetime:
    """Now, UTC, naive (as the engine and the raw tables take times)."""
    return datetime.now(UTC).replace(tzinfo=None)


# --- synthetic data ------------------------------------------------------------------------


@dataclass(frozen=True)
class Dataset:
    """``counters`` x ``rows`` increments, deterministic: row j of counter i is at
    ``t0 + j*step + (i % 997) ms`` with increment ``1 + (7i + 13j) % 100``; every row is at or
    below ``epoch``."""

    prefix: str
    counters: int
    rows: int
    t0: datetime
    step: timedelta = timedelta(seconds=6)
    start: int = 0

    def key(self, i: int) -> tuple[str]:
        return (f"{self.prefix}{i:07d}",)

    def indexes(self) -> range:
        return range(self.start, self.start + self.counters)

    @property
    def epoch(self) -> datetime:
        return table_time(self.t0 + self.step * self.rows + timedelta(seconds=1))

    @staticmethod
    def increment(i: int, j: int) -> int:
        return 1 + (7 * i + 13 * j) % 100

    def time(self, i: int, j: int) -> datetime:
        return table_time(self.t0 + self.step * j + timedelta(milliseconds=i % 997))

    def total(self, i: int) -> int:
        return sum(self.increment(i, j) for j in range(self.rows))

    def expected(self) -> dict[tuple[str], int]:
        return {self.key(i): self.total(i) for i in self.indexes()}

    @property
    def row_count(self) -> int:
        return self.counters * self.rows

    def next_round(self) -> Dataset:
        """As many increments again on the same counters, every one after this round's epoch
        (what a family's next run folds)."""
        return replace(self, t0=self.epoch + timedelta(seconds=1))

    def events(self, indexes: Sequence[int]) -> list[Increment]:
        return [
            Increment(self.key(i), self.increment(i, j), utc_aware(self.time(i, j)), ("bench", j))
            for i in indexes
            for j in range(self.rows)
        ]


def chunked(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def load_write_path(client: CounterClient, data: Dataset, chunk_counters: int = 2000) -> int:
    """Every row through the project's write path: ``CounterClient.record`` (index marks first,
    then the raw rows batched per counter)."""
    indexes = list(data.indexes())
    for chunk in chunked(indexes, chunk_counters):
        client.record(data.events(chunk))
    return data.row_count


# --- the naive peer's tables ---------------------------------------------------------------


def naive_ddl(keyspace: str, raw: str, compact: str) -> list[str]:
    """The seed's two tables, as the seed's documents give them."""
    ks = q(keyspace)
    return [
        f"CREATE TABLE IF NOT EXISTS {ks}.{q(raw)} (type text, modify_time timestamp, actor text, "
        "version bigint, increment bigint, PRIMARY KEY ((type), modify_time, actor, version)) "
        "WITH CLUSTERING ORDER BY (modify_time DESC, actor ASC, version ASC)",
        f"CREATE TABLE IF NOT EXISTS {ks}.{q(compact)} (type text PRIMARY KEY, value bigint, "
        "epoch timestamp)",
    ]


def run_concurrent(session: Any, statements: Sequence[tuple[Any, Any]], concurrency: int) -> None:
    if statements:
        execute_concurrent(session, statements, concurrency=concurrency, raise_on_first_error=True)


def load_twin(
    conn: Connection, keyspace: str, raw: str, data: Dataset, concurrency: int = 64
) -> None:
    """The same rows (same keys, times, identities, increments, write timestamps) into the naive
    peer's raw table: one unlogged batch per counter, executed concurrently."""
    session = conn.session
    insert = session.prepare(
        f"INSERT INTO {q(keyspace)}.{q(raw)} (type, modify_time, actor, version, increment) "
        "VALUES (?, ?, ?, ?, ?) USING TIMESTAMP ?"
    )
    indexes = list(data.indexes())
    for chunk in chunked(indexes, 5000):
        batches = []
        for i in chunk:
            batch = BatchStatement(batch_type=BatchType.UNLOGGED)
            for j in range(data.rows):
                moment = data.time(i, j)
                batch.add(
                    insert,
                    (
                        data.key(i)[0],
                        moment,
                        "bench",
                        j,
                        data.increment(i, j),
                        write_timestamp(moment),
                    ),
                )
            batches.append((batch, None))
        run_concurrent(session, batches, concurrency)


# --- token-range scans ---------------------------------------------------------------------


class RangeScan:
    """Read a whole table once: ``ranges`` token ranges, at most ``concurrency`` in flight,
    each paged (``fetch_size``), rows handed to ``handle`` as they arrive (driver thread)."""

    def __init__(
        self,
        session: Any,
        cql: str,
        ranges: int,
        concurrency: int,
        handle: Callable[[list[tuple]], None],
        fetch_size: int = 5000,
    ):
        self.session = session
        self.statement = session.prepare(cql)
        self.statement.fetch_size = fetch_size
        self.bounds = deque(shard_bounds(ranges))
        self.concurrency = concurrency
        self.handle = handle
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.in_flight = 0
        self.error: BaseException | None = None
        self.pages = 0

    def run(self, timeout: float = 3600) -> None:
        for _ in range(min(self.concurrency, len(self.bounds))):
            self._next()
        if not self.done.wait(timeout):
            raise TimeoutError("range scan did not finish")
        if self.error is not None:
            raise self.error

    def _next(self) -> None:
        with self.lock:
            if not self.bounds or self.error is not None:
                if self.in_flight == 0:
                    self.done.set()
                return
            lo, hi = self.bounds.popleft()
            self.in_flight += 1
        future = self.session.execute_async(
            self.statement, (lo, hi), execution_profile=BULK_PROFILE
        )
        future.add_callbacks(self._page, self._fail, callback_args=(future,))

    def _page(self, rows: list[tuple], future: Any) -> None:
        try:
            self.handle(rows)
            self.pages += 1
        except BaseException as exc:
            self._fail(exc)
            return
        if future.has_more_pages:
            future.start_fetching_next_page()
            return
        with self.lock:
            self.in_flight -= 1
        self._next()

    def _fail(self, exc: BaseException, *_: Any) -> None:
        with self.lock:
            if self.error is None:
                self.error = exc
            self.in_flight -= 1
            if self.in_flight <= 0:
                self.done.set()


def scan_raw(
    conn: Connection, family: Family, ranges: int = 64, concurrency: int = 16
) -> tuple[int, int]:
    """The scan floor: every raw row of the family read once -> (rows, sum of increments)."""
    cols = family.columns
    key = ", ".join(q(k) for k in cols.key)
    table = f"{q(family.keyspace)}.{q(family.raw_table)}"
    totals = [0, 0]
    lock = threading.Lock()

    def handle(rows: list[tuple]) -> None:
        s = sum(r[-1] for r in rows)
        with lock:
            totals[0] += len(rows)
            totals[1] += s

    RangeScan(
        conn.session,
        f"SELECT {key}, {q(cols.time)}, actor, version, {q(cols.increment)} FROM {table} "
        f"WHERE token({key}) > ? AND token({key}) <= ?",
        ranges,
        concurrency,
        handle,
    ).run()
    return totals[0], totals[1]


def scan_values(
    conn: Connection, keyspace: str, table: str, key: Sequence[str], value: str, ranges: int = 32
) -> dict[tuple, int]:
    """Every row's ``value`` of a table keyed by ``key`` (a compact table), by token ranges."""
    cols = ", ".join(q(k) for k in key)
    out: dict[tuple, int] = {}
    lock = threading.Lock()
    width = len(key)

    def handle(rows: list[tuple]) -> None:
        with lock:
            for r in rows:
                out[tuple(r[:width])] = r[width]

    RangeScan(
        conn.session,
        f"SELECT {cols}, {q(value)} FROM {q(keyspace)}.{q(table)} "
        f"WHERE token({cols}) > ? AND token({cols}) <= ?",
        ranges,
        8,
        handle,
    ).run()
    return out


def count_rows(
    conn: Connection, keyspace: str, table: str, key: Sequence[str], ranges: int = 32
) -> int:
    """Live rows of a table, read in ``ranges`` token ranges: a range holding more than the
    node's ``tombstone_failure_threshold`` (100,000) tombstones per page fails, so a table of
    many folds is read in more ranges."""
    cols = ", ".join(q(k) for k in key)
    total = [0]
    lock = threading.Lock()

    def handle(rows: list[tuple]) -> None:
        with lock:
            total[0] += len(rows)

    RangeScan(
        conn.session,
        f"SELECT {cols} FROM {q(keyspace)}.{q(table)} "
        f"WHERE token({cols}) > ? AND token({cols}) <= ?",
        ranges,
        8,
        handle,
    ).run()
    return total[0]


@dataclass
class Exactness:
    """Compact values against the expected totals, and raw rows left at or below the epoch."""

    counters_expected: int
    counters_found: int
    mismatches: int
    missing: int
    sum_expected: int
    sum_found: int
    raw_rows_left: int
    examples: list[str] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        return (
            self.mismatches == 0
            and self.missing == 0
            and self.sum_expected == self.sum_found
            and self.raw_rows_left == 0
        )

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "exact": self.exact}


def compare(expected: dict[tuple, int], found: dict[tuple, int], raw_rows_left: int) -> Exactness:
    mismatches = missing = 0
    examples: list[str] = []
    for key, value in expected.items():
        got = found.get(key)
        if got is None:
            missing += 1
        elif got != value:
            mismatches += 1
        else:
            continue
        if len(examples) < 5:
            examples.append(f"{key}: expected {value}, found {got}")
    return Exactness(
        counters_expected=len(expected),
        counters_found=sum(1 for k in expected if k in found),
        mismatches=mismatches,
        missing=missing,
        sum_expected=sum(expected.values()),
        sum_found=sum(found.get(k, 0) for k in expected),
        raw_rows_left=raw_rows_left,
        examples=examples,
    )


# --- the naive peer ------------------------------------------------------------------------


def naive_compact(conn: Connection, keyspace: str, raw: str, compact: str, epoch: datetime) -> int:
    """The seed's algorithm, plainly: find the counters, then one counter at a time, each call
    synchronous: read the compact row, sum the increments at or below the epoch (server-side
    ``sum``), write the compact row, delete the folded range. Returns counters processed."""
    session = conn.session
    ks = q(keyspace)
    read_compact = session.prepare(f"SELECT value, epoch FROM {ks}.{q(compact)} WHERE type = ?")
    sum_rows = session.prepare(
        f"SELECT sum(increment) FROM {ks}.{q(raw)} WHERE type = ? AND modify_time <= ?"
    )
    write_compact = session.prepare(
        f"INSERT INTO {ks}.{q(compact)} (type, value, epoch) VALUES (?, ?, ?)"
    )
    delete_range = session.prepare(f"DELETE FROM {ks}.{q(raw)} WHERE type = ? AND modify_time <= ?")
    counters = [row.type for row in session.execute(f"SELECT DISTINCT type FROM {ks}.{q(raw)}")]
    for counter in counters:
        row = session.execute(read_compact, (counter,)).one()
        value = row.value if row is not None and row.value is not None else 0
        folded = session.execute(sum_rows, (counter, epoch)).one()[0] or 0
        session.execute(write_compact, (counter, value + folded, epoch))
        session.execute(delete_range, (counter, epoch))
    return len(counters)


# --- idle counters, the cheap honest way -----------------------------------------------------


def write_folded_compact_rows(
    conn: Connection,
    family: Family,
    rows: Sequence[tuple[tuple, int]],
    epoch: datetime,
    pending_rows: int,
    concurrency: int = 64,
    per_batch: int = 10,
) -> None:
    """Counters as an earlier run of the engine leaves them after its cleanup: a ledger row
    (value, epoch, and the ``pending`` list of the ``pending_rows`` raw rows it counted, which
    cleanup deleted) and the readers' compact copy, written by the engine's own
    ``Store.ledger.commit_bucket`` and ``Store.ledger.copy_compact``, a bucket at a time; the
    raw rows they stand for are absent, as after gc_grace."""
    from counters.core import Checkpoint, Fold, to_millis
    from counters.engine import COMMIT_CHUNK
    from counters.store import Store

    del concurrency, per_batch
    store = Store(conn, family)
    epoch_ms = to_millis(epoch)
    pending = tuple(
        (to_millis(epoch - timedelta(seconds=6 * j + 1)), "bench", j) for j in range(pending_rows)
    )
    by_bucket: dict[tuple[int, int], list[tuple[tuple, int]]] = {}
    for key, value in rows:
        by_bucket.setdefault(store.keys.bucket(key), []).append((key, value))
    now = int(time.time() * 1_000_000)
    for (shard, bucket), members in by_bucket.items():
        head = store.ledger.read_ledger(shard, bucket, []).head
        for group in chunked(members, COMMIT_CHUNK):
            folds = [
                Fold(key, Checkpoint(), epoch_ms, value, pending, pending_rows, pending_rows, value)
                for key, value in group
            ]
            commit_id = store.ledger.new_commit_id()
            if not store.ledger.commit_bucket(
                shard, bucket, head, folds, commit_id, "bench-setup", now
            ):
                raise RuntimeError(f"bench setup: bucket {shard}/{bucket} changed under it")
            head = commit_id
            store.ledger.copy_compact(
                [
                    (f.counter, Checkpoint(f.value, epoch_ms, commit_id, frozenset(), 0, now))
                    for f in folds
                ],
                "bench-setup",
                now,
            )


def tombstone_index_marks(store: Any, keys: Sequence[tuple], ts_micros: int) -> None:
    """Index marks the engine forgot recently (within the index's gc_grace_seconds): written by
    ``Store.index.forget_touched`` itself, as a run's cleanup writes them."""
    from counters.store import Touched

    entries = [Touched(key, ts_micros) for key in keys]
    for group in chunked(entries, 20000):
        store.index.forget_touched(group)


def sweeping_far_away() -> dict[str, str]:
    """Family fields under which a family's first run sweeps (it never swept) and its next one,
    minutes later, does not: sweeps a day apart, the next one half a day away."""
    away = (utc_now() - datetime(1970, 1, 1) + timedelta(hours=12)) % timedelta(days=1)
    return {"sweep_interval": "1d", "sweep_offset": f"{int(away.total_seconds())}s"}


def engine_step_failed_in(exc: BaseException) -> str | None:
    """The innermost function of the engine's steps (``counters/compaction/``) that ``exc``
    passed through, as ``module.function`` (None if none did): ``engine.py`` only re-exports
    them, so its name is never in a traceback."""
    steps = Path(compaction.__file__).parent
    where = [
        f"{Path(frame.filename).stem}.{frame.name}"
        for frame in traceback.extract_tb(exc.__traceback__)
        if Path(frame.filename).parent == steps
    ]
    return where[-1] if where else None


CHECKOUT = Path(__file__).resolve().parents[1]


def code_state() -> dict[str, Any]:
    """The commit measured, and files of the package that differ from it (others edit the tree
    while benchmarks run)."""

    def git(*args: str) -> str:
        try:
            return subprocess.run(
                ["git", *args],
                capture_output=True,
                text=True,
                cwd=Path(__file__).resolve().parents[1],
                timeout=20,
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    dirty = git("status", "--porcelain", "--", "include/counters", "dags")
    return {"commit": git("rev-parse", "--short", "HEAD") or None, "dirty": dirty.splitlines()}


def machine() -> dict[str, Any]:
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "loadavg_at_start": load,
    }
