"""``counterctl recount``: a family's counters rebuilt from its archive of deleted rows plus the
rows still present, compared with the compact table (``archive.recount_counter`` is the rule).

What it reads: the manifests in the audit rows of the window (``--from``/``--to``: the runs
started in it), each file they name (its sha256, rows and sum checked against its manifest: a
changed file is reported, never counted), the ledger's checkpoints and the compact copies of
the counters, and, for a counter whose last commit is not archived yet, that commit's record
(run log) and its counted rows still present (point reads).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from .archive import (
    ArchivedSegment,
    Manifest,
    Present,
    Recount,
    archived_skipped,
    archived_url,
    check_file,
    encoded_values,
    recount_counter,
    unpack_record,
)
from .archive.storage import day_files, day_in_url, days, pruned_before, read_file
from .core import BUCKETS, ROW_ARCHIVED, ROW_COUNTED, Key, to_text, utc_naive
from .errors import ArchiveError
from .store import Store

log = logging.getLogger(__name__)


@dataclass
class Seen:
    """What the window's manifests named: the files read, and those the archive's retention
    removed (by URL, and by the run and shard that wrote them)."""

    cutoff: date | None = None
    """The first day the archive keeps (None: it keeps every day)."""
    named: set[str] = field(default_factory=set)
    pruned: set[str] = field(default_factory=set)
    gone: dict[str, bool] = field(default_factory=dict)
    """Files outside the window looked at: whether the retention removed them."""
    pruned_runs: set[tuple[str, int]] = field(default_factory=set)


@dataclass
class RecountReport:
    """Every counter recounted, and what was found of the files."""

    family: str
    since: datetime | None
    until: datetime | None
    counters: list[Recount] = field(default_factory=list)
    files: int = 0
    file_problems: list[str] = field(default_factory=list)
    pruned: int = 0
    """Files a manifest names that the archive's retention removed (their commits are before
    the window the recount can prove: its opening balance is taken after them)."""
    duplicates: int = 0
    """Rows found in two files (counted once): only a cleanup racing another can write them."""
    unrecorded: list[str] = field(default_factory=list)
    """Files in the window's day folders that no manifest names: left by a cleanup that crashed
    before recording its file (it deleted nothing under it; a retry or a later run archived
    those rows again, under a manifest). Not counted."""

    @property
    def differences(self) -> list[Recount]:
        """The counters found wrong (a difference, a problem): not those that cannot be
        rebuilt."""
        return [r for r in self.counters if r.status == "different"]

    @property
    def cannot_rebuild(self) -> list[Recount]:
        """The counters whose evidence expired (the archive's retention, the run log's 14
        days) or lies before the window: not proven, and not found wrong."""
        return [r for r in self.counters if r.status == "cannot_rebuild"]

    @property
    def ok(self) -> bool:
        return not self.file_problems and not self.differences

    def as_dict(self) -> dict[str, Any]:
        return {
            "family": self.family,
            "since": to_text(self.since),
            "until": to_text(self.until),
            "ok": self.ok,
            "files": self.files,
            "file_problems": list(self.file_problems),
            "pruned_files": self.pruned,
            "duplicate_rows": self.duplicates,
            "unrecorded_files": list(self.unrecorded),
            "cannot_rebuild": len(self.cannot_rebuild),
            "counters": [r.as_dict() for r in self.counters],
        }


def recount(
    store: Store,
    counters: Sequence[Key] | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    now: datetime | None = None,
) -> RecountReport:
    """Rebuild ``counters`` (None: every counter of the family's ledger and archive) from the
    archive files of the runs started in ``[since, until)`` plus the rows still present, and
    compare them with the compact table (with ``until``: with the value the last archived
    commit before it recorded)."""
    family = store.family
    if family.archive is None:
        raise ArchiveError(
            f"family {family.name!r} has no archive (field 'archive'): there is nothing to "
            "recount from"
        )
    if since and until and utc_naive(since) >= utc_naive(until):
        raise ValueError(f"--from ({since}) must be before --to ({until})")
    report = RecountReport(family.name, since, until)
    encode, decode = store.keys.json_codec()
    wanted = None if counters is None else {tuple(encode(c)) for c in counters}
    seen = Seen()
    segments = _archived(store, report, wanted, since, until, now or datetime.now(UTC), seen)
    report.unrecorded = _unrecorded(store, since, until)
    names = set(segments) if wanted is None else set(wanted)
    present: dict[tuple[Any, ...], Present] = {}
    if until is None:
        present = _present(store, names if wanted is not None else None, segments, seen, since)
        names |= set(present)
    for name in sorted(names, key=repr):
        result = recount_counter(
            tuple(decode(list(name))),
            segments.get(name, []),
            present.get(name) if until is None else None,
        )
        report.counters.append(result)
    return report


# --- the archive ------------------------------------------------------------------------------


def _manifests(
    store: Store, since: datetime | None, until: datetime | None
) -> Iterator[tuple[datetime, str, Manifest]]:
    for started_at, run_id, archive in store.audit.archives(since, until):
        for name, text in sorted(archive.items()):
            try:
                yield started_at, run_id, Manifest.from_text(text)
            except (ValueError, KeyError, TypeError) as exc:
                raise ArchiveError(
                    f"family {store.family.name!r}: the audit row of run {run_id!r} has an "
                    f"archive entry {name!r} that is no manifest: {exc}"
                ) from exc


def _archived(
    store: Store,
    report: RecountReport,
    wanted: set[tuple[Any, ...]] | None,
    since: datetime | None,
    until: datetime | None,
    now: datetime,
    seen: Seen,
) -> dict[tuple[Any, ...], list[ArchivedSegment]]:
    """Per counter (JSON-encoded key), its archived commits in the window: every file of the
    window's manifests read and checked, its rows summed per counter and commit (a row in two
    files counted once, in the earlier commit). ``seen`` gets the files named and pruned."""
    family = store.family
    layout = store.runs.archive_layout()
    cutoff = seen.cutoff = pruned_before(family, now)
    found = sorted(_manifests(store, since, until), key=lambda m: (m[0], m[2].name))
    per: dict[tuple[tuple[Any, ...], str], dict[str, Any]] = {}
    rows_seen: dict[tuple[Any, ...], set[tuple[Any, ...]]] = defaultdict(set)
    for _started_at, run_id, manifest in found:
        seen.named.add(manifest.url)
        data = read_file(family, manifest.url)
        day = day_in_url(manifest.url)
        if data is None and cutoff is not None and day is not None and day < cutoff:
            report.pruned += 1
            seen.pruned.add(manifest.url)
            seen.pruned_runs.add((run_id, manifest.shard))
            continue
        checked = check_file(manifest, data, layout.increment)
        report.files += 1
        if checked.problem or checked.table is None:
            report.file_problems.append(checked.problem or f"{manifest.url}: unreadable")
            continue
        table = checked.table
        keys = list(
            zip(
                *(encoded_values(t, table.column(n)) for n, t in layout.key),
                strict=True,
            )
        )
        rows = list(
            zip(
                *(table.column(n).to_pylist() for n, _t in layout.clustering),
                strict=True,
            )
        )
        columns = {
            name: table.column(name).to_pylist()
            for name in (
                "_commit_id",
                "_run_id",
                "_value_after",
                "_base_value",
                "_base_commit",
                "_reset",
                "_from_zero",
                "_counted",
                layout.increment,
            )
        }
        commit_ms = table.column("_commit_time").cast("int64").to_pylist()
        origins = table.column("_origin").cast("int64").to_pylist()
        for i, counter in enumerate(keys):
            if wanted is not None and counter not in wanted:
                continue
            if rows[i] in rows_seen[counter]:
                report.duplicates += 1
                continue
            rows_seen[counter].add(rows[i])
            commit = columns["_commit_id"][i]
            entry = per.get((counter, commit))
            if entry is None:
                entry = per[(counter, commit)] = {
                    "commit_id": commit,
                    "commit_time_ms": commit_ms[i],
                    "run_id": columns["_run_id"][i],
                    "value": columns["_value_after"][i],
                    "base_value": columns["_base_value"][i],
                    "base_commit": columns["_base_commit"][i],
                    "origin_ms": origins[i],
                    "reset": columns["_reset"][i],
                    "from_zero": columns["_from_zero"][i],
                    "rows": 0,
                    "counted_rows": 0,
                    "counted_sum": 0,
                    "file": manifest.url,
                }
            entry["rows"] += 1
            if columns["_counted"][i]:
                entry["counted_rows"] += 1
                entry["counted_sum"] += columns[layout.increment][i] or 0
    out: dict[tuple[Any, ...], list[ArchivedSegment]] = defaultdict(list)
    for (counter, _commit), entry in per.items():
        out[counter].append(ArchivedSegment(**entry))
    return out


def _unrecorded(store: Store, since: datetime | None, until: datetime | None) -> list[str]:
    """The files of the window's days that no manifest of those days names."""
    first = None if since is None else datetime.combine(utc_naive(since).date(), time.min)
    last = None if until is None else datetime.combine(utc_naive(until).date(), time.min)
    end = None if last is None else last + timedelta(days=1)
    named = {m.url for _s, _r, m in _manifests(store, first, end)}
    out = []
    for day in days(store.family):
        moment = datetime.combine(date.fromisoformat(day), time.min)
        if (first is not None and moment < first) or (end is not None and moment >= end):
            continue
        out += [str(p) for p in day_files(store.family, day) if str(p) not in named]
    return out


