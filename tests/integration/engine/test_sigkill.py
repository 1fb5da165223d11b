"""A real process, killed with SIGKILL at random moments mid-run, then retried: totals exact."""

from __future__ import annotations

import os
import random
import secrets
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

import pytest
from counters.client import CounterClient, Increment
from counters.config import load_catalog
from counters.schema import STATE_TABLE
from counters.store import Store

from .helpers import rows_at_or_below

pytestmark = pytest.mark.integration


def test_sigkill_at_random_moments_then_retry_is_exact(conn, engine_keyspace, tmp_path):
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
        Increment((c,), i + 1, base + timedelta(seconds=i), ("w", i))
        for c in counters
        for i in range(3)
    )
    expected = sum(range(1, 4))
    epoch = (base + timedelta(minutes=30)).isoformat()
    rng = random.Random(7)
    run = [*cmd, "compact", "--family", family.name, "--epoch", epoch, "--run-id", "run-1"]
    kills = 0
    for _attempt in range(4):  # killed at random moments (startup alone takes about 1 s)
        process = subprocess.Popen(run, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        time.sleep(rng.uniform(1.0, 2.5))
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
            kills += 1
        process.wait()
    assert kills >= 1, "no run was killed mid-way: the test proved nothing"
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
    outcomes = [r["outcome"] for r in store.read_audit(20)]
    assert outcomes and set(outcomes) <= {"success", "noop"}, outcomes
    time.sleep(1)  # the kernel's parent-death signal is immediate; give the reaper a moment
    assert processes_marked(marker) == [], "shard workers outlived the killed run"


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
