"""Busy counters: more deleted rows in one counter's partition, within ``gc_grace_seconds``,
than the node's ``tombstone_failure_threshold`` (100,000, the default, on the test node too).
A read of such a partition from its start is refused (``READ_TOO_MANY_TOMBSTONES``); every
operator command must still work, exactly: each reads from a floor, or in slices the node
reads (``core.SliceWalk``).
"""

from __future__ import annotations

import json
import secrets
from datetime import date, datetime, timedelta

import pytest
from cassandra import ReadFailure
from cassandra.concurrent import execute_concurrent
from cassandra.query import BatchStatement, BatchType
from cassandra.util import uuid_from_time
from click.testing import CliRunner
from counters.cli import cli
from counters.client import CounterClient, Increment
from counters.config import load_catalog
from counters.core import to_millis, to_text, utc_aware
from counters.store import Store

from tests.copies import change_copy

from .helpers import real_now

pytestmark = pytest.mark.integration

DELETED = 101_000
"""Just past the node's tombstone_failure_threshold (100,000)."""
DAY = date(2026, 3, 29)


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def family_yaml(path, text: str):
    path.write_text("families:\n" + text)
    assert invoke("--config", path, "init").exit_code == 0


def test_every_command_works_on_a_counter_with_more_folded_rows_than_the_node_reads(
    tmp_path, engine_keyspace, conn
):
    """The reviewer's case: 101,000 increments of one counter folded (and deleted) by a run;
    ``reset`` and its ``--dry-run`` read the counter's whole partition and failed with
    READ_TOO_MANY_TOMBSTONES, with or without ``--at``. Here every command runs on it through
    ``counterctl``: read, compact (a sweep: ``discovery: scan``), quarantine and its release,
    recount (from the archive, which every cleanup and the reset write), reset dry and real,
    with and without ``--at``; each answers, exactly. Writing and folding 101,000 rows (two
    runs: a commit with an archive carries ~93,000 keys) is most of its time, 160 s on the
    shared 2-core machine at load 20: the failure needs that many tombstones, and they are
    made as a user makes them."""
    name = f"busy_{secrets.token_hex(3)}"
    path = tmp_path / "families.yaml"
    family_yaml(
        path,
        f"""  - name: {name}
    keyspace: {engine_keyspace}
    raw_table: raw_{name}
    compact_table: compact_{name}
    lag: 1m
    shards: 1
    discovery: scan
    archive: {tmp_path / "archive"}
""",
    )
    family = load_catalog(path).get(name)
    store = Store(conn, family)
    client = CounterClient(conn, family, store)
    hot = ("hot",)
    base = real_now().replace(second=0, microsecond=0) - timedelta(minutes=30)
    client.record(
        [
            Increment(hot, 1, utc_aware(base + timedelta(milliseconds=i)), ("w", i))
            for i in range(DELETED)
        ]
        + [Increment(("cold",), 2, utc_aware(base), ("w", 0))]
    )
    epochs = iter(base + timedelta(minutes=25, seconds=k) for k in range(60))

    def compact(*more: str):
        """``counterctl compact`` at the next epoch (a second after the last: runs follow each
        other faster than the minutes a default epoch moves by)."""
        epoch = to_text(next(epochs))
        return invoke("--config", path, "compact", "--family", name, "--epoch", epoch, *more)

    deleted = 0
    for _run in range(3):  # a commit carries so many keys: a backlog takes a run or two more
        ran = compact("--json")
        assert ran.exit_code == 0, ran.output
        deleted += json.loads(ran.stdout)["rows_deleted"]
        if deleted == DELETED + 1:
            break
    assert deleted == DELETED + 1
    with pytest.raises(ReadFailure):  # the partition is past the threshold from its start
        store.raw.read_rows([hot])

    # a row after every epoch and reset point of the test (a writer's clock ahead: it stays
    # newer)
    newer = Increment(hot, 7, utc_aware(real_now() + timedelta(minutes=10)), ("w", -1))
    client.record([newer])

    read = invoke("--config", path, "read", "--family", name, "hot")
    assert read.exit_code == 0 and read.output.startswith(f"hot\t{DELETED + 7}\t"), read.output

    # quarantine: a copy changed outside the engine is found by the next run (a sweep, which
    # reads the hot counter by parts), listed, then released with its copy restored
    change_copy(conn.session, f"{engine_keyspace}.compact_{name}", "hot", 5)
    tampered = compact()
    assert tampered.exit_code != 0 and "quarantined" in tampered.output, tampered.output
    held = invoke("--config", path, "quarantine", "--family", name, "--json")
    assert held.exit_code == 0 and [q["reason"] for q in json.loads(held.stdout)] == ["tampered"]
    released = invoke("--config", path, "quarantine", "--family", name, "--release", "hot")
    assert released.exit_code == 0, released.output
    assert client.read("hot") == DELETED + 7

    swept = compact("--json")
    assert swept.exit_code == 0, swept.output
    summary = json.loads(swept.stdout)
    assert summary["sweep"] and summary["windowed_counters"] == [], summary  # its whole past
    assert client.read("hot") == DELETED + 7

    # late rows among and below the tombstones, after that sweep (present, uncounted: the next
    # sweep, which walks the partition in slices, or a reset reaches them)
    late_among = Increment(
        hot, 100, utc_aware(base + timedelta(seconds=50, microseconds=500)), ("l", 1)
    )
    late_below = Increment(hot, 1000, utc_aware(base - timedelta(minutes=5)), ("l", 2))
    client.record([late_among, late_below])

    recount = invoke("--config", path, "recount", "--family", name, "--json")
    assert recount.exit_code == 0, recount.output
    counted = {tuple(c["counter"]): c for c in json.loads(recount.stdout)["counters"]}
    assert counted[("hot",)]["rebuilt"] == DELETED and counted[("hot",)]["equal"], counted

    # reset: its dry run without and with --at, then the reset; it consumes every present row
    # up to its point, the late rows among and below the tombstones included
    dry = invoke("--config", path, "reset", "--family", name, "hot", "--dry-run", "--json")
    assert dry.exit_code == 0, dry.output
    planned = json.loads(dry.stdout)
    assert (planned["value_before"], planned["rows_consumed"]) == (DELETED + 7, 2), planned
    at = planned["at"]
    dry_at = invoke(
        "--config", path, "reset", "--family", name, "hot", "--dry-run", "--at", at, "--json"
    )
    assert dry_at.exit_code == 0 and json.loads(dry_at.stdout)["rows_consumed"] == 2
    done = invoke("--config", path, "reset", "--family", name, "hot", "--at", at, "--yes")
    assert done.exit_code == 0 and "2 raw row(s) consumed" in done.output, done.output
    assert client.read("hot") == 7  # the row after the point
    at_ms = to_millis(datetime.fromisoformat(at))
    assert store.raw.read_rows_upto(hot, at_ms) == []  # past the tombstones: nothing left
    again = compact("--json")
    assert again.exit_code == 0, again.output
    assert client.read("hot") == 7 and client.read("cold") == 2
    after = invoke("--config", path, "recount", "--family", name, "hot")
    assert after.exit_code == 0, after.output