# --- what is in Cassandra ------------------------------------------------------------------


def _present(
    store: Store,
    names: set[tuple[Any, ...]] | None,
    segments: dict[tuple[Any, ...], list[ArchivedSegment]],
    seen: Seen,
    since: datetime | None,
) -> dict[tuple[Any, ...], Present]:
    """Per counter, its checkpoint, its compact copy and, when its last commit is not
    archived in the files read, the counted rows of that commit still present, or why it
    cannot be rebuilt (``names`` None: every counter of the ledger)."""
    encode, decode = store.keys.json_codec()
    by_bucket: dict[tuple[int, int], list[Key] | None] = {}
    if names is None:
        by_bucket = {(s, b): None for s in range(store.family.shards) for b in range(BUCKETS)}
    else:
        for name in names:
            key = decode(list(name))
            by_bucket.setdefault(store.keys.bucket(key), []).append(key)  # type: ignore[union-attr]
    out: dict[tuple[Any, ...], Present] = {}
    for (shard, bucket), keys in sorted(by_bucket.items()):
        ledger = store.ledger.read_ledger(shard, bucket, keys)
        copies = store.ledger.read_copies(shard, bucket, keys)
        counters = set(ledger.checkpoints) | set(copies) | set(keys or ())
        archived = {c: {s.commit_id for s in segments.get(tuple(encode(c)), [])} for c in counters}
        for counter in counters:
            cp = ledger.checkpoints.get(counter)
            copy = copies.get(counter)
            name = tuple(encode(counter))
            base = Present(
                None if cp is None else cp.value,
                None if cp is None or cp.commit_id is None else str(cp.commit_id),
                None if cp is None else cp.origin_ms,
                None if cp is None else cp.epoch_ms,
                copy_value=None if copy is None else copy.value,
                copy_commit=None if copy is None or copy.commit_id is None else str(copy.commit_id),
                copy_epoch_ms=None if copy is None else copy.epoch_ms,
                copy_behind=cp is not None
                and copy is not None
                and (copy.writetime or 0) < (cp.version or 0),
            )
            if (
                cp is not None
                and cp.commit_id is not None
                and str(cp.commit_id) not in archived[counter]
            ):
                base = _last_commit(store, shard, bucket, counter, cp, base, seen, since)
            out[name] = base
    return out


