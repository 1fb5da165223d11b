"""The archive's pure parts: what a fold keeps of its rows, a commit's archive record, the file's
table and bytes, a file checked against its manifest, and the recount's rule."""

from __future__ import annotations

import io
import uuid
from dataclasses import replace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from counters.archive import (
    ROW_CARRIED,
    ArchivedSegment,
    Commit,
    Layout,
    Present,
    archived_mark,
    archived_skipped,
    archived_url,
    check_file,
    manifest_of,
    pack_record,
    parquet_bytes,
    recount_counter,
    row_flags,
    table_of,
    unpack_record,
)
from counters.core import (
    EMPTY_CHECKPOINT,
    FOLD_CARRIED,
    FOLD_DUPLICATE,
    FOLD_NEW,
    ROW_ARCHIVED,
    ROW_COUNTED,
    Checkpoint,
    fold_counter,
)
from counters.errors import ArchiveError

pytestmark = pytest.mark.unit

LAYOUT = Layout(
    key=(("type", "text"),),
    clustering=(("modify_time", "timestamp"), ("actor", "text"), ("version", "bigint")),
    increment="increment",
)


def rows(n, start=1000, actor="w"):
    return [(start + i, (start + i, actor, i), i + 1) for i in range(n)]


def encode(counter):
    return list(counter)


def test_a_fold_keeps_each_pending_rows_value_and_kind_only_when_asked():
    base = fold_counter(("IBM",), EMPTY_CHECKPOINT, rows(3), 2000)
    assert (base.values, base.kinds) == ((), b"")  # the engine's speed when no archive
    base_cp = Checkpoint(base.value, base.epoch_ms, uuid.uuid1(), frozenset(base.pending))
    later = [*rows(3), (1500, (1500, "late", 9), 40), (1600, (1600, "w", 99), 7)]
    fold = fold_counter(("IBM",), base_cp, later, 2000, keep_values=True)
    kinds = dict(zip(fold.pending, fold.kinds, strict=True))
    values = dict(zip(fold.pending, fold.values, strict=True))
    assert [kinds[k] for _t, k, _i in rows(3)] == [FOLD_CARRIED] * 3
    assert kinds[(1500, "late", 9)] == kinds[(1600, "w", 99)] == FOLD_NEW
    assert values[(1500, "late", 9)] == 40 and values[(1000, "w", 0)] == 1
    unique = fold_counter(
        ("m",),
        EMPTY_CHECKPOINT,
        [(1, (1, "ann"), 1), (2, (2, "ann"), 1), (3, (3, "bob"), 1)],
        10,
        member_index=1,
        keep_values=True,
    )
    assert unique.value == 2 and sorted(unique.kinds) == [FOLD_NEW, FOLD_NEW, FOLD_DUPLICATE]


def test_row_flags_count_new_rows_carry_the_bases_flags_and_a_reset_counts_none():
    base_cp = Checkpoint(
        6,
        2000,
        uuid.uuid1(),
        frozenset({(1000, "w", 0), (1001, "w", 1)}),
        pending_flags={(1000, "w", 0): ROW_COUNTED | ROW_ARCHIVED, (1001, "w", 1): 0},
    )
    fold = fold_counter(("IBM",), base_cp, rows(3), 3000, keep_values=True)
    flags = dict(zip(fold.pending, row_flags(fold), strict=True))
    assert flags[(1000, "w", 0)] == ROW_COUNTED | ROW_ARCHIVED | ROW_CARRIED
    assert flags[(1001, "w", 1)] == ROW_CARRIED  # a reset's consumed row, carried: not counted
    assert flags[(1002, "w", 2)] == ROW_COUNTED
    from dataclasses import replace

    reset = replace(fold, origin_ms=3000)
    assert not any(f & ROW_COUNTED for f in row_flags(reset))
    assert row_flags(reset)[fold.pending.index((1000, "w", 0))] & ROW_ARCHIVED


