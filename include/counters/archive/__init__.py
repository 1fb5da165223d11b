"""The archive of deleted rows, pure: what a commit records of the rows it counts, the Parquet
table a cleanup writes of them, its manifest, and the recount of a counter from them.

A family with an ``archive`` keeps, beside each commit's record of counted keys in the run log,
an *archive record*: per counter its value after the commit (and the value and commit it was
built on, its reset point, whether it is a reset), and per counted row its increment and flags
(``core.ROW_*``: counted in the value or not, held by an archive already, carried from the base).
The fold has the rows' values in hand, so the cleanup reads none again; the server's recount
checked their sum before anything is deleted.

Before deleting a run's rows, the cleanup writes exactly those rows to one Parquet file per run
and shard (``storage``), records its manifest (rows, sum, sha256) in the run's audit row
and marks the commits archived in the run log; only then it deletes. A row archived but not
deleted (a crash between the two) is carried by the next fold with the flag ``ROW_ARCHIVED``,
so no cleanup archives it again.

**Recount.** A counter's value is its reset point's zero (or the value before the first archived
commit: the *opening*) plus the increments of the counted rows of every commit since, archived
or still present. Each archived commit says its value after: within the counter's current era
(its reset point, ``origin_ms``), consecutive archived commits must differ by the counted rows
the later one archived, and the last by the counted rows still present (``recount_counter``).

The package: ``values`` (formats, CQL values as Arrow), ``record`` (a commit's record),
``table`` (a cleanup's file and manifest), ``recount_rule``, all pure and re-exported here;
``storage`` (the only file I/O) is imported by name. The cleanup's archive step, which writes
through the store, is the engine's (``compaction.archive``): this package imports no store.
"""

from __future__ import annotations

from .record import (
    SEGMENT_FIELDS,
    ArchiveRecord,
    Segment,
    archived_mark,
    archived_skipped,
    archived_url,
    built_on_zero,
    join_records,
    pack_record,
    record_part,
    row_flags,
    unpack_record,
)
from .recount_rule import (
    ArchivedSegment,
    Present,
    Recount,
    recount_counter,
)
from .table import (
    Commit,
    FileCheck,
    Layout,
    Manifest,
    check_file,
    manifest_of,
    parquet_bytes,
    table_of,
)
from .values import (
    FILE_FORMAT,
    INT64,
    META_COLUMNS,
    META_KEY,
    NUMPY_INTS,
    RECORD_FORMAT,
    ROW_CARRIED,
    TIMESTAMP,
    arrow_type,
    arrow_values,
    encoded_values,
    ints,
)

__all__ = [
    "FILE_FORMAT",
    "INT64",
    "META_COLUMNS",
    "META_KEY",
    "NUMPY_INTS",
    "RECORD_FORMAT",
    "ROW_CARRIED",
    "SEGMENT_FIELDS",
    "TIMESTAMP",
    "ArchiveRecord",
    "ArchivedSegment",
    "Commit",
    "FileCheck",
    "Layout",
    "Manifest",
    "Present",
    "Recount",
    "Segment",
    "archived_mark",
    "archived_skipped",
    "archived_url",
    "arrow_type",
    "arrow_values",
    "built_on_zero",
    "check_file",
    "encoded_values",
    "ints",
    "join_records",
    "manifest_of",
    "pack_record",
    "parquet_bytes",
    "record_part",
    "recount_counter",
    "row_flags",
    "table_of",
    "unpack_record",
]
