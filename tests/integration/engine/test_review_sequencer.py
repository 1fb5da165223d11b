"""Adversarial review of the one run sequencer (``compaction/sequence.py``, what ``counterctl
compact`` and the DAG both run): each test reproduces a finding on the real node and asserts
the correct behaviour."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from cassandra import WriteTimeout
from counters import engine

from .helpers import aware

pytestmark = pytest.mark.integration


def _load(client, t0) -> None:
    for i in range(5):
        client.increment("IBM", 10, at=aware(t0 + timedelta(minutes=i + 1)))


def test_a_run_whose_success_row_write_times_out_is_not_audited_as_failed(make_family, t0):
    """The success row is written after the epoch advanced. Its write timing out (a write that
    may still have applied) went to the sequencer's error path, which wrote a ``failed`` row
    under the same key over it: ``failed``, 0 rows deleted, for a run that deleted its rows
    and advanced the epoch. The error still surfaces; the row stays the run's own."""
    _family, store, client = make_family()
    _load(client, t0)
    real_write = store.audit.write

    def write(record):
        row = real_write(record)
        if record["outcome"] == "success":
            raise WriteTimeout("audit INSERT timed out (it applied)", write_type=0)
        return row

    store.audit.write = write
    epoch = t0 + timedelta(minutes=10)
    with pytest.raises(WriteTimeout):
        engine.run_family(store, epoch, now=epoch + timedelta(minutes=5))
    store.audit.write = real_write
    assert store.state.family_epoch() == epoch
    assert client.read("IBM") == 50
    audit = store.audit.page(5)
    assert [(a["outcome"], a["rows_deleted"]) for a in audit] == [("success", 5)]


def test_a_run_whose_gx_result_cannot_be_stored_deletes_nothing_and_is_audited(
    make_family, t0, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """``counterctl compact`` runs the GX suite since the sequencer is shared; an error there
    that is neither the engine's nor the driver's (here: the result store is a folder under a
    plain file) left the run with no audit row at all. It deletes nothing and is audited."""
    (tmp_path / "afile").write_text("")
    monkeypatch.setenv("COUNTERS_GX_RESULTS", str(tmp_path / "afile" / "gx"))
    family, store, client = make_family()
    _load(client, t0)
    epoch = t0 + timedelta(minutes=10)
    with pytest.raises(OSError):
        engine.run_family(store, epoch, now=epoch + timedelta(minutes=5))
    assert store.state.family_epoch() is None
    raw = f"{family.keyspace}.{family.raw_table}"
    assert store.statements.session.execute(f"SELECT count(*) FROM {raw}").one()[0] == 5
    assert client.read("IBM") == 50
    audit = store.audit.page(5)
    assert [a["outcome"] for a in audit] == ["failed"]
    assert "NotADirectoryError" in audit[0]["message"] or "FileExistsError" in audit[0]["message"]
