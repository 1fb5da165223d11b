"""A real process, killed with SIGKILL mid-run (once after a commit of its own, then at random
moments), then retried: totals exact."""

from __future__ import annotations

import os
import random
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from counters.client import CounterClient, Increment
from counters.config import Family, load_catalog
from counters.connection import Connection
from counters.core import utc_aware
from counters.schema import STATE_TABLE, ledger_table
from counters.store import Store

from .helpers import rows_at_or_below

pytestmark = pytest.mark.integration


def test_sigkill_at_random_moments_then_retry_is_exact(conn, engine_keyspace, tmp_path):
    """Tens of seconds: each kill is of a real `counterctl compact` process at a random moment,
    followed by its retry in a new process (an import, a connect and a GX warm-up each), since
    only a separate process killed by the kernel shows what a crash leaves behind."""
    suffix = secrets.token_hex(3)
    config = tmp_path / "families.yaml"
    config.write_text(
        f"""families:
  - name: kill_{suffix}
    keyspace: {engine_keyspace}
    raw_table: raw_{suffix}
    compact_table: compact_{suffix}
    lag: 1m
    shards: 3
"""
    )
    family = load_catalog(config).get(f"kill_{suffix}")
    marker = f"sigkill-{suffix}"
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "COUNTERS_TEST_MARK": marker}
    cmd = [sys.executable, "-m", "counters.cli", "--config", str(config)]
    subprocess.run([*cmd, "init"], check=True, env=env, capture_output=True)
    client = CounterClient(conn, family)
    base = datetime.now(UTC).replace(tzinfo=None, second=0, microsecond=0) - timedelta(hours=1)
    counters = [f"k{i}" for i in range(4000)]  # several seconds of commits: kills land mid-run
    client.record(
        Increment((c,), i + 1, utc_aware(base + timedelta(seconds=i)), ("w", i))
        for c in counters
        for i in range(3)
    )
    expected = sum(range(1, 4))
    epoch = (base + timedelta(minutes=30)).isoformat()
    rng = random.Random(7)
    run = [*cmd, "compact", "--family", family.name, "--epoch", epoch, "--run-id", "run-1"]
    attempts: list[Attempt] = []
    for attempt in range(4):  # killed at random moments (startup alone takes about 1 s)
        before = committed_counters(conn, family)
        process = subprocess.Popen(run, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if attempt == 0:  # one kill at least lands after a commit of the run: wait for one
            while committed_counters(conn, family) == before and process.poll() is None:
                time.sleep(0.05)
            time.sleep(rng.uniform(0.0, 0.5))
        else:
            time.sleep(rng.uniform(1.0, 2.5))
        killed = process.poll() is None
        if killed:
            process.send_signal(signal.SIGKILL)
        process.wait(60)
        attempts.append(
            Attempt(killed, before, committed_counters(conn, family), process.returncode)
        )
    assert any(a.killed for a in attempts), "no run was killed mid-way: the test proved nothing"
    # each kill landed while the run was running: it died of SIGKILL, not of its own accord
    assert {a.returncode for a in attempts if a.killed} == {-signal.SIGKILL}, attempts
    # the retry meets what a killed run committed (counted, maybe not copied or deleted)
    assert any(a.killed and a.committed_after > a.committed_before for a in attempts), (
        f"no killed run had committed anything: {attempts}"
    )
    final = subprocess.run(run, env=env, capture_output=True, text=True, timeout=300)
    assert final.returncode == 0, final.stdout + final.stderr
    values = {v.counter[0]: v.value for v in client.read_many(counters)}
    assert values == dict.fromkeys(counters, expected)
    store = Store(conn, family)
    assert sum(rows_at_or_below(store, (c,), base + timedelta(minutes=30)) for c in counters) == 0
    # the run finished: the family's epoch is this run's (an attempt killed between recording
    # it and writing its audit row leaves the later attempts "noop": nothing left to do)
    state = conn.session.execute(
        f"SELECT epoch, run_id FROM {engine_keyspace}.{STATE_TABLE} WHERE family = %s",
        (family.name,),
    ).one()
    assert (state.epoch, state.run_id) == (base + timedelta(minutes=30), "run-1")
    outcomes = [r["outcome"] for r in store.audit.page(20)]
    assert outcomes and set(outcomes) <= {"success", "noop"}, outcomes
    time.sleep(1)  # the kernel's parent-death signal is immediate; give the reaper a moment
    assert processes_marked(marker) == [], "shard workers outlived the killed run"


@dataclass(frozen=True)
class Attempt:
    """One attempt of the run: whether it was killed, and the family's committed counters
    before it started and after it ended."""

    killed: bool
    committed_before: int
    committed_after: int
    returncode: int | None


def committed_counters(conn: Connection, family: Family) -> int:
    """Counters with a commit in the family's ledger (rows of its compare-and-set commits)."""
    table = f'{family.keyspace}."{ledger_table(family)}"'
    return conn.session.execute(f"SELECT count(commit_id) FROM {table}").one()[0]


def processes_marked(marker: str) -> list[int]:
    """Live processes started with ``COUNTERS_TEST_MARK=marker`` (the runs and their workers)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as environ:
                if f"COUNTERS_TEST_MARK={marker}".encode() in environ.read():
                    with open(f"/proc/{entry}/stat") as stat:
                        if stat.read().split(") ")[-1][0] != "Z":
                            found.append(int(entry))
        except OSError:
            continue
    return found
