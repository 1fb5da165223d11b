"""The cleanup's archive step: the rows a cleanup is about to delete, written to the family's
archive before any of them is deleted (``cleanup_shard`` and ``reset_counter`` call it).

Order, each step complete before the next (a crash between any two deletes nothing, and the
retry or the next run archives no row twice):

1. the rows: each commit's archive record from the run log (the fold's own values; nothing is
   read again), less the counters held in quarantine (not deleted), the rows an archive holds
   already (``ROW_ARCHIVED``: archived by a cleanup that crashed before its deletes, then
   carried by a later fold), and the carried rows that are gone (deleted, so archived, by the
   cleanup of the commit that counted them first: point reads, only of carried rows, which
   only a crash leaves);
2. one Parquet file per run and shard, written whole and read back (``archive_files``);
3. its manifest (rows, sum, sha256) added to the run's audit row;
4. the commits marked archived in the run log (a retry skips them; a later fold carries their
   rows still present as archived).

A commit recorded before the family had an archive has no values of its rows: its rows are
not deleted by this cleanup (``deferred``); the next fold of their counter counts them again as
present, with their values, and its cleanup archives and deletes them.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .archive import (
    FILE_FORMAT,
    ROW_CARRIED,
    ArchiveRecord,
    Commit,
    Manifest,
    archived_mark,
    manifest_of,
    parquet_bytes,
    table_of,
    unpack_record,
)
from .archive_files import day_of, write_part
from .core import ROW_ARCHIVED, Key
from .errors import ArchiveError
from .store import CommitRecord, Store

log = logging.getLogger(__name__)

Fault = Any


def _no_fault(point: str) -> None:
    del point


UUID_EPOCH = 0x01B21DD213814000
"""100-ns intervals between the uuid epoch (1582) and the Unix epoch."""


def commit_time_ms(commit_id: Any) -> int:
    """A timeuuid's time, in Unix ms."""
    return (commit_id.time - UUID_EPOCH) // 10_000


@dataclass
class Archived:
    """What one archive step did."""

    manifests: list[Manifest] = field(default_factory=list)
    rows: int = 0
    sum: int = 0
    deferred: set[Any] = field(default_factory=set)
    """Commit ids recorded before the family had an archive: their rows are left in place."""
    seconds: float = 0.0


def archive_commits(
    store: Store,
    shard: int,
    run_id: str,
    runs: dict[int, list[CommitRecord]],
    quarantined: set[Key],
    started_at: datetime | None,
    fault: Fault = _no_fault,
) -> Archived:
    """Archive the rows of ``runs`` (a shard's verified commits, by bucket) that a cleanup
    deletes, before it deletes any: see the module. ``started_at``: the run's start, the key of
    its audit row (which gets the manifest) and its day folder."""
    started = time.perf_counter()
    family = store.family
    done = Archived()
    todo: list[tuple[int, CommitRecord]] = []
    for bucket in sorted(runs):
        for record in runs[bucket]:
            if record.archive_rows is None:
                done.deferred.add(record.commit_id)
            elif record.archived is None:
                todo.append((bucket, record))
    if done.deferred:
        log.warning(
            "family %s run %s shard %s: %d commit(s) recorded before the family had an archive: "
            "their rows are left for the next fold of their counters, which archives them",
            family.name,
            run_id,
            shard,
            len(done.deferred),
        )
    if not todo:
        done.seconds = time.perf_counter() - started
        return done
    if started_at is None:
        raise ArchiveError(
            f"family {family.name!r} run {run_id!r}: the run's start (its audit row) is needed to "
            "archive its rows; nothing was deleted"
        )
    encode, _decode = store._key_codec()
    held = {tuple(encode(c)) for c in quarantined}
    records = [(bucket, record, unpack_record(record.archive_rows)) for bucket, record in todo]
    commits = _commits(store, shard, run_id, records, held)
    layout = store.archive_layout()
    table = table_of(commits, layout)
    url: str | None = None
    if table.num_rows:
        meta = {
            "format": FILE_FORMAT,
            "family": family.name,
            "run_id": run_id,
            "shard": shard,
            "key": [list(c) for c in layout.key],
            "clustering": [list(c) for c in layout.clustering],
            "increment": layout.increment,
        }
        data = parquet_bytes(table, meta)
        url = write_part(family, day_of(started_at), run_id, shard, data)
        manifest = manifest_of(url, shard, table, data, len(commits), layout)
        fault("cleanup_archive_file")
        store.audit_log.record_archive(started_at, run_id, {manifest.name: manifest.as_text()})
        done.manifests.append(manifest)
        done.rows, done.sum = manifest.rows, manifest.sum
    skipped_by_commit = {
        c.commit_id: [counter for counter in c.record.counters if counter in held] for c in commits
    }
    for bucket, record, _r in records:
        mark = archived_mark(url, skipped_by_commit.get(str(record.commit_id), []))
        store.mark_archived(run_id, shard, [(bucket, record.commit_id)], mark)
    fault("cleanup_archive")
    done.seconds = time.perf_counter() - started
    return done


