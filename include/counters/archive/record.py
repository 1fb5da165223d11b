"""A commit's archive record: per counter its value after the commit and what it was built
on, per counted row its increment and flags (pure)."""

from __future__ import annotations

import itertools
import json
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from ..core import FOLD_CARRIED, FOLD_DUPLICATE, ROW_COUNTED, Checkpoint, Fold
from ..errors import ArchiveError
from .values import NUMPY_INTS, RECORD_FORMAT, ROW_CARRIED, arrow_values, ints


@dataclass(frozen=True)
class Segment:
    """One counter's part of a commit, as the archive keeps it."""

    counter: tuple[Any, ...]
    """The counter's key, JSON-encoded as the run log keeps it."""
    value: int
    """The counter's value after the commit."""
    base_value: int
    base_commit: str | None
    origin_ms: int | None
    reset: bool
    epoch_ms: int
    rows: int
    from_zero: bool = False
    """The commit was built on zero: the counter's first checkpoint, or a reset's."""
    base_run: str | None = None
    """The run id of ``base_commit`` (where the run log keeps its record)."""


def row_flags(fold: Fold) -> bytes:
    """Each pending row's ``ROW_*`` flags: a row this fold counts is ``ROW_COUNTED`` (not in a
    reset, which consumes the rows it deletes, nor a unique family's duplicate); a carried row
    keeps its flags from the base's record (counted, archived) and is ``ROW_CARRIED``."""
    reset = fold.origin_ms is not None
    if not fold.counted_present and not fold.duplicates:  # all new: the usual fold
        return bytes([0 if reset else ROW_COUNTED]) * len(fold.pending)
    base_flags = fold.base.pending_flags or {}
    out = bytearray(len(fold.pending))
    for i, (key, kind) in enumerate(zip(fold.pending, fold.kinds, strict=True)):
        if kind == FOLD_CARRIED:
            flags = base_flags.get(key, ROW_COUNTED) | ROW_CARRIED
        elif kind == FOLD_DUPLICATE:
            flags = 0
        else:
            flags = ROW_COUNTED
        out[i] = flags & ~ROW_COUNTED if reset else flags
    return bytes(out)


def built_on_zero(base: Checkpoint) -> bool:
    """Whether a checkpoint is zero with nothing counted behind it: a counter's first (no
    commit) or a reset's (its value 0 at its own reset point); or one no archive holds that
    was built on zero (a commit carrying its rows rests on zero too)."""
    if base.unarchived_from_zero:
        return True
    if base.value != 0:
        return False
    return base.commit_id is None or (
        base.origin_ms is not None and base.epoch_ms == base.origin_ms
    )


SEGMENT_FIELDS = (
    ("value", pa.int64()),
    ("base_value", pa.int64()),
    ("base_commit", pa.string()),
    ("origin_ms", pa.int64()),
    ("reset", pa.bool_()),
    ("epoch_ms", pa.int64()),
    ("rows", pa.int64()),
    ("from_zero", pa.bool_()),
    ("base_run", pa.string()),
)
"""The columns of an archive record's segment table, after the counter's key parts (``c0``...)."""


def pack_record(
    folds: Sequence[Fold],
    encode_counter: Callable[[tuple[Any, ...]], list[Any]],
    clustering_types: Sequence[str],
) -> bytes:
    """The archive record of the rows ``folds`` count: an Arrow stream of their segments (one
    per fold: the counter, its value after and before, ...) and one of their rows (clustering
    columns, increment, flags), in the order of the folds and of each fold's ``pending`` (the
    order of the run log's keys). Columnar from the start: a million rows cost ~0.5 CPU-s."""
    for fold in folds:
        if len(fold.values) != len(fold.pending) or len(fold.kinds) != len(fold.pending):
            raise ArchiveError(
                f"counter {fold.counter}: the fold kept no values of its rows (keep_values): "
                "an archive cannot be recorded"
            )
    counters = (
        [f.counter for f in folds]
        if encode_counter is list
        else [encode_counter(f.counter) for f in folds]
    )
    width = len(counters[0]) if counters else 0
    segment_columns: dict[str, Any] = {
        f"c{i}": pa.array([c[i] for c in counters]) for i in range(width)
    }
    bases = [f.base for f in folds]
    segment_columns.update(
        value=[f.value for f in folds],
        base_value=[b.value for b in bases],
        base_commit=[None if b.commit_id is None else str(b.commit_id) for b in bases],
        origin_ms=[
            f.origin_ms if f.origin_ms is not None else b.origin_ms
            for f, b in zip(folds, bases, strict=True)
        ],
        reset=[f.origin_ms is not None for f in folds],
        epoch_ms=[f.epoch_ms for f in folds],
        rows=[len(f.pending) for f in folds],
        from_zero=[built_on_zero(b) for b in bases],
        base_run=[b.run_id if b.commit_id is not None else None for b in bases],
    )
    for name, kind in SEGMENT_FIELDS:
        values = segment_columns[name]
        if kind in NUMPY_INTS and None not in values:
            segment_columns[name] = ints(values, kind)
        elif all(v is None for v in values):
            segment_columns[name] = pa.nulls(len(values), kind)
        else:
            segment_columns[name] = pa.array(values, kind)
    keys = list(itertools.chain.from_iterable(f.pending for f in folds))
    values = list(itertools.chain.from_iterable(f.values for f in folds))
    flags = b"".join(row_flags(f) for f in folds)
    try:
        arrays = [arrow_values(t, [k[i] for k in keys]) for i, t in enumerate(clustering_types)]
        arrays.append(ints(values))
    except (OverflowError, pa.ArrowInvalid) as exc:
        raise ArchiveError(f"an increment does not fit an archive's int64: {exc}") from exc
    arrays.append(pa.array(flags, pa.uint8()) if flags else pa.array([], pa.uint8()))
    names = [f"k{i}" for i in range(len(clustering_types))] + ["increment", "flags"]
    head = _ipc(pa.table(segment_columns))
    return RECORD_FORMAT + struct.pack(">I", len(head)) + head + _ipc(pa.table(arrays, names))


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