def test_an_archive_record_round_trips_and_names_each_counters_rows():
    a = fold_counter(("IBM",), EMPTY_CHECKPOINT, rows(3), 5000, keep_values=True)
    b = fold_counter(("AAPL",), EMPTY_CHECKPOINT, rows(2, 3000, "x"), 5000, keep_values=True)
    blob = pack_record([a, b], encode, LAYOUT.clustering_types)
    record = unpack_record(blob)
    assert [s.counter for s in record.segments] == [("IBM",), ("AAPL",)]
    assert [s.value for s in record.segments] == [6, 3]
    assert all(s.from_zero and s.base_commit is None for s in record.segments)
    assert record.offsets() == [0, 3, 5]
    assert record.flags_of(["AAPL"]) == [ROW_COUNTED, ROW_COUNTED]
    assert record.rows.column("increment").to_pylist() == [1, 2, 3, 1, 2]
    assert record.rows.column("k1").to_pylist() == ["w", "w", "w", "x", "x"]
    with pytest.raises(ArchiveError, match="kept no values"):
        pack_record([fold_counter(("X",), EMPTY_CHECKPOINT, rows(1), 5000)], encode, ["bigint"])


def _commit(folds, keep=None, commit="c1", time_ms=1):
    record = unpack_record(pack_record(folds, encode, LAYOUT.clustering_types))
    n = record.rows.num_rows
    return Commit("run-1", 0, 3, commit, time_ms, record, keep or [True] * n)


def test_the_files_table_has_the_kept_rows_with_their_commit_and_counter():
    a = fold_counter(("IBM",), EMPTY_CHECKPOINT, rows(3), 5000, keep_values=True)
    b = fold_counter(("AAPL",), EMPTY_CHECKPOINT, rows(2), 5000, keep_values=True)
    table = table_of([_commit([a, b], [True, False, True, True, True])], LAYOUT)
    assert table.num_rows == 4
    assert table.column("type").to_pylist() == ["IBM", "IBM", "AAPL", "AAPL"]
    assert table.column("increment").to_pylist() == [1, 3, 1, 2]
    assert table.column("_value_after").to_pylist() == [6, 6, 3, 3]
    assert table.column("_counted").to_pylist() == [True] * 4
    assert table.schema.field("modify_time").type == pa.timestamp("ms", tz="UTC")
    clash = Layout((("_run_id", "text"),), LAYOUT.clustering, "increment")
    with pytest.raises(ArchiveError, match="clash with the archive file's own columns"):
        table_of([_commit([a])], clash)


def test_a_file_is_checked_against_its_manifest_bytes_rows_and_sum():
    a = fold_counter(("IBM",), EMPTY_CHECKPOINT, rows(3), 5000, keep_values=True)
    table = table_of([_commit([a])], LAYOUT)
    data = parquet_bytes(table, {"run_id": "run-1"})
    assert data == parquet_bytes(table, {"run_id": "run-1"})  # a retry can tell its own file
    manifest = manifest_of("file:///a/run-1-0.parquet", 0, table, data, 1, LAYOUT)
    assert (manifest.rows, manifest.sum, manifest.counted_sum) == (3, 6, 6)
    assert check_file(manifest, data, "increment").problem is None
    changed = table.set_column(
        table.schema.get_field_index("increment"), "increment", pa.array([1, 2, 30])
    )
    tampered = parquet_bytes(changed, {"run_id": "run-1"})
    problem = check_file(manifest, tampered, "increment").problem
    assert "sha256" in problem and "changed after the run wrote it" in problem
    assert check_file(manifest, None, "increment").problem.endswith("missing")
    # a changed file whose manifest was changed to match still has to add up
    forged = manifest.__class__(**{**manifest.__dict__, "sha256": _sha(tampered)})
    assert (
        "summing to 33, the manifest says 3 summing to 6"
        in check_file(forged, tampered, "increment").problem
    )
    read = pq.read_table(io.BytesIO(data))
    assert read.num_rows == 3


def _sha(data):
    import hashlib

    return hashlib.sha256(data).hexdigest()


def seg(commit, t, value, counted, *, origin=None, reset=False, zero=False, rows=None):
    return ArchivedSegment(
        commit, t, "run", value, 0, None, origin, reset, rows or 1, 1, counted, "f", zero
    )