def _commits(
    store: Store,
    shard: int,
    run_id: str,
    records: list[tuple[int, CommitRecord, ArchiveRecord]],
    held: set[tuple[Any, ...]],
) -> list[Commit]:
    """Each commit with the rows its file keeps: not a quarantined counter's, not archived
    already, not a carried row that is gone, not a row an earlier commit of the same file
    holds (a counter committed twice by retries of the run). Vectorised over the rows; keys
    are decoded only for the counters that need a look (carried rows, a counter twice), which
    only crashes and retries leave."""
    _encode, decode = store._key_codec()
    appears = Counter(c for _b, _r, rec in records for c in rec.counters)
    masks: list[Any] = []
    looks: list[dict[int, list[Any]]] = []  # per record: segment index -> its decoded keys
    carried: dict[tuple[Any, ...], list[Any]] = {}
    for _bucket, record, rec in records:
        flags = rec.rows.column("flags").to_numpy(zero_copy_only=False)
        mask = (flags & ROW_ARCHIVED) == 0
        fresh_rows = (flags & (ROW_CARRIED | ROW_ARCHIVED)) == ROW_CARRIED
        counters = rec.counters
        look = [i for i, c in enumerate(counters) if c in held or appears[c] > 1]
        starts = rec.offsets()
        if fresh_rows.any():
            look += [i for i in range(len(counters)) if fresh_rows[starts[i] : starts[i + 1]].any()]
        found: dict[int, list[Any]] = {}
        if look:
            keys_of = {tuple(c): keys for c, _e, keys in _entries(store, record)}
            for i in sorted(set(look)):
                counter = counters[i]
                a, b = starts[i], starts[i + 1]
                if counter in held:
                    mask[a:b] = False
                    continue
                keys = keys_of[counter].keys if counter in keys_of else []
                if len(keys) != b - a:
                    raise ArchiveError(
                        f"family {store.family.name!r} run {run_id!r} commit "
                        f"{record.commit_id}: its archive record and its keys differ for counter "
                        f"{list(counter)}; nothing was deleted"
                    )
                found[i] = keys
                carried.setdefault(counter, []).extend(
                    k for k, f in zip(keys, fresh_rows[a:b], strict=True) if f
                )
        looks.append(found)
        masks.append(mask)
    present = {
        counter: {r[1] for r in store.read_rows_at(decode(list(counter)), keys)}
        for counter, keys in carried.items()
        if keys
    }
    out: list[Commit] = []
    seen: dict[tuple[Any, ...], set[Any]] = {}
    for (bucket, record, rec), mask, found in zip(records, masks, looks, strict=True):
        starts = rec.offsets()
        flags = rec.rows.column("flags").to_numpy(zero_copy_only=False)
        for i, keys in found.items():
            counter = rec.counters[i]
            earlier = seen.setdefault(counter, set())
            for j, key in enumerate(keys, start=starts[i]):
                if not mask[j]:
                    continue
                gone = flags[j] & ROW_CARRIED and key not in present.get(counter, ())
                if gone or (appears[counter] > 1 and key in earlier):
                    mask[j] = False
                earlier.add(key)
        out.append(
            Commit(
                run_id,
                shard,
                bucket,
                str(record.commit_id),
                commit_time_ms(record.commit_id),
                rec,
                mask,
            )
        )
    return out


def _entries(store: Store, record: CommitRecord) -> list[tuple[list[Any], int, Any]]:
    """A record's entries with each counter JSON-encoded, as its archive record names it."""
    encode, _decode = store._key_codec()
    return [(encode(counter), epoch, keys) for counter, epoch, keys in record.entries]
