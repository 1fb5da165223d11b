"""The real Cassandra node that `make test` provides (scripts/cassandra_node.py, `test`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

PROJECT = Path(__file__).resolve().parents[3]
NODE_SCRIPT = PROJECT / "scripts" / "cassandra_node.py"


def test_release_version(cassandra_session):
    row = cassandra_session.execute("SELECT release_version FROM system.local").one()
    assert int(row.release_version.split(".")[0]) >= 4


def test_keyspace_table_write_read(cassandra_session, keyspace):
    s = cassandra_session
    s.execute(
        f"CREATE TABLE {keyspace}.events ("
        " type text, modify_time timestamp, id uuid, increment bigint,"
        " PRIMARY KEY (type, modify_time, id)) WITH CLUSTERING ORDER BY (modify_time DESC, id ASC)"
    )
    insert = s.prepare(
        f"INSERT INTO {keyspace}.events (type, modify_time, id, increment) VALUES (?, ?, ?, ?)"
    )
    when = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    ids = [uuid.uuid4() for _ in range(3)]
    for i, row_id in enumerate(ids):
        s.execute(insert, ("IBM", when, row_id, 10 * (i + 1)))

    rows = list(s.execute(f"SELECT id, increment FROM {keyspace}.events WHERE type = %s", ("IBM",)))
    assert sorted((r.id, r.increment) for r in rows) == sorted(
        (row_id, 10 * (i + 1)) for i, row_id in enumerate(ids)
    )
    total = s.execute(
        f"SELECT sum(increment) AS total FROM {keyspace}.events WHERE type = %s", ("IBM",)
    ).one()
    assert total.total == 60

    s.execute(f"DROP TABLE {keyspace}.events")
    tables = s.execute(
        "SELECT table_name FROM system_schema.tables WHERE keyspace_name = %s", (keyspace,)
    )
    assert "events" not in {r.table_name for r in tables}


def test_keyspace_fixture_creates_the_keyspace(cassandra_session, keyspace):
    rows = cassandra_session.execute("SELECT keyspace_name FROM system_schema.keyspaces")
    names = {r.keyspace_name for r in rows}
    assert keyspace in names


def _node(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "CASSANDRA_HOSTS"}
    return subprocess.run(
        [sys.executable, str(NODE_SCRIPT), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_status_reports_the_live_pid(cassandra_contact, local_instance):
    instance = local_instance
    result = _node("status", "--instance", instance, "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    info = json.loads(result.stdout)
    assert info["state"] == "running"
    assert info["cql"] == "answering"
    assert info["native_port"] == cassandra_contact[1]
    pid = info["pid"]
    assert isinstance(pid, int) and _pid_alive(pid)
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    assert b"org.apache.cassandra.service.CassandraDaemon" in cmdline
    # the `test` node does not flush its system tables after each schema change
    assert (b"-Dcassandra.unsafesystem=true" in cmdline) == (instance == "test"), cmdline
    # The human-readable form agrees.
    text = _node("status", "--instance", instance)
    assert text.returncode == 0
    assert "running" in text.stdout and str(pid) in text.stdout


def test_up_is_a_noop_when_running(cassandra_contact, local_instance):
    instance = local_instance
    result = _node("up", "--instance", instance)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "already running" in result.stdout


def test_cql_subcommand_prints_a_table(cassandra_contact, local_instance):
    instance = local_instance
    result = _node(
        "cql", "--instance", instance,
        "SELECT release_version FROM system.local; SELECT cluster_name FROM system.local",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "release_version" in result.stdout and "cluster_name" in result.stdout
    assert result.stdout.count("(1 row)") == 2


def test_split_statements():
    sys.path.insert(0, str(NODE_SCRIPT.parent))
    try:
        import cassandra_node
    finally:
        sys.path.pop(0)
    text = """
        -- a comment; with a semicolon
        INSERT INTO t (a, b) VALUES ('x;y', 'it''s; fine');  /* block; comment */
        CREATE FUNCTION f() RETURNS int LANGUAGE java AS $$ return 1; $$;
        SELECT "weird;name" FROM t // trailing
    """
    assert cassandra_node.split_statements(text) == [
        "INSERT INTO t (a, b) VALUES ('x;y', 'it''s; fine')",
        "CREATE FUNCTION f() RETURNS int LANGUAGE java AS $$ return 1; $$",
        'SELECT "weird;name" FROM t',
    ]
