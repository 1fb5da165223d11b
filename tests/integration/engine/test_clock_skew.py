"""A host whose clock is off: the process's clock is really moved (``time_machine`` moves
``time.time()`` and ``datetime.now()`` of the whole process, the driver's threads included), not
only the engine's ``now=``. The cluster's clock (a coordinator's ``now()``) decides a run's
"now"; a host off by more than a quarter of the family's lag is refused before it writes
anything; one within it writes with the cluster's time (its tombstones shadow what they must).
"""

from __future__ import annotations

import json
import secrets
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner
from counters import engine
from counters.client import CounterClient
from counters.config import load_catalog
from counters.store import Store

from .helpers import aware, real_now, skewed

pytestmark = pytest.mark.integration


def invoke(*args):
    return CliRunner().invoke(cli(), [str(a) for a in args], catch_exceptions=False)


def cli():
    from counters.cli import cli as counterctl

    return counterctl


@pytest.fixture
def family_file(tmp_path, engine_keyspace, conn):
    """A family in a YAML file (lag 1 min, so a host may be 15 s off), its tables created."""
    suffix = secrets.token_hex(3)
    path = tmp_path / "families.yaml"
    path.write_text(
        f"""families:
  - name: clock_{suffix}
    keyspace: {engine_keyspace}
    raw_table: raw_{suffix}
    compact_table: compact_{suffix}
    lag: 1m
    freshness: 10m
    shards: 1
"""
    )
    assert invoke("--config", path, "init").exit_code == 0
    family = load_catalog(path).get(f"clock_{suffix}")
    return path, family, CounterClient(conn, family)


def test_a_compacting_host_an_hour_ahead_is_refused_and_a_writer_on_time_is_read(family_file, conn):
    """The reviewer's case: ``counterctl compact`` on a host an hour ahead took its epoch from
    its own clock, checked it against the same clock, and committed every counter an hour in
    the future; an increment written on time by a correct writer was then not read (15 where
    22 is right) and every run for the next hour was a noop. Now it is refused, naming the
    family and the offset, and nothing is written; so is a reset from that host (its default
    point an hour ahead)."""
    path, family, client = family_file
    store = Store(conn, family)
    for amount in (5, 10):
        client.increment("IBM", amount, at=aware(real_now() - timedelta(minutes=5)))
    with skewed(timedelta(hours=1)):
        refused = invoke("--config", path, "compact", "--family", family.name)
        reset = invoke("--config", path, "reset", "--family", family.name, "IBM", "--yes")
    assert refused.exit_code == 2, refused.output
    assert f"family {family.name!r}: this host's clock is 3" in refused.output
    assert "s ahead of the cluster's" in refused.output
    assert "more than a quarter of the family's lag (15 s of 60 s)" in refused.output
    assert reset.exit_code == 2 and "s ahead of the cluster's" in reset.output, reset.output
    assert store.state.family_epoch() is None  # nothing committed
    assert client.read("IBM") == 15
    client.increment("IBM", 7, at=aware(real_now() - timedelta(minutes=2)))  # a writer on time
    done = invoke("--config", path, "compact", "--family", family.name, "--json")
    assert done.exit_code == 0, done.output
    summary = json.loads(done.stdout)
    assert summary["outcome"] == "success" and summary["rows_folded"] == 3
    epoch = store.state.family_epoch()
    assert epoch is not None and epoch <= real_now() - family.lag
    assert client.read("IBM") == 22


def test_a_compacting_host_an_hour_behind_is_refused(family_file, conn):
    """A host an hour behind folded an hour late and deleted with tombstones an hour old,
    which do not shadow the rows plain-CQL writers wrote since (server timestamps)."""
    path, family, client = family_file
    client.increment("IBM", 5, at=aware(real_now() - timedelta(minutes=90)))
    with skewed(-timedelta(hours=1)):
        refused = invoke("--config", path, "compact", "--family", family.name)
    assert refused.exit_code == 2, refused.output
    assert "s behind the cluster's" in refused.output
    assert Store(conn, family).state.family_epoch() is None
    assert client.read("IBM") == 5


def test_health_reads_the_clusters_time_and_shows_this_hosts_offset(family_file, conn):
    """``counterctl health`` on a host an hour ahead: the family's lag is measured against the
    cluster's time (fresh, as it is), and the host's offset is shown and fails the check (exit
    8: that host would be refused for compaction)."""
    path, family, client = family_file
    client.increment("IBM", 5, at=aware(real_now() - timedelta(minutes=5)))
    assert invoke("--config", path, "compact", "--family", family.name).exit_code == 0
    healthy = invoke("--config", path, "health", "--family", family.name, "--json")
    assert healthy.exit_code == 0, healthy.output
    (line,) = json.loads(healthy.stdout)
    assert line["state"] == "fresh" and abs(line["clock_offset_s"]) < 2
    assert line["clock_tolerance_s"] == 15 and line["clock_refused"] is None
    with skewed(timedelta(hours=1)):
        ahead = invoke("--config", path, "health", "--family", family.name)
    assert ahead.exit_code == 8, ahead.output
    assert ahead.output.startswith("clock: this host is 3")
    assert f"{family.name}\tfresh\t" in ahead.output  # not an hour behind: the cluster's time
    assert "REFUSED for compaction, limit 15 s" in ahead.output
    assert f"this host's clock is too far off to compact: {family.name}" in ahead.output


