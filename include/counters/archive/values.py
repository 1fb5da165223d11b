"""The archive's formats and CQL values as Arrow values (pure)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from ..core import day_text

ROW_CARRIED = 4
"""Flag of a row the commit carried from its base (counted before, still present): if no
archive holds it yet, the cleanup archives it only if it is still there (``read_rows_at``)."""

RECORD_FORMAT = b"A2"
"""First bytes of an archive record (the run log's ``archive_rows`` cell)."""
FILE_FORMAT = 1
META_KEY = b"counters.archive"
"""The Parquet key-value metadata entry that describes an archive file (JSON)."""

META_COLUMNS = (
    "_run_id",
    "_shard",
    "_bucket",
    "_commit_id",
    "_commit_time",
    "_epoch",
    "_value_after",
    "_base_value",
    "_base_commit",
    "_origin",
    "_reset",
    "_from_zero",
    "_counted",
)
"""The columns an archive file has beside the family's key, clustering and increment columns."""


_INTS = {"int": pa.int32(), "bigint": pa.int64(), "smallint": pa.int16(), "tinyint": pa.int8()}
_TEXT = ("text", "varchar", "ascii", "uuid", "timeuuid", "inet")
TIMESTAMP = pa.timestamp("ms", tz="UTC")


def arrow_type(cql_type: str) -> pa.DataType:
    """How a key or clustering column is kept in an archive file: readable types; a varint, a
    decimal or any other type as its text."""
    if cql_type in _INTS:
        return _INTS[cql_type]
    if cql_type == "timestamp":
        return TIMESTAMP
    if cql_type == "date":
        return pa.date32()
    if cql_type == "boolean":
        return pa.bool_()
    if cql_type in ("float", "double"):
        return pa.float64()
    return pa.string()


NUMPY_INTS = {pa.int64(): np.int64, pa.int32(): np.int32, pa.int16(): np.int16, pa.int8(): np.int8}


INT64 = pa.int64()


def ints(values: Sequence[Any], kind: pa.DataType = INT64) -> pa.Array:
    """Python ints as an Arrow integer array, through numpy: ``pa.array`` of a Python list
    costs ~0.4 ms a call whatever its length, numpy ~15 us (a commit packs ~10 such columns
    per 1,000 counters). Nulls, or ints past the type, take ``pa.array``'s way."""
    try:
        return pa.array(np.array(values, dtype=NUMPY_INTS[kind]))
    except (TypeError, OverflowError, ValueError):
        return pa.array(values, kind)


def arrow_values(cql_type: str, values: Sequence[Any] | pa.Array | pa.ChunkedArray) -> Any:
    """Packed or JSON-encoded values (times as epoch ms, uuids and dates as text) as an Arrow
    array of ``arrow_type``."""
    kind = arrow_type(cql_type)
    if isinstance(values, pa.Array | pa.ChunkedArray):
        if kind == TIMESTAMP:
            return values.cast(pa.int64()).cast(TIMESTAMP)
        if kind == pa.date32():
            return values.cast(pa.string()).cast(pa.date32())
        return values.cast(kind)
    if kind == TIMESTAMP:
        return ints(values).cast(TIMESTAMP)
    if kind == pa.date32():
        return pa.array([None if v is None else str(v) for v in values], pa.string()).cast(
            pa.date32()
        )
    if kind == pa.string() and cql_type not in _TEXT:
        return pa.array([None if v is None else str(v) for v in values], pa.string())
    if kind in NUMPY_INTS:
        return ints(values, kind)
    return pa.array(values, kind)


def encoded_values(cql_type: str, column: pa.Array | pa.ChunkedArray) -> list[Any]:
    """An archive column back as the JSON-encoded values the run log keeps of a key (times as
    epoch ms, dates as ISO text), to compare counters however they are typed."""
    if arrow_type(cql_type) == TIMESTAMP:
        return column.cast(pa.int64()).to_pylist()
    if arrow_type(cql_type) == pa.date32():
        return [None if v is None else day_text(v) for v in column.to_pylist()]
    values = column.to_pylist()
    if cql_type == "varint":
        return [None if v is None else int(v) for v in values]
    return values
