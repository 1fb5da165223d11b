"""The work a run's guarantees require, done by the engine's own primitives without its logic.

Section 3 compares a run with the scan floor (reading every raw row once). A run must do more
than read: issue #12 and docs/correctness.md ask for an independent recount on the server
before anything is deleted, many counters per Paxos round over a bucketed ledger with the
counted keys recorded beside it, the compact table written for readers and read back, and
exactly the counted rows deleted as row tombstones. This section does each of those once over
the main data set, bucket by bucket, with the functions a run calls
(``Store.raw.scan_rows``, ``core.fold_counter``, ``Store.raw.recount``,
``compaction.commit_folds``, ``Store.ledger.copy_compact``, ``Store.ledger.read_copies``,
``Store.runs.read_run_commits``, ``Store.raw.delete_rows``), and nothing else: no discovery,
leases, planning, checks, marks or audit. Its sum is the floor of this design on this node:
what a run costs at best, in the same bench run as the scan floor and the engine.

Writes go to a scratch family of the same layout, so the main data stays for the measured run.
Its raw table is empty: a row tombstone is a blind write, as costly for the node whether or not
the row is there (the run's own deletes meet the rows in sstables, not in memtables).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from counters.core import BUCKETS, EMPTY_CHECKPOINT, Fold, fold_counter, write_timestamp
from counters.engine import (
    COMMIT_CHUNK,
    collector_relaxed,
    commit_folds,
    committed_checkpoint,
    new_run_id,
)
from counters.store import Store

from .ops import Meter, chunked, utc_now

STEPS = ("read", "fold", "recount", "commit", "copy", "read_back", "log", "delete")
"""In a run's order. ``read``: the fold's token-range read, decoded into the engine's rows;
``fold``: the arithmetic alone (client CPU); ``commit``: each chunk's keys record and conditional
batch, then the bucket's applied mark; ``read_back``: the compact copies as verify reads them;
``log``: each shard's run log, as cleanup reads it; ``delete``: every counted row deleted."""


def required_work(
    main: Store, scratch: Store, epoch_ms: int, server: int | None, threads: int
) -> dict[str, Any]:
    """Each required step over every bucket of ``main``'s data (``threads`` buckets at a time),
    its writes in ``scratch``; per step wall time and client and node CPU, and their sums."""
    buckets = [(s, b) for s in range(main.family.shards) for b in range(BUCKETS)]
    run_id = new_run_id("required")
    out: dict[str, Any] = {"buckets": len(buckets), "threads": threads}
    rows: dict[tuple[int, int], dict] = {}
    folds: dict[tuple[int, int], list[Fold]] = {}
    commits: dict[tuple[int, int], list[tuple[Fold, Any, int]]] = {}

    def each(step: str, work: Callable[..., Any], items: list[Any] = buckets) -> list[Any]:
        def one(where: tuple[int, ...]) -> Any:
            with main.statements.phase(step), scratch.statements.phase(step):
                return work(*where)

        # under the collector's threshold of a shard's step, as the run's steps are
        with Meter(server) as meter, collector_relaxed(), ThreadPoolExecutor(threads) as pool:
            found = list(pool.map(one, items))
        out[step] = meter.as_dict()
        return found

    def read(shard: int, bucket: int) -> None:
        rows[shard, bucket] = main.raw.scan_rows(shard, bucket)

    def fold(shard: int, bucket: int) -> None:
        folds[shard, bucket] = [
            fold_counter(c, EMPTY_CHECKPOINT, found, epoch_ms)
            for c, found in rows[shard, bucket].items()
        ]

    def commit(shard: int, bucket: int) -> None:
        head = scratch.ledger.read_ledger(shard, bucket, None).head
        applied = []
        done: list[tuple[Fold, Any, int]] = []
        for chunk in chunked(folds[shard, bucket], COMMIT_CHUNK):
            result = commit_folds(scratch, shard, bucket, head, chunk, run_id)
            if result is None:
                raise RuntimeError(f"required work: the commit to bucket {shard}/{bucket} lost")
            head = result[0]
            applied.append(head)
            done.extend((f, *result) for f in chunk)
        scratch.runs.mark_verified(run_id, shard, bucket, applied, run_id)
        commits[shard, bucket] = done

    def copy(shard: int, bucket: int) -> None:
        copies = [
            (f.counter, committed_checkpoint(f, commit_id, now, run_id))
            for f, commit_id, now in commits[shard, bucket]
        ]
        scratch.ledger.copy_compact(copies, run_id, write_timestamp(utc_now()))

    ts = write_timestamp(utc_now())
    logs: dict[int, dict] = {}

    def delete(shard: int, bucket: int) -> int:
        records = logs[shard].get(bucket, [])
        deletions = [(c, keys) for record in records for c, _e, keys in record.entries]
        return scratch.raw.delete_rows(deletions, ts)

    each("read", read)
    each("fold", fold)
    recounts = each("recount", lambda s, b: main.raw.recount(s, b, None, epoch_ms))
    each("commit", commit)
    each("copy", copy)
    read_back = each("read_back", lambda s, b: scratch.ledger.read_copies(s, b, None))
    shards = [(s,) for s in range(main.family.shards)]
    found_logs = each("log", lambda s: scratch.runs.read_run_commits(run_id, s, [run_id]), shards)
    logs.update(enumerate(found_logs))
    deleted = each("delete", delete)
    out["rows_read"] = sum(len(r) for by_counter in rows.values() for r in by_counter.values())
    out["rows_recounted"] = sum(n for found in recounts for n, _sum in found.values())
    out["counters_committed"] = sum(len(done) for done in commits.values())
    out["copies_read_back"] = sum(len(found) for found in read_back)
    out["rows_deleted"] = sum(deleted)
    out["total"] = totals(out)
    return out


def totals(figures: dict[str, Any]) -> dict[str, float | None]:
    """The steps' sums: wall time, client and node CPU."""
    steps = [figures[s] for s in STEPS if s in figures]
    node = [s.get("server_cpu_s") for s in steps]
    return {
        "seconds": round(sum(s["seconds"] for s in steps), 3),
        "client_cpu_s": round(sum(s["client_cpu_s"] for s in steps), 3),
        "server_cpu_s": None if None in node else round(sum(node), 3),
    }