def test_a_rows_counter_with_more_deleted_business_rows_than_the_node_reads(
    tmp_path, engine_keyspace, conn
):
    """A rows family whose application deleted 101,000 of one counter's business rows (row
    deletes, as cancelled orders are deleted), its live rows after them: ``reconcile`` listed
    the family's counters with a scan and recounted each from its partition's start, both
    refused; so was the sweep's recount. Both now report and fix the count. The rows are
    written and deleted in single-partition batches (a few seconds)."""
    name = f"orders_{secrets.token_hex(3)}"
    table = f"{engine_keyspace}.{name}"
    conn.session.execute(
        f"CREATE TABLE {table} (location_id int, calculation_date date, timestamp timeuuid, "
        "order_id int, PRIMARY KEY ((location_id, calculation_date), timestamp, order_id))"
    )
    path = tmp_path / "families.yaml"
    family_yaml(
        path,
        f"""  - name: {name}
    kind: rows
    keyspace: {engine_keyspace}
    raw_table: {name}
    compact_table: {name}_counts
    columns: {{key: [location_id, calculation_date], time: timestamp}}
    lag: 1m
    shards: 1
""",
    )
    base = real_now() - timedelta(minutes=30)
    orders = [(uuid_from_time(base + timedelta(milliseconds=i)), i) for i in range(DELETED + 50)]
    insert = conn.session.prepare(
        f"INSERT INTO {table} (location_id, calculation_date, timestamp, order_id) "
        "VALUES (1, ?, ?, ?)"
    )
    batches = []
    for i in range(0, len(orders), 500):  # one partition's rows: unlogged batches
        batch = BatchStatement(BatchType.UNLOGGED)
        for t, o in orders[i : i + 500]:
            batch.add(insert, (DAY, t, o))
        batches.append((batch, ()))
    execute_concurrent(conn.session, batches, concurrency=16)
    at = base + timedelta(minutes=25)
    first = invoke("--config", path, "compact", "--family", name, "--epoch", to_text(at), "--json")
    assert first.exit_code == 0 and json.loads(first.stdout)["rows_folded"] == DELETED + 50

    cancel = conn.session.prepare(  # the earliest 101,000, in batches of one partition's rows
        f"DELETE FROM {table} WHERE location_id = 1 AND calculation_date = ? "
        "AND (timestamp, order_id) IN ?"
    )
    cancelled = orders[:DELETED]
    execute_concurrent(
        conn.session,
        [(cancel, (DAY, cancelled[i : i + 500])) for i in range(0, DELETED, 500)],
        concurrency=16,
    )
    with pytest.raises(ReadFailure):
        conn.session.execute(
            f"SELECT count(*) FROM {table} WHERE location_id = 1 AND calculation_date = %s",
            (DAY,),
        )

    found = invoke("--config", path, "reconcile", "--family", name, "--json")
    assert found.exit_code == 7, found.output
    (difference,) = json.loads(found.stdout)
    assert (difference["expected"], difference["counted"]) == (50, DELETED + 50), difference
    later = to_text(at + timedelta(seconds=1))
    swept = invoke("--config", path, "compact", "--family", name, "--epoch", later, "--json")
    assert swept.exit_code == 0, swept.output
    assert json.loads(swept.stdout)["sweep"]
    read = invoke("--config", path, "read", "--family", name, f"1/{DAY.isoformat()}")
    assert read.exit_code == 0 and read.output.startswith(f"1/{DAY.isoformat()}\t50\t"), read.output
    assert invoke("--config", path, "reconcile", "--family", name).exit_code == 0
