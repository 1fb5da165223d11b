"""The whole suite as two pytest sessions side by side ("lanes"), which `make test` runs when it
is given no arguments (CONTRIBUTING.md, "Time budget").

Why: on 2 cores one session leaves about a core idle. Most of the Airflow and cluster tests wait
on a scheduler, a JVM or a subprocess, while the engine tests keep the client and the node busy;
measured over the Airflow tier, the machine was 45-60 % busy. Two sessions fill those waits.

The lanes are split by what they share, not by size alone: every test of the `services` lane
uses Airflow's SQLite DB in var/airflow-test (one writer at a time) or fixed addresses (the
3-node cluster on 127.0.0.1-3, `make run`'s ports), so those run in one session, one at a time,
as before. The `engine` lane's tests each make their own keyspace or family on the shared test
node. A test folder in no lane, or in two, fails ``tests/unit/test_lanes.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from tests.timing import TestTime, summary

ROOT = Path(__file__).resolve().parents[1]

LANES: Mapping[str, tuple[str, ...]] = {
    "engine": (
        "tests/integration/engine",
        "tests/bench",
        "tests/unit",
        "tests/integration/deploy",
        "tests/integration/cassandra_node",
    ),
    "services": (
        "tests/integration/airflow",
        "tests/dags",
        "tests/cluster",
    ),
}
"""Each lane's test folders, in the order its session runs them."""

STOP_WAIT_S = 300
"""How long a stopped session may take to end its fixtures (a cluster's nodes, a DROP
KEYSPACE on a busy node) before it is killed."""
NODE_SCRIPT = ROOT / "scripts" / "cassandra_node.py"
CLUSTER_STATE = (
    ROOT
    / "var"
    / "cassandra"
    / os.environ.get("CASSANDRA_CLUSTER_NAME", "testcluster")
    / "cluster.json"
)
"""What the cluster tests' nodes leave (tests/cluster/conftest.py): its pids, for a stop."""

TIMES_ENV = "COUNTERS_TEST_TIMES"
"""Where a session writes its tests' times (``tests/conftest.py``), for the combined budget."""


def lane_of(path: str) -> list[str]:
    """The lanes whose folders hold ``path`` (a test file, relative to the project)."""
    return [
        lane
        for lane, folders in LANES.items()
        if any(path == f or path.startswith(f + "/") for f in folders)
    ]


@dataclass(frozen=True)
class LaneResult:
    lane: str
    returncode: int
    wall_s: float


def verdict(results: Sequence[LaneResult]) -> int:
    """The suite's exit code: the first lane's failure, 5 (nothing collected) included."""
    return next((r.returncode for r in results if r.returncode != 0), 0)


def prefixed(lane: str, line: str) -> str:
    """A lane's output line, tagged so two interleaved sessions stay readable."""
    return f"[{lane}] {line}"


def _relay(lane: str, stream: IO[bytes], out: IO[str], lock: threading.Lock) -> None:
    for raw in iter(stream.readline, b""):
        with lock:
            out.write(prefixed(lane, raw.decode(errors="replace")))
            out.flush()