class ArchiveRecord:
    """A commit's archive record, read back: its segments and their rows, in order (columnar;
    the ``Segment`` objects only where one counter is looked at)."""

    def __init__(self, segment_table: pa.Table, rows: pa.Table) -> None:
        self.segment_table = segment_table
        self.rows = rows
        self._segments: list[Segment] | None = None
        self._counters: list[tuple[Any, ...]] | None = None

    @property
    def counters(self) -> list[tuple[Any, ...]]:
        """Each segment's counter, JSON-encoded."""
        if self._counters is None:
            parts = [
                self.segment_table.column(n).to_pylist()
                for n in self.segment_table.column_names
                if n.startswith("c") and n[1:].isdigit()
            ]
            self._counters = list(zip(*parts, strict=True)) if parts else []
        return self._counters

    @property
    def segments(self) -> list[Segment]:
        if self._segments is None:
            fields = {n: self.segment_table.column(n).to_pylist() for n, _k in SEGMENT_FIELDS}
            self._segments = [
                Segment(
                    counter,
                    fields["value"][i],
                    fields["base_value"][i],
                    fields["base_commit"][i],
                    fields["origin_ms"][i],
                    bool(fields["reset"][i]),
                    fields["epoch_ms"][i],
                    fields["rows"][i],
                    bool(fields["from_zero"][i]),
                    fields["base_run"][i],
                )
                for i, counter in enumerate(self.counters)
            ]
        return self._segments

    def offsets(self) -> list[int]:
        """Where each segment's rows start in ``rows`` (and, last, where they end)."""
        return [0, *itertools.accumulate(self.segment_table.column("rows").to_pylist())]

    def flags_of(self, counter: Sequence[Any]) -> list[int] | None:
        """The ``ROW_*`` flags of one counter's rows (JSON-encoded key), None if absent."""
        wanted = tuple(counter)
        if wanted not in self.counters:
            return None
        i = self.counters.index(wanted)
        starts = self.offsets()
        return self.rows.column("flags").slice(starts[i], starts[i + 1] - starts[i]).to_pylist()


def record_part(record: ArchiveRecord, keep: Callable[[tuple[Any, ...]], bool]) -> ArchiveRecord:
    """The segments (and their rows) of the counters ``keep`` says, in order."""
    starts = record.offsets()
    chosen = [i for i, c in enumerate(record.counters) if keep(c)]
    rows = [j for i in chosen for j in range(starts[i], starts[i + 1])]
    return ArchiveRecord(
        record.segment_table.take(pa.array(chosen, pa.int64())),
        record.rows.take(pa.array(rows, pa.int64())),
    )


def join_records(records: Sequence[ArchiveRecord]) -> bytes:
    """One archive record of several (their segments in order): a reshard moves a counter's
    entry into the record of its commit at the counter's new place."""
    parts = [r for r in records if r.segment_table.num_rows]
    if not parts:
        raise ArchiveError("no archive record to join")
    segments = pa.concat_tables([r.segment_table for r in parts], promote_options="permissive")
    rows = pa.concat_tables([r.rows for r in parts])
    head = _ipc(segments)
    return RECORD_FORMAT + struct.pack(">I", len(head)) + head + _ipc(rows)


def unpack_record(blob: bytes) -> ArchiveRecord:
    if blob[:2] != RECORD_FORMAT:
        raise ArchiveError(f"not an archive record (starts {blob[:2]!r})")
    (size,) = struct.unpack_from(">I", blob, 2)
    buffer = pa.py_buffer(blob)
    segments = pa.ipc.open_stream(buffer.slice(6, size)).read_all()
    rows = pa.ipc.open_stream(buffer.slice(6 + size)).read_all()
    return ArchiveRecord(segments, rows)


def archived_mark(url: str | None, skipped: Sequence[Sequence[Any]]) -> str:
    """The run log's ``archived`` cell of a commit: the file that holds its rows (None: none
    needed one) and the counters whose rows it left out (quarantined, not deleted)."""
    return json.dumps({"url": url, "skipped": [list(c) for c in skipped]}, separators=(",", ":"))


def archived_url(mark: str | None) -> str | None:
    """The file an ``archived`` cell names (None: not archived, or no row needed a file)."""
    if not mark:
        return None
    try:
        url = json.loads(mark).get("url")
    except (ValueError, AttributeError):
        return None
    return url if isinstance(url, str) else None


def archived_skipped(mark: str | None) -> set[tuple[Any, ...]] | None:
    """The counters an ``archived`` cell left out; None when the commit is not archived."""
    if not mark:
        return None
    try:
        data = json.loads(mark)
    except ValueError:
        return set()
    return {tuple(c) for c in data.get("skipped") or ()}