def test_recount_chains_commits_from_zero_to_the_compact_value():
    segments = [seg("a", 1, 10, 10, zero=True), seg("b", 2, 15, 5), seg("c", 3, 22, 7)]
    present = Present(25, "d", None, 100, extra_rows=1, extra_sum=3, copy_value=25, copy_commit="d")
    result = recount_counter(("IBM",), segments, present)
    assert result.equal and (result.opening, result.from_start, result.rebuilt) == (0, True, 25)
    # the ledger's commit archived: nothing present to add
    done = Present(22, "c", None, 100, copy_value=22, copy_commit="c")
    assert recount_counter(("IBM",), segments, done).equal
    # a commit whose rows are missing from the archive breaks the chain
    broken = [segments[0], segments[2]]
    result = recount_counter(("IBM",), broken, done)
    assert not result.equal and "took the value from 10 to 22" in result.problems[0]
    # a first commit whose value is not its rows' sum
    result = recount_counter(("IBM",), [seg("a", 1, 11, 10, zero=True)], None)
    assert "is not the sum of its counted rows" in result.problems[0]
    # a compact copy that differs from the rows
    wrong = Present(22, "c", None, 100, copy_value=23, copy_commit="c")
    result = recount_counter(("IBM",), segments, wrong)
    assert "the compact table holds 23" in result.problems[0]
    # a copy of an earlier commit is behind, not a difference
    behind = Present(22, "c", None, 100, copy_value=15, copy_commit="b", copy_epoch_ms=50)
    result = recount_counter(("IBM",), segments, behind)
    assert result.equal and "earlier commit" in result.notes[0]
    # behind too when the commit lowered the epoch (a late backlog): told by its write time
    lowered = replace(behind, copy_epoch_ms=150, copy_behind=True)
    result = recount_counter(("IBM",), segments, lowered)
    assert result.equal and "earlier commit" in result.notes[0]
    assert not recount_counter(("IBM",), segments, replace(lowered, copy_behind=False)).equal


def test_recount_takes_the_current_era_from_its_reset_and_an_opening_otherwise():
    old = [seg("a", 1, 10, 10, zero=True), seg("b", 2, 15, 5)]
    era = [seg("r", 3, 0, 0, origin=500, reset=True), seg("x", 4, 4, 4, origin=500)]
    present = Present(4, "x", 500, 900, copy_value=4, copy_commit="x")
    result = recount_counter(("IBM",), old + era, present)
    assert result.equal and result.from_start and result.archived_commits == 2
    # a window that starts after the first commit: an opening balance, not from zero
    result = recount_counter(
        ("IBM",), old[1:], Present(15, "b", None, 9, copy_value=15, copy_commit="b")
    )
    assert result.equal and (result.opening, result.from_start) == (10, False)
    # no archived commit, a last commit built on earlier ones: not covered
    result = recount_counter(
        ("IBM",), [], Present(15, "b", None, 9, copy_value=15, copy_commit="b")
    )
    assert not result.equal and "not covered by the archive" in result.problems[0]
    # no archived commit yet, a first commit whose rows are all present
    first = Present(
        15, "b", None, 9, first=True, extra_rows=5, extra_sum=15, copy_value=15, copy_commit="b"
    )
    assert recount_counter(("IBM",), [], first).equal
    # an unknown counter is 0 both ways
    assert recount_counter(("NEW",), [], Present(None)).equal


def test_recount_of_a_commit_whose_evidence_expired_is_no_difference_but_a_wrong_copy_is():
    """Issue #49 item 4: the ledger's commit's rows are archived in a file the retention
    removed. Not rebuilt (no made-up 0), its own status; a tampered copy is still wrong."""
    gone = "archived in a file the retention removed"
    first = Present(55, "b", None, 9, first=True, copy_value=55, copy_commit="b")
    result = recount_counter(("IBM",), [], replace(first, cannot_rebuild=gone))
    assert (result.status, result.rebuilt, result.difference) == ("cannot_rebuild", None, None)
    assert not result.equal and result.problems == [] and result.cannot_rebuild == gone
    assert result.as_dict()["status"] == "cannot_rebuild"
    assert recount_counter(("IBM",), [], first).status == "different"  # without it: rebuilt 0
    tampered = replace(first, cannot_rebuild=gone, copy_value=56)
    result = recount_counter(("IBM",), [], tampered)
    assert result.status == "different" and "holds 56, the ledger's commit 55" in result.problems[0]
    # an archived last commit is proven whatever an earlier one's evidence says
    segments = [seg("b", 2, 55, 55, zero=True)]
    assert recount_counter(("IBM",), segments, replace(first, cannot_rebuild=gone)).equal


def test_an_archived_mark_names_the_counters_it_left_out():
    assert archived_skipped(None) is None
    mark = archived_mark("file:///x.parquet", [["IBM"]])
    assert archived_skipped(mark) == {("IBM",)}
    assert archived_skipped(archived_mark(None, [])) == set()
    assert archived_url(mark) == "file:///x.parquet" and archived_url(None) is None