def test_a_host_behind_within_the_tolerance_deletes_with_the_clusters_time(
    make_family, conn, engine_keyspace
):
    """A host 10 s behind (within a 1 min lag's 15 s) compacts, and its tombstones carry the
    cluster's time: a row a plain-CQL writer wrote a moment before the run (server timestamp)
    is deleted once counted. With the host's own clock the tombstone is older than the row,
    the delete does not take, and the cleanup check fails."""
    family, store, client = make_family(lag="1m", shards=1)
    written = real_now() - timedelta(minutes=5)
    conn.session.execute(  # no USING TIMESTAMP: the coordinator's clock, now
        f"INSERT INTO {engine_keyspace}.{family.raw_table} "
        "(type, modify_time, actor, version, increment) VALUES ('IBM', %s, 'a', 1, 40)",
        (written,),
    )
    epoch = real_now().replace(second=0, microsecond=0) - timedelta(minutes=2)
    with skewed(-timedelta(seconds=10)):
        summary = engine.run_family(store, epoch)
    assert summary.outcome == "success", summary.message
    assert (summary.tally.rows_folded, summary.tally.rows_deleted) == (1, 1)
    assert store.raw.read_rows([("IBM",)])[("IBM",)] == []
    assert client.read("IBM") == 40


def test_the_drivers_client_timestamps_follow_the_clusters_clock(conn, engine_keyspace):
    """Writes without ``USING TIMESTAMP`` (run log, quarantine entries, audit rows) take the
    driver's client timestamp: from a host 10 s ahead (within a 1 min lag's tolerance) it is the
    cluster's time once the connection measured the offset, not 10 s in the future (a delete
    from a correct host in those 10 s would have lost to it)."""
    from counters.connection import Connection

    table = f"{engine_keyspace}.stamps_{secrets.token_hex(3)}"
    conn.session.execute(f"CREATE TABLE {table} (k int PRIMARY KEY, v int)")
    with skewed(timedelta(seconds=10)):
        ahead = Connection(conn.settings)
        try:
            assert 9 < ahead.cluster_clock().offset.seconds < 11
            ahead.session.execute(f"INSERT INTO {table} (k, v) VALUES (1, 1)")
        finally:
            ahead.close()
    written = conn.session.execute(f"SELECT writetime(v) FROM {table} WHERE k = 1").one()[0]
    real_us = int(datetime.now(UTC).timestamp() * 1e6)
    assert abs(written - real_us) < 2_000_000  # the offset is measured to a round trip


def test_a_host_clock_stepped_ahead_and_back_leaves_no_write_timestamp_ahead(conn, engine_keyspace):
    """A process that wrote once with its host's clock an hour ahead (before it measured the
    cluster's clock), then measured it, then had its clock stepped back: its later writes carry
    the cluster's time, not the hour ahead the driver's never-going-back generator would hold
    them at (a release's or a lease's delete stamped then would shadow what is written after
    it for that hour)."""
    from counters.connection import Connection

    table = f"{engine_keyspace}.steps_{secrets.token_hex(3)}"
    conn.session.execute(f"CREATE TABLE {table} (k int PRIMARY KEY, v int)")
    host = Connection(conn.settings)
    try:
        with skewed(timedelta(hours=1)):
            host.session.execute(f"INSERT INTO {table} (k, v) VALUES (1, 1)")  # unmeasured
            assert 3599 < host.cluster_clock().offset.seconds < 3601
            host.session.execute(f"INSERT INTO {table} (k, v) VALUES (2, 2)")
        host.session.execute(f"INSERT INTO {table} (k, v) VALUES (3, 3)")  # stepped back
        host.cluster_clock()  # measured again: the step is seen
        host.session.execute(f"INSERT INTO {table} (k, v) VALUES (4, 4)")
    finally:
        host.close()
    real_us = int(datetime.now(UTC).timestamp() * 1e6)
    stamps = dict(conn.session.execute(f"SELECT k, writetime(v) FROM {table}").all())
    assert stamps[1] - real_us > 3_500_000_000  # the host's own clock, an hour ahead
    assert {k: abs(stamps[k] - real_us) < 2_000_000 for k in (2, 3, 4)} == {
        2: True,
        3: True,
        4: True,
    }, {k: (stamps[k] - real_us) / 1e6 for k in stamps}
