"""A cleanup's file: the Parquet table of the rows it archives, its manifest, and the check
of a file read back against its manifest (pure)."""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..core import ROW_COUNTED
from ..errors import ArchiveError
from .record import ArchiveRecord
from .values import META_COLUMNS, META_KEY, TIMESTAMP, arrow_values


@dataclass(frozen=True)
class Layout:
    """The family's columns as an archive file names and types them."""

    key: tuple[tuple[str, str], ...]
    """(name, CQL type) of each partition key column."""
    clustering: tuple[tuple[str, str], ...]
    increment: str

    @property
    def clustering_types(self) -> list[str]:
        return [t for _n, t in self.clustering]

    def check(self) -> None:
        """Refuse a family whose own column names clash with an archive file's columns."""
        names = [n for n, _t in self.key + self.clustering] + [self.increment]
        clash = sorted(set(names) & set(META_COLUMNS))
        if clash or len(set(names)) != len(names):
            raise ArchiveError(
                f"the family's columns {clash or names} clash with the archive file's own "
                f"columns ({', '.join(META_COLUMNS)}): rename them to archive this family"
            )


@dataclass(frozen=True)
class Commit:
    """One commit of the run log whose rows a cleanup archives, with the rows it keeps (a mask
    over its record's rows: not of a quarantined counter, not archived already, still present
    when carried)."""

    run_id: str
    shard: int
    bucket: int
    commit_id: str
    commit_time_ms: int
    record: ArchiveRecord
    keep: Sequence[bool]


def table_of(commits: Sequence[Commit], layout: Layout) -> pa.Table:
    """The rows of an archive file: every kept row of ``commits``, in their order, each with
    its commit, its counter's segment and whether it counts in the value (columnar: the
    segments' columns taken per row, no Python loop over rows)."""
    layout.check()
    parts: list[pa.Table] = []
    for commit in commits:
        record = commit.record
        segments = record.segment_table
        if not segments.num_rows:
            continue
        counts = segments.column("rows").to_numpy()
        index = np.repeat(np.arange(segments.num_rows, dtype=np.int32), counts)  # row -> segment
        keep = np.asarray(commit.keep, dtype=bool)
        if keep.all():  # the usual commit: every row kept, nothing to filter
            rows, which = record.rows, pa.array(index)
        else:
            rows, which = record.rows.filter(pa.array(keep)), pa.array(index[keep])
        if not len(rows):
            continue
        n = len(rows)
        columns: dict[str, Any] = {
            "_run_id": pa.array([commit.run_id] * n, pa.string()),
            "_shard": pa.array(np.full(n, commit.shard, dtype=np.int32)),
            "_bucket": pa.array(np.full(n, commit.bucket, dtype=np.int32)),
            "_commit_id": pa.array([commit.commit_id] * n, pa.string()),
            "_commit_time": pa.array(np.full(n, commit.commit_time_ms, dtype=np.int64)).cast(
                TIMESTAMP
            ),
        }
        for position, (name, cql_type) in enumerate(layout.key):
            columns[name] = arrow_values(cql_type, segments.column(f"c{position}")).take(which)
        per_segment = {
            "_epoch": segments.column("epoch_ms").cast(TIMESTAMP),
            "_value_after": segments.column("value"),
            "_base_value": segments.column("base_value"),
            "_base_commit": segments.column("base_commit"),
            "_origin": segments.column("origin_ms").cast(TIMESTAMP),
            "_reset": segments.column("reset"),
            "_from_zero": segments.column("from_zero"),
        }
        for name, values in per_segment.items():
            columns[name] = values.take(which)
        for position, (name, _t) in enumerate(layout.clustering):
            columns[name] = rows.column(f"k{position}")
        columns[layout.increment] = rows.column("increment")
        columns["_counted"] = pc.not_equal(
            pc.bit_wise_and(rows.column("flags"), pa.scalar(ROW_COUNTED, pa.uint8())),
            pa.scalar(0, pa.uint8()),
        )
        parts.append(pa.table(columns))
    if not parts:
        return pa.table({})
    return pa.concat_tables(parts)


@dataclass(frozen=True)
class Manifest:
    """What a run's audit row records of one archive file: enough to find it and to prove it
    is the file the run wrote (rows, sum of their increments, sha256 of its bytes)."""

    url: str
    shard: int
    rows: int
    sum: int
    counted_sum: int
    sha256: str
    size: int
    commits: int

    @property
    def name(self) -> str:
        """The key of the audit row's ``archive`` map: the file's name."""
        return self.url.rstrip("/").rsplit("/", 1)[-1]

    def as_text(self) -> str:
        return json.dumps(self.__dict__, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_text(cls, text: str) -> Manifest:
        data = json.loads(text)
        return cls(**{k: data[k] for k in cls.__dataclass_fields__})


def parquet_bytes(table: pa.Table, meta: dict[str, Any]) -> bytes:
    """The file's bytes: the same table and metadata give the same bytes (a retry that finds
    the file of a crashed attempt can tell it is its own)."""
    described = table.replace_schema_metadata(
        {META_KEY: json.dumps(meta, sort_keys=True, default=str).encode()}
    )
    sink = io.BytesIO()
    pq.write_table(described, sink, compression="zstd", write_statistics=True)
    return sink.getvalue()


def manifest_of(
    url: str, shard: int, table: pa.Table, data: bytes, commits: int, layout: Layout
) -> Manifest:
    """The manifest of a file's bytes and rows."""
    increments = table.column(layout.increment)
    total = pc.sum(increments).as_py() or 0
    counted = pc.sum(increments.filter(table.column("_counted"))).as_py() or 0
    return Manifest(
        url,
        shard,
        table.num_rows,
        int(total),
        int(counted),
        hashlib.sha256(data).hexdigest(),
        len(data),
        commits,
    )


@dataclass(frozen=True)
class FileCheck:
    """An archive file read back against its manifest."""

    manifest: Manifest
    table: pa.Table | None
    problem: str | None = None


def check_file(manifest: Manifest, data: bytes | None, increment: str) -> FileCheck:
    """Read a file's bytes against its manifest: its sha256, then its rows and their sum (a
    file changed and given a new checksum elsewhere still has to add up)."""
    if data is None:
        return FileCheck(manifest, None, f"{manifest.url}: missing")
    digest = hashlib.sha256(data).hexdigest()
    if digest != manifest.sha256:
        return FileCheck(
            manifest,
            None,
            f"{manifest.url}: sha256 {digest} differs from the manifest's {manifest.sha256} "
            f"({len(data)} bytes, the run wrote {manifest.size}): the file was changed after "
            "the run wrote it",
        )
    try:
        table = pq.read_table(io.BytesIO(data))
    except (pa.ArrowException, OSError) as exc:
        return FileCheck(manifest, None, f"{manifest.url}: not a readable Parquet file: {exc}")
    total = pc.sum(table.column(increment)).as_py() or 0 if table.num_rows else 0
    if (table.num_rows, total) != (manifest.rows, manifest.sum):
        return FileCheck(
            manifest,
            None,
            f"{manifest.url}: {table.num_rows} row(s) summing to {total}, the manifest says "
            f"{manifest.rows} summing to {manifest.sum}",
        )
    return FileCheck(manifest, table)
