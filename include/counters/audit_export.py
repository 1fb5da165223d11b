"""An audit export as a stream of bytes: CSV, JSON or Parquet, of any length.

``counterctl audit --format`` and the UI's export endpoint write the same bytes from the same
rows (``status.audit_stream``, newest first). Each format is produced as the rows are read, a
page at a time, so an export of a year of minute runs holds one page in memory:

* ``csv``: a header line (``status.AUDIT_COLUMNS``), then a line per row; the JSON columns as
  JSON text.
* ``json``: ``{"family", "since", "until", "rows": [...]}``, written row by row.
* ``jsonl``: one JSON object per row and line (the ``rows`` of ``json``), for tools that read
  a stream a line at a time (``jq``, log shippers) without holding the whole document.
* ``parquet``: typed columns (times as UTC timestamps in ms, counts as int64, the JSON columns
  as JSON text), a row group every ``ROW_GROUP_ROWS`` rows (pyarrow).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from .core import stamp, to_text, utc_naive
from .status import AUDIT_COLUMNS, JSON_COLUMNS, AuditRow, csv_cells

if TYPE_CHECKING:
    import pyarrow as pa

FORMATS = ("csv", "json", "jsonl", "parquet")
MEDIA_TYPES = {
    "csv": "text/csv",
    "json": "application/json",
    "jsonl": "application/jsonl",
    "parquet": "application/vnd.apache.parquet",
}
ROW_GROUP_ROWS = 10_000
"""Rows per Parquet row group (and per chunk the CSV and JSON encoders yield at most)."""
TIME_COLUMNS = ("started_at", "epoch_before", "epoch_after")
INT_COLUMNS = (
    "counters",
    "rows_folded",
    "sum_folded",
    "rows_deleted",
    "late_rows",
    "late_sum",
    "max_lateness_ms",
    "conflicts",
)
BOOL_COLUMNS = ("dry_run", "sweep")
FLOAT_COLUMNS = ("duration_s",)


def check_format(name: str) -> str:
    if name not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}; got {name!r}")
    return name


def filename(family: str, fmt: str, now: datetime | None = None) -> str:
    return f"audit_{family}_{stamp(now or datetime.now(UTC))}.{fmt}"


def _batches(rows: Iterable[AuditRow], size: int) -> Iterator[list[AuditRow]]:
    batch: list[AuditRow] = []
    for row in rows:
        batch.append(row)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def csv_chunks(rows: Iterable[AuditRow], batch_rows: int = ROW_GROUP_ROWS) -> Iterator[bytes]:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(AUDIT_COLUMNS)
    yield out.getvalue().encode()
    for batch in _batches(rows, batch_rows):
        out.seek(0)
        out.truncate()
        writer.writerows(csv_cells(row) for row in batch)
        yield out.getvalue().encode()


def json_chunks(
    rows: Iterable[AuditRow],
    family: str,
    since: datetime | None,
    until: datetime | None,
    batch_rows: int = ROW_GROUP_ROWS,
) -> Iterator[bytes]:
    head = json.dumps({"family": family, "since": to_text(since), "until": to_text(until)})
    yield (head[:-1] + ', "rows": [').encode()
    first = True
    for batch in _batches(rows, batch_rows):
        text = ", ".join(json.dumps(row.as_dict(), sort_keys=False) for row in batch)
        yield ((", " if not first else "") + text).encode()
        first = False
    yield b"]}\n"


def jsonl_chunks(rows: Iterable[AuditRow], batch_rows: int = ROW_GROUP_ROWS) -> Iterator[bytes]:
    for batch in _batches(rows, batch_rows):
        yield "".join(json.dumps(row.as_dict()) + "\n" for row in batch).encode()


def parquet_schema() -> pa.Schema:
    import pyarrow as pa

    def kind(column: str) -> pa.DataType:
        if column in TIME_COLUMNS:
            return pa.timestamp("ms", tz="UTC")
        if column in INT_COLUMNS:
            return pa.int64()
        if column in BOOL_COLUMNS:
            return pa.bool_()
        if column in FLOAT_COLUMNS:
            return pa.float64()
        return pa.string()

    return pa.schema([(column, kind(column)) for column in AUDIT_COLUMNS])


def _parquet_value(row: AuditRow, column: str) -> Any:
    if column in TIME_COLUMNS:
        moment = getattr(row, column)
        return None if moment is None else utc_naive(moment).replace(tzinfo=UTC)
    if column == "duration_s":
        return row.duration_s
    value = getattr(row, column)
    if column in JSON_COLUMNS:
        return json.dumps(value, sort_keys=True)
    return value


class _Sink(io.RawIOBase):
    """A write-only file that hands out what was written since the last ``take``: pyarrow
    writes the Parquet file into it, the export yields the bytes a row group at a time."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._position = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        chunk = bytes(data)
        self._parts.append(chunk)
        self._position += len(chunk)
        return len(chunk)

    def tell(self) -> int:
        return self._position

    def take(self) -> bytes:
        data = b"".join(self._parts)
        self._parts.clear()
        return data


def parquet_chunks(rows: Iterable[AuditRow], batch_rows: int = ROW_GROUP_ROWS) -> Iterator[bytes]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = parquet_schema()
    sink = _Sink()
    with pq.ParquetWriter(sink, schema, compression="zstd") as writer:
        for batch in _batches(rows, batch_rows):
            table = pa.Table.from_pydict(
                {c: [_parquet_value(row, c) for row in batch] for c in AUDIT_COLUMNS},
                schema=schema,
            )
            writer.write_table(table, row_group_size=batch_rows)
            yield sink.take()
    yield sink.take()


def chunks(
    fmt: str,
    rows: Iterable[AuditRow],
    family: str,
    since: datetime | None,
    until: datetime | None,
) -> Iterator[bytes]:
    """The export in ``fmt`` (``FORMATS``), as the rows come."""
    check_format(fmt)
    if fmt == "csv":
        return csv_chunks(rows)
    if fmt == "json":
        return json_chunks(rows, family, since, until)
    if fmt == "jsonl":
        return jsonl_chunks(rows)
    return parquet_chunks(rows)
