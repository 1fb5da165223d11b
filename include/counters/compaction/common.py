"""What every step of a run shares: fault points, limits, phases, a shard's report, the
bucket context and the garbage collector's pacing."""

from __future__ import annotations

import gc
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from ..connection import ClusterClock
from ..core import (
    Evidence,
    Key,
    RunningTally,
    Tally,
    clock_refusal,
    stamp,
)
from ..core.codec import CodecError, versioned
from ..errors import ClockSkew
from ..store import COMMIT_CHUNK, Store

log = logging.getLogger(__name__)

Fault = Callable[[str], None]
"""Called between statements with the name of the point reached; tests raise there to crash."""

FAULT_POINTS = (
    "lease",
    "discover",
    "read_compact",
    "read_raw",
    "keys",
    "commit",
    "copy",
    "verify",
    "forget",
    "cleanup_read_log",
    "cleanup_mark",
    "cleanup_delete",
    "finish",
)
"""Every point ``fault`` is called at, in run order (``keys``: after a chunk's keys are recorded,
before its commit; ``cleanup_mark``: unique families only)."""
ARCHIVE_FAULT_POINTS = ("cleanup_archive_file", "cleanup_archive")
"""The points a family with an archive reaches too, between ``cleanup_read_log`` and the first
delete: ``cleanup_archive_file`` after the file is written, before its manifest is recorded;
``cleanup_archive`` after the manifest and the commits' marks, before any row is deleted."""

LEASE_TTL_S = 120
FORGET_MARGIN = timedelta(minutes=2)
"""A mark is forgotten only if it was written this long before the fold read the rows: a
writer marks first and writes its row just after."""
HOT_LATE_WINDOW = timedelta(minutes=10)
"""How far behind its epoch a hot counter is read when its whole partition cannot be (every
folded row leaves a tombstone for ``gc_grace_seconds``; past ``tombstone_failure_threshold``,
100,000 by default, Cassandra refuses the read). Its older late rows wait, uncounted but never
lost, until the partition can be read whole; its mark is kept so every run looks again."""
SMALL_RUN_COUNTERS = 2_000
"""Touched counters below which a run's shards go to one task: spreading them costs more in
task processes than it saves."""
BUCKET_THREADS = 4
"""Buckets of a shard worked at once in one process."""
SCAN_THRESHOLD = 32
"""Touched counters in a bucket from which one token-range scan replaces their ``IN`` reads."""
CLEANUP_CHECK_SAMPLE = 32
"""Counters per bucket whose leftovers cleanup counts on the server (see ``_check_left``)."""
MAX_FOLD_ROWS = 200_000
"""Rows one commit of one counter may carry; a larger backlog is folded over several runs,
each moving the counter's own epoch as far as the rows that fit."""
FOLD_KEY_BYTES = 8 * 2**20
"""Bytes of row keys one commit of one counter may carry, before compression (fewer rows than
``MAX_FOLD_ROWS`` when the keys are long): a commit records every key it counts in one cell of
the run log, and Cassandra refuses a request over 16 MiB (``native_transport_max_message_size``)
and a mutation over 16 MiB (half its commit log segment)."""
COMMIT_KEYS_BYTES = 8 * 2**20
"""Most bytes of one commit's record of counted keys, compressed: a chunk of counters over it
is committed in halves."""
ARCHIVE_FOLD_KEY_BYTES = FOLD_KEY_BYTES // 2
"""``FOLD_KEY_BYTES`` of a family with an archive: its commit's record holds each row twice
(the key the cleanup binds, and the row with its increment and flags for the archive, 9 bytes
more: at most ~1.7 MiB for ``MAX_FOLD_ROWS``), so a fold carries half the keys' bytes."""
MAX_ATTEMPTS = 4
MEMBER_INDEX = 1
"""A unique family's derived rows are clustered by (first_time, member)."""


def no_fault(point: str) -> None:
    del point


def new_run_id(prefix: str = "cli") -> str:
    """A run's id (``cli-20261122T100000Z-1a2b3c``): unique, and sorting by when it began.
    Opaque to every reader (earlier versions' ids had no ``Z``)."""
    return f"{prefix}-{stamp(datetime.now(UTC))}-{secrets.token_hex(3)}"


def new_execution() -> str:
    """An id for one attempt of a shard's compact step (``ShardReport.execution``)."""
    return secrets.token_hex(8)


def cluster_clock(store: Store) -> ClusterClock:
    """The cluster's clock for a step of ``store``'s family (measured once a minute per
    process); a host whose clock is off by more than the family's tolerance
    (``core.clock_refusal``) is refused with ``ClockSkew`` before the step writes anything."""
    clock = store.conn.cluster_clock()
    refusal = clock_refusal(store.family.name, store.family.lag, clock.offset)
    if refusal is not None:
        raise ClockSkew(refusal)
    return clock


