"""The run log: which rows each commit counted (what cleanup deletes)."""

from __future__ import annotations

import json
import logging
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from cassandra.util import unix_time_from_uuid1

from ..connection import BULK_PROFILE
from ..core import (
    Checkpoint,
    Fold,
    Key,
    chunks,
)
from ..rowkeys import CountedKeys
from ..schema import RUNLOG_TTL_S
from .keys import PLAIN_KEY_TYPES, Keys, normal_key
from .records import (
    CommitRecord,
    RunFigures,
    pack_commit_keys,
    pending_flags_of,
    unpack_commit_keys,
)
from .statements import ROWS_PER_BATCH, RUN_LOG_FETCH, Cql, Statements, declare

log = logging.getLogger(__name__)

RECORD_AGE_MARGIN_S = 86_400
"""Slack, in seconds, for the clocks of the host that made a commit and the one that looks its
record up: a commit younger than the run log's TTL by more than this still has its record."""


def record_may_have_expired(commit_id: Any, now_s: float) -> bool:
    """Whether the run log may have let the record of commit ``commit_id`` expire
    (``schema.RUNLOG_TTL_S``): its commit id, a time UUID, is about that old at ``now_s``
    (seconds since the Unix epoch). An id that tells no time: it may have."""
    if getattr(commit_id, "version", None) != 1:
        return True
    return now_s - unix_time_from_uuid1(commit_id) > RUNLOG_TTL_S - RECORD_AGE_MARGIN_S


