"""The guarantees of docs/correctness.md where they can fail: three nodes, RF=3, LOCAL_QUORUM,
nodes crashing and coming back, every run as the least-privilege ``compactor`` over TLS.

Totals are checked exactly after each story: every counter's value is what was written, no
row at or below the compacted epoch is left, nothing is quarantined."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest
from cassandra import ConsistencyLevel, DriverException, Unauthorized, Unavailable
from cassandra.cluster import NoHostAvailable
from counters import engine
from counters.client import Increment
from counters.core import utc_aware
from counters.store import Store

from tests.integration.engine.helpers import StalledRun

from .conftest import COMPACTOR, ClusterFamily, assert_exact, pinned, rows_at_or_below

pytestmark = pytest.mark.cluster

ROWS = 3
PER_COUNTER = sum(range(1, ROWS + 1))


def load(cf: ClusterFamily, t0, counters, minute: int = 0, version: int = 0) -> dict[str, int]:
    """``ROWS`` increments (1, 2, 3) per counter, within the minute after t0 + ``minute``."""
    at = t0 + timedelta(minutes=minute)
    cf.client.record(
        Increment((c,), i + 1, utc_aware(at + timedelta(seconds=i)), ("w", version + i))
        for c in counters
        for i in range(ROWS)
    )
    return dict.fromkeys(counters, PER_COUNTER)


def add(*totals: dict[str, int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for total in totals:
        for counter, value in total.items():
            out[counter] = out.get(counter, 0) + value
    return out


def run(store: Store, epoch, run_id: str, **kw) -> engine.RunOutcome:
    started = time.monotonic()
    summary = engine.run_family(store, epoch, run_id, now=epoch + timedelta(minutes=5), **kw)
    phases = ", ".join(f"{k} {v:.1f}" for k, v in summary.seconds.items() if v >= 0.5)
    print(f"[cluster] run {run_id}: {time.monotonic() - started:.1f} s ({phases})", file=sys.stderr)
    return summary


def test_node_killed_mid_run_then_restarted_the_runs_stay_exact(local_cluster, cluster_family, t0):
    """SIGKILL of a replica while the run's requests are in flight: the run either finishes on
    the two others or fails with a driver error (its audit row says so); its retry and the next
    run, with the node back, finish; totals exact."""
    cf = cluster_family(shards=4)
    counters = [f"k{i}" for i in range(300)]
    expected = load(cf, t0, counters)
    epoch = t0 + timedelta(minutes=10)
    victim = local_cluster.pid(2)
    killer: list[threading.Timer] = []
    killed_at: list[float] = []

    def kill() -> None:
        os.kill(victim, signal.SIGKILL)
        killed_at.append(time.monotonic())

    def kill_mid_run(point: str) -> None:
        if point == "read_compact" and not killer:  # the first bucket: most of the run is ahead
            killer.append(threading.Timer(random.uniform(0.05, 0.3), kill))
            killer[0].start()

    try:
        first = run(cf.store, epoch, "run-1", fault=kill_mid_run).outcome
    except (engine.EngineError, DriverException, NoHostAvailable) as exc:
        first = f"failed: {type(exc).__name__}: {exc}"
    ended = time.monotonic()
    killer[0].join()
    assert killed_at and killed_at[0] < ended, "the node was not killed while the run ran"
    nodes = local_cluster.status()["nodes"]
    assert [n["state"] for n in nodes] == ["running", "stopped", "running"]
    assert {v.counter[0]: v.value for v in cf.client.read_many(counters)} == expected
    if first != "success":  # the task's retry: same run id, same epoch
        assert run(cf.store, epoch, "run-1").outcome == "success", first
    print(f"run with a node killed mid-way: {first}; restart took {local_cluster.start():.1f} s")
    later = t0 + timedelta(minutes=20)
    expected = add(expected, load(cf, t0, counters, minute=15, version=100))
    assert run(cf.store, later, "run-2").outcome == "success"
    assert_exact(cf, expected, later)
    assert rows_at_or_below(cf.admin, counters, later, ConsistencyLevel.ALL) == 0


def test_two_nodes_down_runs_fail_clearly_delete_nothing_then_complete(
    local_cluster, cluster_family, compactor_password, t0
):
    """With two of three replicas down, LOCAL_QUORUM cannot be met: a running process's run fails
    on its first request (``Unavailable``, or ``Unauthorized`` when its role's permissions must
    be read again from system_auth), and a new process cannot even log in (roles are read at
    LOCAL_QUORUM): ``counterctl`` exits 5 with a one-line reason. Nothing is deleted; once the
    nodes are back the retry of the same run completes, exact. The two nodes are isolated
    (``LocalCluster.isolate``: native port closed, gossip stopped, JVM frozen), not stopped:
    clients are refused and node 1 counts them down, what a stop would give, and they are back
    in seconds rather than after two JVM starts."""
    cf = cluster_family()
    counters = [f"u{i}" for i in range(50)]
    expected = load(cf, t0, counters)
    epoch = t0 + timedelta(minutes=10)
    env = local_cluster.env(COMPACTOR, compactor_password)
    later = t0 + timedelta(minutes=20)
    counterctl = [
        sys.executable, "-m", "counters.cli", "--config", str(cf.config),
        "compact", "--family", cf.family.name, "--epoch", later.isoformat(),
    ]  # fmt: skip
    cf.store.conn.cluster_clock()  # a running process: its sessions are open before the outage
    local_cluster.isolate(2, 3)
    try:
        # a running process: Unavailable, or Unauthorized once its role's cached permissions
        # expire (2 s by default) and cannot be read again from system_auth
        with pytest.raises((Unavailable, Unauthorized)) as refused:
            run(cf.store, epoch, "run-1")
        assert "Cannot achieve consistency level LOCAL_QUORUM" in str(refused.value)
        failed = subprocess.run(counterctl, env=env, capture_output=True, text=True, timeout=180)
        assert failed.returncode == 5, failed.stdout + failed.stderr
        assert failed.stderr.count("\n") == 1, failed.stderr  # one line, no traceback
        assert failed.stderr.startswith(
            f"Error: cannot reach Cassandra at {COMPACTOR}@127.0.0.1,127.0.0.2,127.0.0.3:"
        ), failed.stderr
        assert "Cannot achieve consistency level LOCAL_QUORUM" in failed.stderr
        assert f"127.0.0.2:{local_cluster.port} refused the connection (down?)" in failed.stderr
    finally:
        local_cluster.rejoin()
    # nothing was deleted or committed while down (even the admin could not read then: its
    # superuser status is read from system_auth at LOCAL_QUORUM too)
    assert rows_at_or_below(cf.admin, counters, epoch) == len(counters) * ROWS
    compact = f"SELECT count(*) FROM {cf.family.keyspace}.{cf.family.compact_table}"
    assert cf.admin.statements.session.execute(compact, timeout=60).one()[0] == 0
    retry = run(cf.store, epoch, "run-1")  # what Airflow's retry of the task does
    assert retry.outcome == "success", retry.message
    assert_exact(cf, expected, epoch)
    expected = add(expected, load(cf, t0, counters, minute=15, version=100))
    again = subprocess.run(counterctl, env=env, capture_output=True, text=True, timeout=180)
    assert again.returncode == 0, again.stdout + again.stderr
    assert_exact(cf, expected, later)
    outputs = failed.stdout + failed.stderr + again.stdout + again.stderr
    assert compactor_password not in outputs


def test_missed_deletes_and_a_node_down_for_a_whole_run_count_nothing_twice(
    local_cluster, cluster_family, admin_conn, compactor_password, t0
):
    """Node 2 is down while cleanup deletes, and comes back without those deletes (hint
    delivery paused: nodes 1 and 3 hold them as hints). Then node 3 is down for a whole run,
    and for the writes before it: at LOCAL_QUORUM the run still succeeds, and since every
    quorum is now {node 1, node 2}, every read of that run (coordinated by node 2 itself)
    includes node 2's stale rows: node 1's tombstones win, nothing is counted twice. Then
    node 3 returns and the hints heal both. "Down" is ``LocalCluster.isolate`` (native port
    closed, gossip stopped, JVM frozen: the peers mark the node down and hint its writes,
    nothing reaches it), what a stop gives here without two JVM restarts."""
    cf = cluster_family(shards=1)
    counters = [f"m{i}" for i in range(60)]
    expected = load(cf, t0, counters)
    epoch = t0 + timedelta(minutes=10)
    for node in (1, 3):
        local_cluster.nodetool(node, "pausehandoff")
    stopped: list[int] = []

    def down_during_cleanup(point: str) -> None:
        if point == "cleanup_read_log" and not stopped:
            local_cluster.isolate(2)
            stopped.append(2)

    try:
        summary = run(cf.store, epoch, "run-1", fault=down_during_cleanup)
        assert stopped and summary.outcome == "success", summary.message
        assert summary.tally.rows_deleted == len(counters) * ROWS
        local_cluster.rejoin()  # node 2 is back, still holding the rows it missed deleting
        deadline = time.monotonic() + 60
        while not local_cluster.hint_files(admin_conn, "127.0.0.2"):  # flushed every 10 s
            assert time.monotonic() < deadline, "nodes 1 and 3 hold no hints for node 2"
            time.sleep(2)
        local_cluster.isolate(3)  # every quorum is now {node 1, node 2}
        assert {v.counter[0]: v.value for v in cf.client.read_many(counters)} == expected
        later = t0 + timedelta(minutes=20)
        fresh = load(cf, t0, counters, minute=15, version=100)
        expected = add(expected, fresh)
        via_node2 = pinned(local_cluster.settings(COMPACTOR, compactor_password), "127.0.0.2")
        try:
            second = run(Store(via_node2, cf.family, cf.admin.layout), later, "run-2")
        finally:
            via_node2.close()
        assert second.outcome == "success", second.message
        assert second.tally.rows_folded == len(fresh) * ROWS  # the new rows only: none twice
        assert second.tally.rows_deleted == len(fresh) * ROWS
        assert_exact(cf, expected, later)
        local_cluster.rejoin()
    finally:
        if local_cluster.isolated:
            local_cluster.rejoin()
        if local_cluster.stopped():
            local_cluster.start()
        for node in (1, 3):
            local_cluster.nodetool(node, "resumehandoff")
    deadline = time.monotonic() + 120
    while local_cluster.hint_files(admin_conn, "127.0.0.2"):
        assert time.monotonic() < deadline, "hints for node 2 not delivered within 120 s"
        time.sleep(2)
    assert rows_at_or_below(cf.admin, counters, later, ConsistencyLevel.ALL) == 0
    assert_exact(cf, expected, later)


def test_overlapping_runs_through_different_coordinators_stay_exact(
    local_cluster, cluster_family, compactor_password, t0
):
    """Run A (coordinated by node 1) stalls after reading a bucket's rows while run B (node 2)
    commits the same buckets and run C (node 3) runs alongside; no leases. A waits there until
    both are done; its commit in that bucket, made through another coordinator than B's, must
    lose its compare-and-set and re-fold, and A ends as a success."""
    cf = cluster_family(shards=1)
    counters = [f"o{i}" for i in range(40)]
    expected = load(cf, t0, counters)
    settings = local_cluster.settings(COMPACTOR, compactor_password)
    conns = [pinned(settings, address) for address in local_cluster.addresses]
    stores = [Store(c, cf.family, cf.admin.layout) for c in conns]
    summaries: dict[str, engine.RunOutcome] = {}
    errors: dict[str, BaseException] = {}

    def go(name: str, store: Store, minutes: int) -> None:
        try:
            summaries[name] = run(store, t0 + timedelta(minutes=minutes), name, use_lease=False)
        except Exception as exc:  # asserted on below, with the other runs' outcomes
            errors[name] = exc

    def run_a(fault) -> engine.RunOutcome:
        return run(stores[0], t0 + timedelta(minutes=10), "A", use_lease=False, fault=fault)

    try:
        with StalledRun("read_raw", run_a, bound_s=600) as a:
            assert a.start(), f"run A ended without reaching read_raw: {a.outcome()}"
            late = load(cf, t0, counters, minute=2, version=500)  # late rows, behind every epoch
            c = threading.Thread(target=go, args=("C", stores[2], 12))
            c.start()
            go("B", stores[1], 11)
            c.join(300)
            assert not c.is_alive(), "run C did not end"
            assert a.waiting, f"run A did not wait at read_raw while B and C ran: {a.outcome()}"
            a.release(300)
        assert a.overlapped and a.error is None, a.outcome()
        assert set(summaries) == {"B", "C"}, errors
        assert [summaries[n].outcome for n in "BC"] == ["success", "success"]
        assert a.summary.outcome == "success" and a.summary.tally.conflicts >= 1, a.outcome()
        final = t0 + timedelta(minutes=13)
        assert run(stores[0], final, "D").outcome == "success"
        assert_exact(cf, add(expected, late), final)
    finally:
        for conn in conns:
            conn.close()