class _Sessions:
    """The lanes' pytest processes, their output relayed as it comes, their end times."""

    def __init__(self, python: str, extra: Sequence[str], times_dir: Path) -> None:
        self.python, self.extra, self.times_dir = python, tuple(extra), times_dir
        self.lock = threading.Lock()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.started: dict[str, float] = {}
        self.ended: dict[str, float] = {}

    def start(self, lane: str, folders: Sequence[str]) -> threading.Thread:
        env = dict(os.environ, **{TIMES_ENV: str(self.times_dir / f"{lane}.json")})
        cache = f"cache_dir=.pytest_cache/{lane}"  # two sessions, two caches
        self.started[lane] = time.monotonic()
        self.procs[lane] = subprocess.Popen(
            [self.python, "-m", "pytest", *folders, "-o", cache, *self.extra],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        follow = threading.Thread(target=self._follow, args=(lane,), daemon=True)
        follow.start()
        return follow

    def _follow(self, lane: str) -> None:
        proc = self.procs[lane]
        assert proc.stdout is not None
        _relay(lane, proc.stdout, sys.stdout, self.lock)
        proc.wait()
        self.ended[lane] = time.monotonic()

    def stop(self, signum: int, _frame: object) -> None:
        """Ctrl-C or CI's stop: each session gets SIGINT (pytest ends its fixtures, which
        stop their nodes and stacks by pid), then SIGKILL after ``STOP_WAIT_S``. The cluster's
        nodes run in a process group of their own, which a killed session leaves behind:
        they are stopped here by their pids (``cassandra_node.py down``, a no-op when none
        runs)."""
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)
        killed = False
        for proc in self.procs.values():
            try:
                proc.wait(STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                killed = True
        if killed and CLUSTER_STATE.exists():
            subprocess.run(
                [self.python, str(NODE_SCRIPT), "down", "--cluster", CLUSTER_STATE.parent.name],
                cwd=ROOT,
                check=False,
            )
        raise SystemExit(128 + signum)

    def results(self) -> list[LaneResult]:
        return [
            LaneResult(lane, proc.wait(), self.ended[lane] - self.started[lane])
            for lane, proc in self.procs.items()
        ]


def run(python: str, extra: Sequence[str], times_dir: Path) -> list[LaneResult]:
    """Start one pytest session per lane, relay their output line by line, wait for both.
    A signal to this process stops both sessions (each is its own process group: its
    subprocesses, Airflow stacks and nodes, get it too) before it ends."""
    times_dir.mkdir(parents=True, exist_ok=True)
    sessions = _Sessions(python, extra, times_dir)
    previous = {sig: signal.signal(sig, sessions.stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        followers = [sessions.start(lane, folders) for lane, folders in LANES.items()]
        for follower in followers:
            follower.join()
        return sessions.results()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def combined_budget(wall_s: float, results: Sequence[LaneResult], times_dir: Path) -> list[str]:
    """The suite's time budget over both lanes: the wall time of the two side by side, each
    lane's, and the tiers and slowest tests of both sessions (their own sections show each)."""
    tests: list[TestTime] = []
    for result in results:
        path = times_dir / f"{result.lane}.json"
        if path.exists():  # a session stopped before its end writes none
            tests += [TestTime(**t) for t in json.loads(path.read_text())["tests"]]
    lanes = ", ".join(f"{r.lane} {r.wall_s / 60:.1f} min" for r in results)
    return [f"{len(results)} lanes side by side: {lanes}", *summary(wall_s, tests)]


def closing_lines(results: Sequence[LaneResult], times_dir: Path) -> list[str]:
    """The suite's last lines: each failed lane and the tests that failed in it, so a log's
    tail (all CI keeps of a long run) names them."""
    lines: list[str] = []
    for result in results:
        if result.returncode == 0:
            continue
        lines.append(f"lane {result.lane}: pytest exited {result.returncode}")
        path = times_dir / f"{result.lane}.json"
        failed = json.loads(path.read_text()).get("failed", []) if path.exists() else []
        lines += [f"  FAILED {line}" for line in failed]
    return lines


def main(argv: Sequence[str]) -> int:
    """``python -m tests.lanes [pytest options]``: the whole suite in its lanes."""
    times_dir = ROOT / "var" / "test-lanes"
    for stale in times_dir.glob("*.json"):
        stale.unlink()
    for lane, folders in LANES.items():
        print(f"lane {lane}: pytest {' '.join(folders)}", flush=True)
    started = time.monotonic()
    results = run(sys.executable, argv, times_dir)
    wall = time.monotonic() - started
    print("=" * 30 + " time budget, all lanes " + "=" * 30)
    for line in combined_budget(wall, results, times_dir):
        print(line)
    for line in closing_lines(results, times_dir):
        print(line)
    return verdict(results)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
