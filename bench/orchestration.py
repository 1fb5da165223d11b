"""``python -m bench.orchestration``: what minute runs cost in Airflow (``make bench-airflow``).

Runs ``airflow standalone`` (as ``make run`` does) over ``--families`` synthetic increments
families scheduled every minute, and measures two windows after a warm-up: one with every family
idle (no writes), one with a writer feeding every family a few increments a second. For each
window it reports, from /proc and the Airflow metadata DB:

- CPU-seconds per family-run, split by process kind (scheduler, LocalExecutor workers and the
  task processes they fork, DAG processor, API server, triggerer, Cassandra, the writer);
- schedule delay: a run's start (and its first task's queueing) minus its data interval end,
  p50/p99/max, and whether the runs kept up (every family ran every minute, no backlog).

Needs the environment ``scripts/bench_airflow.sh`` sets up: a migrated ``AIRFLOW_HOME`` with the
project's DAGs and plugins folders, ``CASSANDRA_HOSTS``/``CASSANDRA_PORT`` of a running node.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from .ops import code_state, machine, percentile
from .report import result_path, write_new

PROJECT_ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
KEYSPACE = "counters_orchestration"
CLK_TCK = os.sysconf("SC_CLK_TCK")

# --- process accounting (pure parts first) ---------------------------------------------------

KINDS = (
    ("counters warm pool", "warm pool"),  # the triggerer's pool processes (their title)
    ("multiprocessing.resource_tracker", "warm pool"),  # the pool's helper, started with it
    ("task runner", "task processes"),
    ("LocalExecutor", "executor workers"),
    ("scheduler", "scheduler"),
    ("dag-processor", "dag processor"),
    ("dag_processor", "dag processor"),
    ("api-server", "api server"),
    ("api_server", "api server"),
    ("uvicorn", "api server"),
    ("triggerer", "triggerer"),
    ("standalone", "standalone"),
    ("CassandraDaemon", "cassandra"),
)


def kind_of(cmdline: str) -> str:
    """The process kind of an Airflow (or Cassandra) process, from its command line/title."""
    for needle, kind in KINDS:
        if needle in cmdline:
            return kind
    return "other"


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    kind: str
    own_s: float
    """user + system CPU of the process itself"""
    children_s: float
    """user + system CPU of its children that it has waited for"""


def read_proc(pid: int) -> Proc | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    return Proc(
        pid,
        int(fields[1]),
        kind_of(cmdline or stat),
        (utime + stime) / CLK_TCK,
        (cutime + cstime) / CLK_TCK,
    )


def descendants(root: int) -> dict[int, Proc]:
    """``root`` and every process below it."""
    procs = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            proc = read_proc(int(entry.name))
            if proc is not None:
                procs[proc.pid] = proc
    children: dict[int, list[int]] = {}
    for proc in procs.values():
        children.setdefault(proc.ppid, []).append(proc.pid)
    found, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if pid in procs:
            found[pid] = procs[pid]
            todo.extend(children.get(pid, ()))
    return found


def cpu_by_kind(before: dict[int, Proc], after: dict[int, Proc]) -> dict[str, float]:
    """CPU-seconds spent between two snapshots of a process tree, by kind. A process's own
    time goes to its kind; the time of children it reaped in between (short-lived task
    processes) to "<kind> children". Processes that ended before ``after`` are counted in
    their parent's children time."""
    out: dict[str, float] = {}
    for pid, proc in after.items():
        start = before.get(pid)
        own = proc.own_s - (start.own_s if start else 0.0)
        reaped = proc.children_s - (start.children_s if start else 0.0)
        out[proc.kind] = out.get(proc.kind, 0.0) + own
        if reaped > 0:
            label = "task processes" if proc.kind == "executor workers" else f"{proc.kind} children"
            out[label] = out.get(label, 0.0) + reaped
    return {k: round(v, 2) for k, v in sorted(out.items(), key=lambda kv: -kv[1])}


