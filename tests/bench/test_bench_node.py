"""The benchmark's hold on the local node between measured steps: a step's memtables flushed,
the node's compactions and flushes waited for (against the real node)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from bench.ops import (
    _BACKGROUND_POOLS,
    flush_tables,
    node_background_tasks,
    wait_for_quiet_node,
)

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


LEFT_OVER_WORK_POOLS = ("CompactionExecutor", "MemtableFlushWriter", "MemtablePostFlush")
"""The node's pools of compactions and flushes, by the names Cassandra 5.0 gives them."""


class _Recorded:
    """The real session, keeping what each query answered (to recount it here). With
    ``weigh_pools``, each pool of the node's answer reports ``2**i`` active tasks (i its place
    in the answer): the count then tells exactly which pools were summed, even on an idle node
    whose pools are all 0."""

    def __init__(self, session: Any, weigh_pools: bool = False) -> None:
        self.session = self
        self._real = session
        self._weigh = weigh_pools
        self.answers: dict[str, list[Any]] = {}

    def execute(self, query: str) -> list[Any]:
        rows = list(self._real.execute(query))
        if self._weigh and "thread_pools" in query:
            rows = [
                SimpleNamespace(name=r.name, active_tasks=2**i, pending_tasks=0)
                for i, r in enumerate(rows)
            ]
        self.answers[query] = rows
        return rows


def test_the_quiet_wait_reads_the_nodes_pools(cassandra_session):
    """The count is the node's own compaction and flush pools plus its SSTable tasks: each pool
    it sums is one the node has (a misspelt or renamed pool would count as idle for ever, and
    every wait end at once), the pools it sums are exactly the pinned ones, and the count is
    what the node answered, recounted here."""
    listed = cassandra_session.execute("SELECT name FROM system_views.thread_pools")
    pools = {r.name for r in listed}
    assert set(LEFT_OVER_WORK_POOLS) | set(_BACKGROUND_POOLS) <= pools, sorted(pools)
    weighed = _Recorded(cassandra_session, weigh_pools=True)
    count = node_background_tasks(weighed)
    [pool_rows] = [rows for q, rows in weighed.answers.items() if "thread_pools" in q]
    [task_rows] = [rows for q, rows in weighed.answers.items() if "sstable_tasks" in q]
    summed = count - len(task_rows)
    assert {r.name for r in pool_rows if summed & r.active_tasks} == set(LEFT_OVER_WORK_POOLS)
    node = _Recorded(cassandra_session)
    count = node_background_tasks(node)
    [pool_rows] = [rows for q, rows in node.answers.items() if "thread_pools" in q]
    [task_rows] = [rows for q, rows in node.answers.items() if "sstable_tasks" in q]
    assert {r.name for r in pool_rows} == pools
    work = [r.active_tasks + r.pending_tasks for r in pool_rows if r.name in LEFT_OVER_WORK_POOLS]
    assert count == sum(work) + len(task_rows)
    # the wait ends before its bound only when the node answered that nothing is under way
    quiet = wait_for_quiet_node(SimpleNamespace(session=cassandra_session), most_s=30, poll_s=0.2)
    assert quiet < 30


def test_a_compaction_with_the_node_profile_records_the_nodes_cpu_by_kind(
    tmp_path: Path, cassandra_contact: tuple[list[str], int]
) -> None:
    """``--node-profile`` on one compaction of the bench's harness, on the smoke's data size:
    a JFR recording of the local node over the worker's run (``jcmd``), summarized by kind of
    work (``jfr print``). The smoke runs without it: one recording here, not one per run."""
    from counters.connection import connect

    from bench.harness import Bench
    from bench.nodeprofile import KINDS, THREADS
    from bench.ops import Dataset, load_write_path, utc_now
    from bench.params import Params

    params = Params(smoke=True, node_profile=True, out=tmp_path / "report.json", workers=1)
    conn = connect()
    bench = Bench(params, conn)
    try:
        assert bench.server is not None, "the local node's pid is not visible: nothing to record"
        conn.session.execute(
            f"CREATE KEYSPACE {bench.keyspace} WITH replication = "
            "{'class': 'SimpleStrategy', 'replication_factor': 1}"
        )
        family, _store, client = bench.make_family("profiled")
        data = Dataset("p", 300, 5, (utc_now() - timedelta(days=1)).replace(second=0))
        load_write_path(client, data)
        run = bench.compact(family, data.epoch, "node profile")
    finally:
        bench.drop()
        conn.close()
    assert run["ok"], run["error"]
    profile = run["node_profile"]
    assert "error" not in profile, profile
    assert profile["samples"] > 0
    assert Path(profile["recording"]).parent == tmp_path and Path(profile["recording"]).is_file()
    kinds = profile["kinds"]
    assert abs(sum(k["share"] for k in kinds.values()) - 1) < 0.01, kinds
    assert set(kinds) <= {"other"} | {k for k, _ in KINDS} | {k for _, k in THREADS}, kinds
    assert all(k["cpu_s"] is not None and k["cpu_s"] >= 0 for k in kinds.values()), kinds