def _last_commit(
    store: Store,
    shard: int,
    bucket: int,
    counter: Key,
    cp: Any,
    present: Present,
    seen: Seen,
    since: datetime | None,
) -> Present:
    """A counter's last commit, not archived in the files read: from its record, whether it
    was built on zero and its counted rows not archived (then read where still present); or,
    when its rows are archived in a file the retention removed (or of a run before ``since``),
    why it cannot be rebuilt."""
    from dataclasses import replace

    encode, _decode = store.keys.json_codec()
    record = store.runs.commit_record(cp.run_id or "", shard, bucket, cp.commit_id)
    if record is None:
        if (cp.run_id or "", shard) in seen.pruned_runs:
            return replace(
                present,
                cannot_rebuild=(
                    f"its last commit {cp.commit_id} (run {cp.run_id}) is older than the run "
                    f"log keeps a record, and its run's archive file was removed by the "
                    f"archive's retention ({_retention(store)}): its evidence expired"
                ),
            )
        if cp.pending_rows:
            return replace(
                present,
                unknown=(
                    f"the record of its last commit {cp.commit_id} (run {cp.run_id}) is gone "
                    "from the run log (kept 14 days): whether its rows still present are "
                    "archived cannot be told"
                ),
            )
        return present
    keys_blob, rows_blob, archived = record
    gone = _evidence_gone(store, archived, tuple(encode(counter)), seen, since)
    if gone is not None:
        return replace(
            present, cannot_rebuild=f"its last commit {cp.commit_id} (run {cp.run_id}) {gone}"
        )
    entry = next(
        (keys for c, _e, keys in keys_blob if tuple(c) == tuple(encode(counter))),
        None,
    )
    if rows_blob is None or entry is None:
        return replace(
            present,
            unknown=f"its last commit {cp.commit_id} was recorded before the family had an archive",
        )
    rec = unpack_record(rows_blob)
    name = tuple(encode(counter))
    segment = next((s for s in rec.segments if s.counter == name), None)
    flags = rec.flags_of(name) or []
    skipped = archived_skipped(archived)
    if skipped is not None and name not in skipped:
        flags = [f | ROW_ARCHIVED for f in flags]
    wanted = [
        k
        for k, f in zip(entry.keys, flags, strict=True)
        if f & ROW_COUNTED and not f & ROW_ARCHIVED
    ]
    found = store.raw.read_rows_at(counter, wanted) if wanted else []
    return replace(
        present,
        first=bool(segment and (segment.from_zero or segment.reset)),
        extra_rows=len(found),
        extra_sum=sum(r[2] or 0 for r in found),
    )


