"""The cleanup's archive step: the rows a cleanup is about to delete, written to the family's
archive before any of them is deleted (``cleanup_shard`` and ``reset_counter`` call it).

Order, each step complete before the next (a crash between any two deletes nothing, and the
retry or the next run archives no row twice):

1. the rows: each commit's archive record from the run log (the fold's own values; nothing is
   read again), less the counters held in quarantine (not deleted), the rows an archive holds
   already (``ROW_ARCHIVED``: archived by a cleanup that crashed before its deletes, then
   carried by a later fold), and the rows another cleanup archived: a carried row not flagged
   archived is kept only if it is still there and its base commit is not marked archived now
   (its cleanup may have run after this fold); a row of a counter a newer commit carried on
   (this cleanup runs after a newer run's fold: the bucket's head is not this run's) only if
   it is still there and the counter's current commit does not hold it archived. Point reads,
   only of such rows, which only crashes and cleanups out of run order leave;
2. one Parquet file per run and shard, written whole and read back (``archive.storage``);
3. its manifest (rows, sum, sha256) added to the run's audit row;
4. the commits marked archived in the run log (a retry skips them; a later fold carries their
   rows still present as archived), each mark naming the counters its file left out.

The cleanup then deletes a commit's rows as its mark says they are archived (``left_out``),
never by the quarantine as it is when it deletes: a counter quarantined when the file was
written and released before a retry (or a "Clear") of the cleanup keeps its rows for its next
fold, which archives them.

A commit recorded before the family had an archive has no values of its rows: its rows are
not deleted by this cleanup (``deferred``); the next fold of their counter counts them again as
present, with their values, and its cleanup archives and deletes them.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ..archive import (
    FILE_FORMAT,
    ROW_CARRIED,
    ArchiveRecord,
    Commit,
    Manifest,
    archived_mark,
    archived_skipped,
    manifest_of,
    parquet_bytes,
    table_of,
    unpack_record,
)
from ..archive.storage import day_of, write_part
from ..core import ROW_ARCHIVED, Checkpoint, Key
from ..errors import ArchiveError
from ..store import CommitRecord, Store

log = logging.getLogger(__name__)

Fault = Any


def no_fault(point: str) -> None:
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
    left_out: dict[Any, set[Key]] = field(default_factory=dict)
    """By commit id, the counters whose rows its archive does not hold (held in quarantine
    when its file was written, by this cleanup or an earlier attempt): a cleanup deletes a
    commit's rows only as its archive mark says they are archived, whatever the quarantine
    says now, so their rows stay (the next fold of a released counter carries them)."""
    seconds: float = 0.0


def archive_commits(
    store: Store,
    shard: int,
    run_id: str,
    runs: dict[int, list[CommitRecord]],
    quarantined: set[Key],
    started_at: datetime | None,
    fault: Fault = no_fault,
) -> Archived:
    """Archive the rows of ``runs`` (a shard's verified commits, by bucket) that a cleanup
    deletes, before it deletes any: see the module. ``started_at``: the run's start, the key of
    its audit row (which gets the manifest) and its day folder."""
    started = time.perf_counter()
    family = store.family
    done = Archived()
    _encode, decode = store.keys.json_codec()
    todo: list[tuple[int, CommitRecord, bytes]] = []
    for bucket in sorted(runs):
        for record in runs[bucket]:
            if record.archive_rows is None:
                done.deferred.add(record.commit_id)
            elif record.archived is None:
                todo.append((bucket, record, record.archive_rows))
            else:  # archived by an earlier attempt: what its mark says it left out
                left = archived_skipped(record.archived) or set()
                done.left_out[record.commit_id] = {decode(list(c)) for c in left}
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
    encode, _decode = store.keys.json_codec()
    held = {tuple(encode(c)) for c in quarantined}
    records = [(bucket, record, unpack_record(rows)) for bucket, record, rows in todo]
    mine = {bucket: {r.commit_id for r in runs[bucket]} for bucket in runs}
    commits = _commits(store, shard, run_id, records, held, mine)
    layout = store.runs.archive_layout()
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
        store.audit.record_archive(started_at, run_id, {manifest.name: manifest.as_text()})
        done.manifests.append(manifest)
        done.rows, done.sum = manifest.rows, manifest.sum
    skipped_by_commit = {
        c.commit_id: [counter for counter in c.record.counters if counter in held] for c in commits
    }
    for bucket, record, _r in records:
        skipped = skipped_by_commit.get(str(record.commit_id), [])
        mark = archived_mark(url, skipped)
        store.runs.mark_archived(run_id, shard, [(bucket, record.commit_id)], mark)
        done.left_out[record.commit_id] = {decode(list(c)) for c in skipped}
    fault("cleanup_archive")
    done.seconds = time.perf_counter() - started
    return done


def _commits(
    store: Store,
    shard: int,
    run_id: str,
    records: list[tuple[int, CommitRecord, ArchiveRecord]],
    held: set[tuple[Any, ...]],
    mine: dict[int, set[Any]] | None = None,
) -> list[Commit]:
    """Each commit with the rows its file keeps: not a quarantined counter's, not archived
    already, not a row that is gone or that another commit's archive holds, not a row an
    earlier commit of the same file holds (a counter committed twice by retries of the run).

    A row another cleanup may have archived is looked at: a carried row not flagged archived
    (its base's cleanup may have archived it since the fold: the base's mark is read now), and
    any row of a counter that a later commit carried on (a bucket whose head is not one of the
    run's ``mine`` commits: this cleanup runs after a newer run's fold; the counter's current
    commit's mark and flags are read). Such a row is kept only if it is still there and
    neither of those holds it archived. Vectorised over the rows; keys are decoded only for
    the counters that need a look, which only crashes, retries and cleanups out of run order
    leave."""
    _encode, decode = store.keys.json_codec()
    appears = Counter(c for _b, _r, rec in records for c in rec.counters)
    later = _later_commits(store, shard, records, mine or {})
    masks: list[Any] = []
    looks: list[dict[int, list[Any]]] = []  # per record: segment index -> its decoded keys
    suspects: list[Any] = []
    carried: dict[tuple[Any, ...], list[Any]] = {}
    bases: dict[tuple[Any, ...], set[tuple[int, str, str]]] = {}
    for bucket, record, rec in records:
        flags = rec.rows.column("flags").to_numpy(zero_copy_only=False)
        mask = (flags & ROW_ARCHIVED) == 0
        suspect = (flags & (ROW_CARRIED | ROW_ARCHIVED)) == ROW_CARRIED
        counters = rec.counters
        starts = rec.offsets()
        moved = later.get(record.commit_id, {})
        for i, c in enumerate(counters):
            if c in moved:
                suspect[starts[i] : starts[i + 1]] |= mask[starts[i] : starts[i + 1]]
        look = [i for i, c in enumerate(counters) if c in held or appears[c] > 1 or c in moved]
        if suspect.any():
            look += [i for i in range(len(counters)) if suspect[starts[i] : starts[i + 1]].any()]
        found: dict[int, list[Any]] = {}
        if look:
            keys_of = {tuple(c): keys for c, _e, keys in _entries(store, record)}
            segments = rec.segments
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
                looked = [k for k, f in zip(keys, suspect[a:b], strict=True) if f]
                carried.setdefault(counter, []).extend(looked)
                base = segments[i]
                if looked and base.base_commit and base.base_run is not None:
                    bases.setdefault(counter, set()).add((bucket, base.base_run, base.base_commit))
        looks.append(found)
        masks.append(mask)
        suspects.append(suspect)
    present = {
        counter: {r[1] for r in store.raw.read_rows_at(decode(list(counter)), keys)}
        for counter, keys in carried.items()
        if keys
    }
    elsewhere = _archived_elsewhere(store, shard, present, bases, later)
    out: list[Commit] = []
    seen: dict[tuple[Any, ...], set[Any]] = {}
    for (bucket, record, rec), mask, found, suspect in zip(
        records, masks, looks, suspects, strict=True
    ):
        starts = rec.offsets()
        for i, keys in found.items():
            counter = rec.counters[i]
            earlier = seen.setdefault(counter, set())
            for j, key in enumerate(keys, start=starts[i]):
                if not mask[j]:
                    continue
                gone = suspect[j] and (
                    key not in present.get(counter, ()) or key in elsewhere.get(counter, ())
                )
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


def _later_commits(
    store: Store,
    shard: int,
    records: list[tuple[int, CommitRecord, ArchiveRecord]],
    mine: dict[int, set[Any]],
) -> dict[Any, dict[tuple[Any, ...], Checkpoint]]:
    """By commit id, the counters of its record that a later commit (not one of ``mine``)
    carried on, with their current checkpoint (pending loaded, with its flags). One head read
    per bucket; the ledger only of a bucket whose head is not the run's (a newer run committed
    to it before this cleanup)."""
    _encode, decode = store.keys.json_codec()
    out: dict[Any, dict[tuple[Any, ...], Checkpoint]] = {}
    by_bucket: dict[int, list[tuple[CommitRecord, ArchiveRecord]]] = {}
    for bucket, record, rec in records:
        by_bucket.setdefault(bucket, []).append((record, rec))
    for bucket, items in sorted(by_bucket.items()):
        if store.ledger.bucket_head(shard, bucket) in mine.get(bucket, ()):
            continue
        wanted = {c: decode(list(c)) for _r, rec in items for c in rec.counters}
        ledger = store.ledger.read_ledger(shard, bucket, list(wanted.values()), with_pending=False)
        current = {c: ledger.checkpoints.get(key) for c, key in wanted.items()}
        moved: dict[Key, Checkpoint] = {}
        for record, rec in items:
            for c in rec.counters:
                cp = current[c]
                if cp is not None and cp.commit_id is not None and cp.commit_id != record.commit_id:
                    moved[wanted[c]] = cp
                    out.setdefault(record.commit_id, {})[c] = cp
        if moved:
            store.runs.load_pending(shard, bucket, moved, list(moved))
            for by_counter in out.values():
                for c in by_counter:
                    if wanted.get(c) in moved:
                        by_counter[c] = moved[wanted[c]]
    return out


def _archived_elsewhere(
    store: Store,
    shard: int,
    present: dict[tuple[Any, ...], set[Any]],
    bases: dict[tuple[Any, ...], set[tuple[int, str, str]]],
    later: dict[Any, dict[tuple[Any, ...], Checkpoint]],
) -> dict[tuple[Any, ...], set[Any]]:
    """By counter, its present rows that another commit's archive holds: flagged archived by
    the counter's current commit (a later fold), or in a base commit whose cleanup archived it
    after this commit's fold (its mark, read now)."""
    _encode, decode = store.keys.json_codec()
    out: dict[tuple[Any, ...], set[Any]] = {}

    def add(counter: tuple[Any, ...], cp: Checkpoint) -> None:
        flags = cp.pending_flags or {}
        held = {k for k in present.get(counter, ()) if flags.get(k, 0) & ROW_ARCHIVED}
        if held:
            out.setdefault(counter, set()).update(held)

    for by_counter in later.values():
        for counter, cp in by_counter.items():
            if counter in present and cp.pending_loaded:
                add(counter, cp)
    for counter, refs in bases.items():
        if not present.get(counter):
            continue
        key = decode(list(counter))
        for bucket, base_run, base_commit in sorted(refs):
            base = Checkpoint(
                commit_id=uuid.UUID(base_commit), run_id=base_run, pending_loaded=False
            )
            loaded = {key: base}
            if not store.runs.load_pending(shard, bucket, loaded, [key]):
                add(counter, loaded[key])
    return out


def _entries(store: Store, record: CommitRecord) -> list[tuple[list[Any], int, Any]]:
    """A record's entries with each counter JSON-encoded, as its archive record names it."""
    encode, _decode = store.keys.json_codec()
    return [(encode(counter), epoch, keys) for counter, epoch, keys in record.entries]