class RunLogTable:
    """The run log table (``{runs}``): every statement on it, over the family's statements
    core. ``Store`` makes one as ``store.runs``, so a step that reads or writes the run log
    says so at its call."""

    STATEMENTS = declare(
        runs_read=Cql(
            "SELECT bucket, commit_id, keys, verified_by FROM {runs} WHERE run_id = ? AND shard = ?"
        ),
        runs_read_archive=Cql(
            "SELECT bucket, commit_id, keys, verified_by, archive_rows, archived FROM {runs} "
            "WHERE run_id = ? AND shard = ?"
        ),
        runs_keys_read=Cql(
            "SELECT keys FROM {runs} WHERE run_id = ? AND shard = ? AND bucket = ? AND commit_id "
            "= ?"
        ),
        runs_keys_archive_figures=Cql(
            "INSERT INTO {runs} (run_id, shard, bucket, commit_id, keys, archive_rows, figures) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)"
        ),
        runs_applied=Cql(
            "UPDATE {runs} SET applied = true WHERE run_id = ? AND shard = ? AND bucket = ? AND "
            "commit_id = ?"
        ),
        runs_deleted=Cql(
            "UPDATE {runs} SET deleted = ? WHERE run_id = ? AND shard = ? AND bucket = ? AND "
            "commit_id = ?"
        ),
        runs_figures=Cql(
            "SELECT verified_by, applied, figures, deleted FROM {runs} WHERE run_id = ? AND shard "
            "= ?"
        ),
        runs_archived=Cql(
            "UPDATE {runs} SET archived = ? WHERE run_id = ? AND shard = ? AND bucket = ? AND "
            "commit_id = ?"
        ),
        runs_verified=Cql(
            "UPDATE {runs} SET verified_by = ? WHERE run_id = ? AND shard = ? AND bucket = ? AND "
            "commit_id = ?"
        ),
        runs_entries=Cql("SELECT keys, verified_by FROM {runs} WHERE run_id = ? AND shard = ?"),
        runs_record_read=Cql(
            "SELECT keys, archive_rows, archived FROM {runs} WHERE run_id = ? AND shard = ? AND "
            "bucket = ? AND commit_id = ?"
        ),
        runs_verified_read=Cql(
            "SELECT verified_by FROM {runs} WHERE run_id = ? AND shard = ? AND bucket = ? AND "
            "commit_id = ?"
        ),
        runs_bucket=Cql("SELECT keys FROM {runs} WHERE run_id = ? AND shard = ? AND bucket = ?"),
        runs_keys_archive_moved=Cql(
            "INSERT INTO {runs} (run_id, shard, bucket, commit_id, keys, archive_rows, archived) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)"
        ),
        runs_keys_figures=Cql(
            "INSERT INTO {runs} (run_id, shard, bucket, commit_id, keys, figures) VALUES (?, ?, "
            "?, ?, ?, ?)"
        ),
        runs_keys=Cql(
            "INSERT INTO {runs} (run_id, shard, bucket, commit_id, keys) VALUES (?, ?, ?, ?, ?)"
        ),
    )

    def __init__(self, statements: Statements, keys: Keys):
        self.statements = statements
        self.family = statements.family
        self.keys = keys

    def commit_keys(self, folds: Sequence[Fold]) -> bytes:
        """The record of the rows ``folds`` count, as ``write_commit_keys`` stores it."""
        encode, _decode = self.keys.json_codec()
        return pack_commit_keys(
            [(encode(f.counter), f.epoch_ms, f.pending) for f in folds], self.keys.key_codec
        )

    def write_commit_keys(
        self,
        run_id: str,
        shard: int,
        bucket: int,
        commit_id: Any,
        folds: Sequence[Fold],
        keys: bytes | None = None,
        archive_rows: bytes | None = None,
        figures: dict[str, int] | None = None,
    ) -> None:
        """Record, before a commit, the keys of the rows each of its counters counts (one
        compressed cell: the Paxos batch then carries only values and sums). Cleanup deletes
        exactly these rows once an execution verified the commit (``mark_verified``), and a later
        fold reads them if any is still present. A record of a commit that did not apply is
        never used: it is never verified, and no ledger row names its commit id. A kept family's
        records name only the counters (its rows are not deleted): the look-up's history.
        ``archive_rows``: the rows' archive record, for a family with an archive (in the same
        write: a commit's keys are never recorded without it). ``figures``: what the commit
        adds to its run's audit row (``core.commit_figures``), summed over the run's applied
        commits when the run is audited (``applied_figures``)."""
        blob = self.commit_keys(folds) if keys is None else keys
        if archive_rows is None and self.family.archive is not None:
            archive_rows = self.archive_rows(folds)
        text = None if figures is None else json.dumps(figures, separators=(",", ":"))
        if archive_rows is None:
            statement = self.statements.prepared(self, "runs_keys_figures")
            self.statements.execute(statement, (run_id, shard, bucket, commit_id, blob, text))
            return
        statement = self.statements.prepared(self, "runs_keys_archive_figures")
        self.statements.execute(
            statement, (run_id, shard, bucket, commit_id, blob, archive_rows, text)
        )

    def mark_applied(self, run_id: str, shard: int, bucket: int, commit_ids: Sequence[Any]) -> None:
        """Mark commits of the run as applied: a later attempt of the run found them in the
        ledger (the attempt that made them failed before it verified them). Their figures
        count in the run's audit row. One single-partition batch."""
        if not commit_ids:
            return
        statement = self.statements.prepared(self, "runs_applied")
        params = [(run_id, shard, bucket, c) for c in commit_ids]
        self.statements.run([(self.statements.batch(statement, params), None)])

    def mark_deleted(self, run_id: str, shard: int, marks: Sequence[tuple[int, Any, int]]) -> None:
        """Record, per commit ``(bucket, commit id, rows)``, how many of its counted rows a
        cleanup deleted (each row once, with the commit that listed it first): the run's audit
        row adds them up, whichever cleanup of the run deleted them. Single-partition batches,
        after the deletes (a retry of the cleanup writes the same figures again)."""
        if not marks:
            return
        statement = self.statements.prepared(self, "runs_deleted")
        params = [(rows, run_id, shard, bucket, commit_id) for bucket, commit_id, rows in marks]
        for group in chunks(params, ROWS_PER_BATCH):
            self.statements.run([(self.statements.batch(statement, group), None)])

    def run_figures(self, run_id: str, shards: Sequence[int]) -> RunFigures:
        """What the run log says the run did in ``shards``: the figures of every commit known
        to have applied (one an execution verified, or a later attempt found in the ledger:
        ``applied``; None for a record from before figures were kept), and the rows its
        cleanups deleted (None: no cleanup recorded any). One read per shard, without keys."""
        statement = self.statements.prepared(self, "runs_figures")
        commits: list[dict[str, int] | None] = []
        deleted: int | None = None
        for shard in shards:
            bound = statement.bind((run_id, shard))
            bound.fetch_size = RUN_LOG_FETCH
            for verified_by, applied, figures, rows in self.statements.execute(
                bound, profile=BULK_PROFILE
            ):
                if rows is not None:
                    deleted = (deleted or 0) + rows
                if verified_by is None and not applied:
                    continue  # it lost its commit (or its attempt died unseen: not proven)
                commits.append(None if figures is None else json.loads(figures))
        return RunFigures(tuple(commits), deleted)

    def archive_rows(self, folds: Sequence[Fold]) -> bytes | None:
        """The archive record of the rows ``folds`` count (``archive.pack_record``), None for
        a family without an archive."""
        if self.family.archive is None:
            return None
        from ..archive import pack_record

        encode, _decode = self.keys.json_codec()
        if all(c.cql_type in PLAIN_KEY_TYPES for c in self.statements.layout.key):
            encode = list  # JSON as they are: the encoder's call per counter is not needed
        return pack_record(folds, encode, [c.cql_type for c in self.statements.layout.clustering])

    def archive_layout(self) -> Any:
        """The family's columns as its archive files name them (``archive.Layout``)."""
        from ..archive import Layout

        lay = self.statements.layout
        return Layout(
            tuple((c.name, c.cql_type) for c in lay.key),
            tuple((c.name, c.cql_type) for c in lay.clustering),
            lay.increment.name if lay.increment else "increment",
        )

    def mark_archived(
        self, run_id: str, shard: int, commits: Sequence[tuple[int, Any]], url: str
    ) -> None:
        """Mark commits ``(bucket, commit id)`` of a run's shard as held by the archive file
        ``url``, before any of their rows is deleted: a retry of the cleanup does not archive
        them again, and a later fold that finds one of their rows still present carries it as
        archived. One single-partition batch."""
        if not commits:
            return
        statement = self.statements.prepared(self, "runs_archived")
        params = [(url, run_id, shard, bucket, commit_id) for bucket, commit_id in commits]
        for group in chunks(params, ROWS_PER_BATCH):
            self.statements.run([(self.statements.batch(statement, group), None)])

    def mark_verified(
        self, run_id: str, shard: int, bucket: int, commit_ids: Sequence[Any], execution: str
    ) -> None:
        """Mark a bucket's commits as verified by ``execution`` (one attempt of the shard's
        compact step), after their copies were read back and their rows recounted: what that
        execution's cleanup may delete, and a copy found missing later was removed by someone
        (not a crash between commit and copy). One single-partition batch."""
        if not commit_ids:
            return
        statement = self.statements.prepared(self, "runs_verified")
        params = [(execution, run_id, shard, bucket, c) for c in commit_ids]
        self.statements.run([(self.statements.batch(statement, params), None)])

    def read_run_commits(
        self, run_id: str, shard: int, executions: Sequence[str]
    ) -> dict[int, list[CommitRecord]]:
        """The records of the run's commits in a shard that one of ``executions`` verified, by
        bucket. A commit no such execution verified is left out, whoever made it (a zombie
        attempt, a run that reused the run id, a task marked successful by hand): its rows,
        if counted, stay counted (its checkpoint's pending), and a later fold commits them
        again as present and deletes them then."""
        archived = self.family.archive is not None
        statement = self.statements.prepared(self, "runs_read_archive" if archived else "runs_read")
        _encode, decode = self.keys.json_codec()
        bound = statement.bind((run_id, shard))
        bound.fetch_size = RUN_LOG_FETCH
        wanted = set(executions)
        out: dict[int, list[CommitRecord]] = defaultdict(list)
        for row in self.statements.execute(bound, profile=BULK_PROFILE):
            bucket, commit_id, blob, verified_by = row[:4]
            if blob is None or verified_by not in wanted:
                continue
            extra = (row[4], row[5]) if archived else (None, None)
            out[bucket].append(CommitRecord(commit_id, blob, decode, self.keys.key_codec, *extra))
        return out

    def run_entries(self, run_id: str, shard: int) -> list[tuple[Key, int, bool]]:
        """``(counter, epoch ms, verified)`` of every commit record a run wrote in a shard,
        whatever its outcome: a reset looks its own id up here (a record whose commit did not
        apply is told apart by the caller)."""
        statement = self.statements.prepared(self, "runs_entries")
        _encode, decode = self.keys.json_codec()
        return [
            (decode(counter), epoch_ms, verified_by is not None)
            for blob, verified_by in self.statements.execute(statement, (run_id, shard))
            if blob is not None
            for counter, epoch_ms, _keys in unpack_commit_keys(blob, self.keys.key_codec)
        ]

    def commit_record(
        self, run_id: str, shard: int, bucket: int, commit_id: Any
    ) -> tuple[list[tuple[list[Any], int, CountedKeys]], bytes | None, str | None] | None:
        """One commit's record: its entries (counter JSON-encoded, epoch, keys), its archive
        record and its ``archived`` mark; None when the run log no longer holds it."""
        statement = self.statements.prepared(self, "runs_record_read")
        row = self.statements.execute(statement, (run_id, shard, bucket, commit_id)).one()
        if row is None or row[0] is None:
            return None
        return unpack_commit_keys(row[0], self.keys.key_codec), row[1], row[2]

    def commit_verified(self, run_id: str | None, shard: int, bucket: int, commit_id: Any) -> bool:
        """Whether an execution verified this commit (its copy was read back equal to it), as
        far as the run log remembers. No record at this place: verified if it may have expired
        (``schema.RUNLOG_TTL_S``: any run that read the counter since would have copied it
        again); not if the commit is younger, since the record is then at another place: a
        reshard moved the checkpoint and left its commit's record where it was made (it copies
        a record's counted keys only, never its verified mark)."""
        statement = self.statements.prepared(self, "runs_verified_read")
        row = self.statements.execute(statement, (run_id or "", shard, bucket, commit_id)).one()
        if row is None:
            return record_may_have_expired(commit_id, time.time())
        return row[0] is not None

    def load_pending(
        self, shard: int, bucket: int, checkpoints: dict[Key, Checkpoint], counters: Iterable[Key]
    ) -> list[Key]:
        """Load, in place, the pending keys of the given counters' checkpoints from their
        commits' records (one read per commit). Returns the counters whose record is gone (the
        run log keeps records ``schema.RUNLOG_TTL_S``): their counted rows cannot be told from late
        ones."""
        wanted = [c for c in counters if not checkpoints[c].pending_loaded]
        if not wanted:
            return []
        archived = self.family.archive is not None
        statement = self.statements.prepared(
            self, "runs_record_read" if archived else "runs_keys_read"
        )
        refs = sorted(
            {(checkpoints[c].run_id or "", checkpoints[c].commit_id) for c in wanted}, key=str
        )
        results = self.statements.concurrent(
            statement, [(r, shard, bucket, cid) for r, cid in refs]
        )
        encode, decode = self.keys.json_codec()
        records: dict[tuple[str, Any], dict[Key, CountedKeys]] = {}
        archives: dict[tuple[str, Any], tuple[bytes | None, str | None]] = {}
        for ref, result in zip(refs, results, strict=True):
            row = result.one()
            if row is not None and row[0] is not None:
                records[ref] = {
                    normal_key(decode(c)): keys
                    for c, _epoch, keys in unpack_commit_keys(row[0], self.keys.key_codec)
                }
                if archived:
                    archives[ref] = (row[1], row[2])
        missing = []
        for counter in wanted:
            cp = checkpoints[counter]
            ref = (cp.run_id or "", cp.commit_id)
            keys = records.get(ref, {}).get(normal_key(counter))
            if keys is None:
                missing.append(counter)
                continue
            flags, from_zero = (
                pending_flags_of(archives.get(ref), encode(counter), keys.keys)
                if archived
                else (None, False)
            )
            checkpoints[counter] = replace(
                cp,
                pending=frozenset(keys.keys),
                pending_loaded=True,
                pending_flags=flags,
                unarchived_from_zero=from_zero,
            )
        return missing

    def runs_with_counter(self, run_ids: Sequence[str], counter: Key) -> set[str]:
        """Which of these runs committed ``counter``: one read of each run's log for the
        counter's bucket (the run log is kept two weeks)."""
        statement = self.statements.prepared(self, "runs_bucket")
        shard, bucket = self.keys.bucket(counter)
        encode, _decode = self.keys.json_codec()
        wanted = encode(counter)
        results = self.statements.concurrent(
            statement, [(run_id, shard, bucket) for run_id in run_ids]
        )
        return {
            run_id
            for run_id, result in zip(run_ids, results, strict=True)
            if any(
                entry[0] == wanted
                for (blob,) in result
                if blob is not None
                for entry in unpack_commit_keys(blob, self.keys.key_codec)
            )
        }

    def copy_commit_record(
        self, cp: Checkpoint, counter: Key, old: tuple[int, int], new: tuple[int, int]
    ) -> bool:
        """Copy the counter's entry of its last commit's record of counted keys to the
        record at its new place (merged with the entries already copied there): a later fold
        reads it there. False when there is none to copy (nothing counted is pending, or the
        record expired)."""
        if cp.commit_id is None or not cp.pending_rows or cp.pending_loaded:
            return False
        archived = self.family.archive is not None
        read = self.statements.prepared(self, "runs_record_read" if archived else "runs_keys_read")
        run_id = cp.run_id or ""
        found = self.statements.execute(read, (run_id, *old, cp.commit_id)).one()
        if found is None or found[0] is None:
            return False
        encode, _decode = self.keys.json_codec()
        wanted = encode(counter)
        entry = [e for e in unpack_commit_keys(found[0], self.keys.key_codec) if e[0] == wanted]
        if not entry:
            return False
        there = self.statements.execute(read, (run_id, *new, cp.commit_id)).one()
        entries = [
            e
            for e in (
                unpack_commit_keys(there[0], self.keys.key_codec) if there and there[0] else []
            )
            if e[0] != wanted
        ]
        blob = pack_commit_keys([*entries, *entry], self.keys.key_codec)
        if not archived or found[1] is None:
            write = self.statements.prepared(self, "runs_keys")
            self.statements.execute(write, (run_id, *new, cp.commit_id, blob))
            return True
        # the counter's part of the commit's archive record goes with its keys, in their order
        from ..archive import join_records, record_part, unpack_record

        mine = tuple(wanted)
        parts = []
        if there is not None and there[1] is not None:
            parts.append(record_part(unpack_record(there[1]), lambda c: c != mine))
        parts.append(record_part(unpack_record(found[1]), lambda c: c == mine))
        write = self.statements.prepared(self, "runs_keys_archive_moved")
        self.statements.execute(
            write, (run_id, *new, cp.commit_id, blob, join_records(parts), found[2])
        )
        return True