def _retention(store: Store) -> str:
    kept = store.family.archive_retention
    return f"archive_retention {kept.days}d" if kept is not None else "no archive_retention"


def _evidence_gone(
    store: Store,
    mark: str | None,
    name: tuple[Any, ...],
    seen: Seen,
    since: datetime | None,
) -> str | None:
    """Why the rows of a commit whose run-log mark says they are archived (``mark``) are not
    among the files read, when that is no fault: its file was removed by the archive's
    retention, or belongs to a run before ``since``. None otherwise (a file lost inside the
    retention is a difference)."""
    url = archived_url(mark)
    skipped = archived_skipped(mark)
    if url is None or skipped is None or name in skipped:
        return None
    if url in seen.pruned or (url not in seen.named and _past_retention(store, url, seen)):
        return (
            f"is archived in {url}, which the archive's retention ({_retention(store)}) "
            "removed: its evidence expired"
        )
    if since is not None and url not in seen.named:
        return (
            f"is archived in {url}, a file of a run before --from {to_text(since)}: widen "
            "the window to prove it"
        )
    return None


def _past_retention(store: Store, url: str, seen: Seen) -> bool:
    """Whether the archive's retention removed the file at ``url`` (its day folder is past the
    retention, and the file is gone)."""
    day = day_in_url(url)
    if seen.cutoff is None or day is None or day >= seen.cutoff:
        return False
    if url not in seen.gone:  # once per file, however many counters it holds
        seen.gone[url] = read_file(store.family, url) is None
    return seen.gone[url]
