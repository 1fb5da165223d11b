"""The benchmark's hold on the local node between measured steps: a step's memtables flushed,
the node's compactions and flushes waited for (against the real node)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench.ops import flush_tables, node_background_tasks, wait_for_quiet_node

pytestmark = [pytest.mark.integration, pytest.mark.bench]

NODE_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "cassandra_node.py"


def _data_files(instance: str, keyspace: str, table: str) -> list[Path]:
    env = {k: v for k, v in os.environ.items() if k != "CASSANDRA_HOSTS"}
    status = subprocess.run(
        [sys.executable, str(NODE_SCRIPT), "status", "--instance", instance, "--json"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    root = Path(json.loads(status.stdout)["data_dir"]) / "data" / keyspace
    return sorted(root.glob(f"{table}-*/*-Data.db"))


def test_a_flush_writes_the_tables_memtables_out(cassandra_session, keyspace, local_instance):
    instance = local_instance
    cassandra_session.execute(f"CREATE TABLE {keyspace}.t (k int PRIMARY KEY, v int)")
    cassandra_session.execute(f"INSERT INTO {keyspace}.t (k, v) VALUES (1, 2)")
    assert _data_files(instance, keyspace, "t") == []  # the row is in the memtable only

    done = flush_tables(keyspace, ["t"], instance)

    assert done == f"flushed {keyspace}: t"
    assert len(_data_files(instance, keyspace, "t")) == 1
    row = cassandra_session.execute(f"SELECT v FROM {keyspace}.t WHERE k = 1").one()
    assert row.v == 2


def test_a_flush_that_fails_says_so_and_why(keyspace, local_instance):
    done = flush_tables(keyspace, ["no_such_table"], local_instance)
    assert done.startswith("not flushed: nodetool exited ")
    assert "no_such_table" in done
    assert flush_tables(keyspace, ["t"], None).startswith("not flushed: no local instance")


def test_the_quiet_wait_reads_the_nodes_pools(cassandra_session):
    node = SimpleNamespace(session=cassandra_session)
    assert node_background_tasks(node) >= 0
    # the wait ends before its bound only when the node answered that nothing is under way
    assert wait_for_quiet_node(node, most_s=30, poll_s=0.2) < 30