def host_cpu() -> tuple[float, float]:
    """The whole host's busy and total CPU-seconds since boot (/proc/stat), every process's,
    the other users' of a shared machine too."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    total = sum(fields[:8])
    return (total - idle) / CLK_TCK, total / CLK_TCK


@dataclass
class RunRow:
    dag_id: str
    state: str
    interval_end: datetime
    start: datetime | None
    end: datetime | None
    first_queued: datetime | None
    tasks: int


def delays(runs: list[RunRow]) -> dict[str, Any]:
    """Schedule delay of the runs (start minus data interval end; first task queued minus data
    interval end), percentiles in seconds."""
    started = [(r.start - r.interval_end).total_seconds() for r in runs if r.start]
    queued = [(r.first_queued - r.interval_end).total_seconds() for r in runs if r.first_queued]
    durations = [(r.end - r.start).total_seconds() for r in runs if r.start and r.end]

    def stats(values: list[float]) -> dict[str, float | None]:
        if not values:
            return {"p50": None, "p99": None, "max": None}
        return {
            "p50": round(percentile(values, 50), 2),
            "p99": round(percentile(values, 99), 2),
            "max": round(max(values), 2),
        }

    return {
        "start_delay_s": stats(started),
        "first_task_queued_delay_s": stats(queued),
        "run_duration_s": stats(durations),
    }


# --- the families, Airflow, the writer --------------------------------------------------------


def families_yaml(
    count: int, shards: int, keyspace: str = KEYSPACE, *, shard_tasks: bool = False
) -> str:
    families = [
        {
            "name": f"orch{i:03d}",
            "kind": "increments",
            "keyspace": keyspace,
            "raw_table": f"orch{i:03d}_raw",
            "compact_table": f"orch{i:03d}_compact",
            "lag": "1m",
            "schedule": "* * * * *",
            "shards": shards,
            "shard_tasks": shard_tasks,
            "tags": ["bench"],
        }
        for i in range(count)
    ]
    return "# Written by python -m bench.orchestration\n" + yaml.safe_dump({"families": families})


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Airflow:
    home: Path
    port: int
    env: dict[str, str]
    process: subprocess.Popen[bytes] | None = None
    log_path: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log_path = self.home / "standalone.log"

    def start(self, timeout: float = 240) -> float:
        started = time.monotonic()
        with self.log_path.open("ab") as out:
            self.process = subprocess.Popen(
                [str(VENV_BIN / "airflow"), "standalone"],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                start_new_session=True,
            )
        url = f"http://127.0.0.1:{self.port}/api/v2/monitor/health"
        parts = ("metadatabase", "scheduler", "triggerer", "dag_processor")
        while time.monotonic() - started < timeout:
            if self.process.poll() is not None:
                raise RuntimeError(f"airflow standalone exited; see {self.log_path}")
            try:
                with urllib.request.urlopen(url, timeout=3) as answer:
                    health = json.load(answer)
                if all((health.get(p) or {}).get("status") == "healthy" for p in parts):
                    return time.monotonic() - started
            except OSError:
                pass
            time.sleep(1)
        raise RuntimeError(f"Airflow not healthy after {timeout} s; see {self.log_path}")

    def stop(self, timeout: float = 60) -> None:
        if self.process is None:
            return
        pgid = self.process.pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and _group_alive(pgid):
            time.sleep(0.5)
        if _group_alive(pgid):
            os.killpg(pgid, signal.SIGKILL)
        self.process.wait()
        self.process = None


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def read_runs(db: Path, since: datetime, until: datetime) -> list[RunRow]:
    """The compaction DAG runs whose data interval ended in [since, until)."""
    fmt = "%Y-%m-%d %H:%M:%S.%f"
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30) as conn:
        rows = conn.execute(
            "SELECT r.dag_id, r.state, r.data_interval_end, r.start_date, r.end_date, "
            "(SELECT min(t.queued_dttm) FROM task_instance t WHERE t.dag_id = r.dag_id "
            " AND t.run_id = r.run_id), "
            "(SELECT count(*) FROM task_instance t WHERE t.dag_id = r.dag_id "
            " AND t.run_id = r.run_id AND t.state NOT IN ('skipped', 'removed')) "
            "FROM dag_run r WHERE r.dag_id LIKE 'compact_orch%' "
            "AND r.data_interval_end >= ? AND r.data_interval_end < ?",
            (since.strftime(fmt), until.strftime(fmt)),
        ).fetchall()

    def at(value: str | None) -> datetime | None:
        if not value:
            return None
        return datetime.fromisoformat(value.replace(" ", "T")).replace(tzinfo=UTC)

    out = []
    for dag_id, state, end_of_interval, start, end, queued, tasks in rows:
        interval_end = at(end_of_interval)
        assert interval_end is not None
        out.append(RunRow(dag_id, state, interval_end, at(start), at(end), at(queued), tasks))
    return out


class Writer:
    """A few increments a second into every family, in a thread of this process."""

    def __init__(self, families: list[Any], rate: float) -> None:
        from counters.connection import connect

        self.conn = connect()
        self.families = families
        self.rate = rate
        self.stop_event = threading.Event()
        self.thread: threading.Thread | None = None
        self.written = 0

    def start(self) -> None:
        from counters.demo import write_forever

        def work() -> None:
            self.written = write_forever(
                self.conn, self.families, self.rate, 50, self.stop_event, actor="orch"
            )

        self.stop_event.clear()
        self.thread = threading.Thread(target=work, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.stop_event.set()
        if self.thread:
            self.thread.join()
            self.thread = None


def _minute_boundary(after: float) -> float:
    return (int(after // 60) + 1) * 60


def measure_window(
    label: str, minutes: int, airflow: Airflow, cassandra_pid: int | None, say: Any
) -> dict[str, Any]:
    """Measure whole minutes, from one minute boundary to another."""
    assert airflow.process is not None
    time.sleep(max(0.0, _minute_boundary(time.time()) - time.time() + 1))
    since = datetime.now(UTC).replace(second=0, microsecond=0)
    say(f"{label}: measuring {minutes} min from {since:%H:%M}")
    before = descendants(airflow.process.pid)
    cass_before = read_proc(cassandra_pid) if cassandra_pid else None
    own_before = time.process_time()
    host_before = host_cpu()
    time.sleep(minutes * 60)
    host_after = host_cpu()
    after = descendants(airflow.process.pid)
    cass_after = read_proc(cassandra_pid) if cassandra_pid else None
    own = time.process_time() - own_before
    until = datetime.now(UTC).replace(second=0, microsecond=0)
    # runs whose interval ended in the window, read once they had a minute to finish
    time.sleep(60)
    runs = read_runs(airflow.home / "airflow.db", since, until)
    cpu = cpu_by_kind(before, after)
    airflow_cpu = round(sum(cpu.values()), 2)
    finished = [r for r in runs if r.state in ("success", "failed")]
    families = {r.dag_id for r in runs}
    expected = len(families) * int((until - since).total_seconds() // 60) if families else 0
    result = {
        "window": {"from": since.isoformat(), "to": until.isoformat(), "minutes": minutes},
        "family_runs": len(runs),
        "family_runs_expected": expected,
        "family_runs_finished": len(finished),
        "family_runs_failed": sum(1 for r in runs if r.state == "failed"),
        "task_instances_executed": sum(r.tasks for r in runs),
        "airflow_cpu_s": airflow_cpu,
        "airflow_cpu_by_kind_s": cpu,
        "cassandra_cpu_s": round(cass_after.own_s - cass_before.own_s, 2)
        if cass_before and cass_after
        else None,
        "writer_and_bench_cpu_s": round(own, 2),
        "airflow_cpu_s_per_family_run": round(airflow_cpu / len(runs), 3) if runs else None,
        "airflow_cpu_by_kind_per_family_run_s": {
            kind: round(seconds / len(runs), 3) for kind, seconds in cpu.items()
        }
        if runs
        else None,
        "machine_busy_fraction": round(
            (airflow_cpu + own + (cass_after.own_s - cass_before.own_s if cass_before else 0))
            / (minutes * 60 * (os.cpu_count() or 1)),
            3,
        ),
        "host_busy_fraction": round(
            (host_after[0] - host_before[0]) / max(host_after[1] - host_before[1], 1e-9), 3
        ),
        "load_average_at_end": os.getloadavg(),
        **delays(runs),
    }
    result["kept_up"] = bool(
        runs
        and len(finished) == len(runs)
        and len(runs) >= expected
        and (result["start_delay_s"]["max"] or 0) < 60
    )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.orchestration", description=__doc__)
    parser.add_argument("--families", type=int, default=50)
    parser.add_argument("--shards", type=int, default=2, help="shards per family (2)")
    parser.add_argument("--warmup", type=int, default=3, help="minutes before measuring (3)")
    parser.add_argument("--minutes", type=int, default=5, help="minutes per window (5)")
    parser.add_argument("--rate", type=float, default=2.0, help="increments/s per family (2)")
    parser.add_argument("--no-preload", action="store_true", help="COUNTERS_PRELOAD=0")
    parser.add_argument("--skip-idle", action="store_true", help="measure the active window only")
    shape = parser.add_mutually_exclusive_group()
    shape.add_argument(
        "--one-task",
        action="store_true",
        help="families with shard_tasks: false, the default shape (kept for older commands)",
    )
    shape.add_argument(
        "--mapped",
        action="store_true",
        help="families with shard_tasks: true (the five-task mapped shape)",
    )
    parser.add_argument(
        "--keyspace",
        default=KEYSPACE,
        help=f"keyspace of the families ({KEYSPACE}; dropped first): another on a shared node",
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="JSON report, a new file (var/bench/<start>-<commit>-airflow.json)",
    )
    args = parser.parse_args(argv)
    if args.out is not None and args.out.exists():
        parser.error(f"--out {args.out}: a file is there already; a result is never written over")

    def say(message: str) -> None:
        print(f"[bench-airflow {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)

    home = Path(os.environ["AIRFLOW_HOME"])
    config = home / "families.yaml"
    config.write_text(
        families_yaml(args.families, args.shards, args.keyspace, shard_tasks=args.mapped)
    )
    os.environ["COUNTERS_CONFIG"] = str(config)
    from counters.config import load_catalog

    families = list(load_catalog(config).families)
    from counters.connection import connect

    with connect() as conn:  # a fresh deployment: no state (epochs, sweeps) of an earlier run
        conn.session.execute(f"DROP KEYSPACE IF EXISTS {args.keyspace}", timeout=120)
    say(f"{len(families)} families in {config} (keyspace {args.keyspace} dropped); counterctl init")
    subprocess.run([str(VENV_BIN / "counterctl"), "init"], check=True, env=os.environ)
    subprocess.run(
        [sys.executable, str(PROJECT_ROOT / "scripts/airflow_settings.py")],
        check=True,
        env=os.environ,
    )
    port = free_port()
    env = dict(
        os.environ,
        AIRFLOW__API__PORT=str(port),
        AIRFLOW__CORE__EXECUTION_API_SERVER_URL=f"http://localhost:{port}/execution/",
        COUNTERS_PRELOAD="0" if args.no_preload else "1",
    )
    airflow = Airflow(home, port, env)
    cassandra_pid = None
    try:
        from .ops import server_pid

        cassandra_pid = server_pid(int(os.environ.get("CASSANDRA_PORT", "9042")))
    except Exception:
        pass
    writer = Writer(families, args.rate)
    started = datetime.now(UTC)
    code = code_state()
    out = args.out or result_path(started, code["commit"], ["airflow"])
    report: dict[str, Any] = {
        "started_at": started.isoformat(timespec="seconds"),
        "command": 'make bench-airflow ARGS="'
        + " ".join(sys.argv[1:] if argv is None else argv)
        + '"',
        "machine": machine(),
        "code": code,
        "families": args.families,
        "shards": args.shards,
        "preload": not args.no_preload,
        "shard_tasks": args.mapped,
        "warm_pool": os.environ.get("COUNTERS_WARM_POOL", "on"),
        # the scheduler's settings given from the environment: a run that tries one says so
        "scheduler_settings": {
            k: v for k, v in sorted(os.environ.items()) if k.startswith("AIRFLOW__SCHEDULER__")
        },
        "rate_per_family": args.rate,
        "cores": os.cpu_count(),
        "started": datetime.now(UTC).isoformat(),
    }
    try:
        say(f"airflow standalone on port {port} (log {airflow.log_path})")
        report["airflow_start_s"] = round(airflow.start(), 1)
        say(f"healthy after {report['airflow_start_s']} s; warm-up {args.warmup} min")
        time.sleep(args.warmup * 60)
        if not args.skip_idle:
            report["idle"] = measure_window("idle", args.minutes, airflow, cassandra_pid, say)
            say(json.dumps(report["idle"]))
        writer.start()
        time.sleep(60)  # the first runs after the writes begin
        report["active"] = measure_window("active", args.minutes, airflow, cassandra_pid, say)
        say(json.dumps(report["active"]))
    finally:
        writer.stop()
        say("stopping Airflow")
        airflow.stop()
        writer.conn.close()
    db = home / "airflow.db"
    report["metadata_db_bytes"] = db.stat().st_size if db.exists() else None
    written = write_new(out, report, started)
    print(table(report))
    say(f"JSON: {written}")
    return 0


def table(report: dict[str, Any]) -> str:
    lines = [
        f"orchestration bench: {report['families']} families x {report['shards']} shards, "
        f"every minute, preload {'on' if report['preload'] else 'off'}, {report['cores']} cores"
    ]
    for label in ("idle", "active"):
        window = report.get(label)
        if not window:
            continue
        lines.append(
            f"  {label:6s} runs {window['family_runs']}/{window['family_runs_expected']} "
            f"(finished {window['family_runs_finished']}, failed {window['family_runs_failed']}), "
            f"Airflow CPU {window['airflow_cpu_s']} s = "
            f"{window['airflow_cpu_s_per_family_run']} s per family-run, "
            f"machine busy {window['machine_busy_fraction']:.0%}, "
            f"start delay p50/p99/max {window['start_delay_s']}, kept up: {window['kept_up']}"
        )
        lines.append(f"         by kind: {window['airflow_cpu_by_kind_s']}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