def cluster_micros(store: Store) -> int:
    """The cluster's time now in µs (``cluster_clock``): every write timestamp and horizon a
    run takes from "now" (tombstones, copy versions, the index's forget horizon)."""
    return cluster_clock(store).micros()


@dataclass
class Phases:
    """Wall time per phase, in seconds."""

    seconds: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def timed(self, name: str, store: Store | None = None) -> Iterator[None]:
        start = time.perf_counter()
        try:
            with store.statements.phase(name) if store is not None else nullcontext():
                yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def merge(self, other: Phases) -> Phases:
        out = Phases(dict(self.seconds))
        for name, value in other.seconds.items():
            out.seconds[name] = out.seconds.get(name, 0.0) + value
        return out


def _report_upgrade(version: int, payload: dict[str, Any]) -> dict[str, Any]:
    """A report a previous release returned to XCom (no ``v``: its phase times as
    ``seconds``) as the current layout."""
    if version != 0:
        raise CodecError(f"ShardReport: field 'v' is {version!r}, expected {REPORT_VERSION}")
    out = {k: v for k, v in payload.items() if k != "seconds"}
    out["phases"] = {"seconds": payload.get("seconds", {})}
    return out


REPORT_VERSION = 1


@versioned(REPORT_VERSION, _report_upgrade)
@dataclass(frozen=True, slots=True)
class ShardReport:
    """One shard's compact step: what ``verify`` receives (across XCom: ``core.codec``). Built
    once when the step ends, from what its buckets counted (``ShardContext``)."""

    shard: int
    tally: Tally
    phases: Phases
    evidence: tuple[Evidence, ...] = ()
    failures: tuple[str, ...] = ()
    requests: Mapping[str, int] = field(default_factory=dict)
    dry_run: bool = False
    peak_rss_mib: float = 0.0
    execution: str = field(default_factory=new_execution)
    """This attempt of the shard's compact step: its cleanup deletes only the commits it
    verified, never another attempt's (a zombie, a reused run id, a task marked successful)."""


# --- compact -----------------------------------------------------------------------------


@dataclass
class ShardContext:
    """A bucket's work in a shard's compact step: what it reads from, and what it counts as it
    goes (``tally``, ``phases``, ``evidence``, ``failures``: the step adds its buckets' up into
    its ``ShardReport``)."""

    store: Store
    shard: int
    epoch_ms: int
    run_id: str
    dry_run: bool
    fault: Fault
    tally: RunningTally
    phases: Phases
    quarantined: set[Key]
    evidence: list[Evidence] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    commit_chunk: int = COMMIT_CHUNK
    index_read_at: int = 0
    """When the shard's index marks were read (µs): the base of the forget horizon."""
    sweep: bool = False
    execution: str = ""
    """This attempt of the shard's compact step: the commits it verified are what its
    cleanup deletes (``ShardReport.execution``)."""


STEP_GC_THRESHOLD = 100_000
"""New containers between two young collections of Python's cyclic collector while a shard's
step runs (Python's default: 700)."""
_collector_steps = 0
_collector_thresholds: tuple[int, ...] = ()
_collector_lock = threading.Lock()


@contextmanager
def collector_relaxed() -> Iterator[None]:
    """Python's cyclic collector runs ~140x less often while a shard's step runs; its
    thresholds are back as they were after the last concurrent step. A step allocates millions
    of short-lived tuples and bound statements: with the default threshold many are still
    alive when the collector walks them, and move on to be walked again by the older
    generations. A probe writing 100,000 compact copies took 3.5-4.2 client CPU-s with the
    default, 2.7-3.0 at this threshold, 2.5-2.7 with the collector off. Not off: the driver's
    futures are cycles that hold their result pages, which only the collector frees (a run of
    100,000 rows with it off left 318,000 such objects)."""
    global _collector_steps, _collector_thresholds
    with _collector_lock:
        if _collector_steps == 0:
            _collector_thresholds = gc.get_threshold()
            gc.set_threshold(STEP_GC_THRESHOLD, *_collector_thresholds[1:])
        _collector_steps += 1
    try:
        yield
    finally:
        with _collector_lock:
            _collector_steps -= 1
            if _collector_steps == 0:
                gc.set_threshold(*_collector_thresholds)


def peak_rss_mib() -> float:
    """This process's peak resident memory (``VmHWM``), in MiB; 0 where /proc is missing."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0
