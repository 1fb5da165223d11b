"""``python -m bench.taskprofile``: where a small family-run's task process spends its CPU.

What a LocalExecutor task process does with our code, without Airflow around it: this process
preloads as the scheduler does (``preload.preload_tasks``: the imports, the warmed GX suite,
then ``gc.freeze``), and each family-run is a ``fork`` of it that runs what the ``run`` task's
callable runs for a small run (``tasks.plan``, then ``tasks.whole_run``) against the node, under
``cProfile``. Before each minute the parent writes ``--rows`` increments per family inside the
minute's epoch, so every measured run compacts, verifies (engine checks and GX), cleans up and
audits. The first ``--warmup`` minutes (the first run sweeps) are not counted.

It prints the CPU-seconds per run (``time.process_time`` in the child, p50 and mean) and the
functions with the most cumulative time over the counted runs; ``--stats`` keeps the merged
``pstats`` file. Airflow's own part of a task process (the Task SDK's startup, the DAG file's
parse, the execution-API calls, the supervisor) is not here: ``py-spy record --subprocesses``
on ``make bench-airflow`` shows it (docs/airflow.md, "What a minute costs").
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from .orchestration import VENV_BIN, families_yaml

KEYSPACE = "counters_taskprofile"


def _airflow_connection_env() -> str:
    """``AIRFLOW_CONN_CASSANDRA_DEFAULT`` for the node the environment names."""
    hosts = os.environ.get("CASSANDRA_HOSTS", "127.0.0.1")
    port = int(os.environ.get("CASSANDRA_PORT", "9042"))
    return json.dumps(
        {
            "conn_type": "generic",
            "host": hosts,
            "port": port,
            "extra": {"local_dc": os.environ.get("CASSANDRA_LOCAL_DC", "datacenter1")},
        }
    )


PHASES = (
    ("counters.airflow.tasks", "plan"),
    ("counters.airflow.tasks", "compact"),
    ("counters.airflow.tasks", "verify"),
    ("counters.gx.checks", "validate_evidence"),
    ("counters.gx.checks", "_suite"),
    ("counters.gx.evidence", "keep"),
    ("counters.airflow.tasks", "cleanup"),
    ("counters.airflow.tasks", "verify_cleanup"),
    ("counters.airflow.tasks", "record_audit"),
    ("counters.airflow.tasks", "_audit"),
    ("counters.metrics", "emit_run"),
    ("counters.airflow.runtime", "connection_settings"),
    ("counters.connection", "Connection"),
    ("counters.store", "Store"),
    ("counters.identity", "check_family"),
)
"""What ``--plain`` times (CPU-seconds, nested: ``verify`` includes ``validate_evidence``)."""


def _timed(phases: dict[str, float]) -> None:
    """Wrap each of ``PHASES`` (where it is called from) with a CPU timer summing into
    ``phases``; a name imported into another module is wrapped there too."""
    import importlib
    import sys as _sys

    for module_name, name in PHASES:
        module = importlib.import_module(module_name)
        original = getattr(module, name)
        label = f"{module_name.rsplit('.', 1)[-1]}.{name}"

        def wrapper(*a: Any, _f: Any = original, _l: str = label, **k: Any) -> Any:
            started = time.process_time()
            try:
                return _f(*a, **k)
            finally:
                phases[_l] = phases.get(_l, 0.0) + time.process_time() - started

        for other in list(_sys.modules.values()):
            if getattr(other, "__name__", "").startswith("counters") and (
                getattr(other, name, None) is original
            ):
                setattr(other, name, wrapper)


def _child(family: Any, scheduled: datetime, out: Path, profiled: bool) -> None:
    """One family-run as the ``run`` task's callable does it, profiled; exits the fork."""
    code = 0
    try:
        from airflow.sdk.exceptions import AirflowSkipException
        from counters.airflow import tasks
        from counters.audit import Provenance

        phases: dict[str, float] = {}
        if not profiled:
            _timed(phases)

        profile = cProfile.Profile(time.process_time)  # CPU, not waiting
        started = time.process_time()
        if profiled:
            profile.enable()
        outcome = "small"
        try:
            run = tasks.plan(
                family,
                run_id=f"prof__{scheduled:%Y%m%dT%H%M}",
                scheduled=scheduled,
                started_by=Provenance("scheduled"),
            )
            if run.small:
                tasks.whole_run(family, run)
            else:  # a sweep (the first run): its mapped tasks' bodies, one after the other
                outcome = "large"
                verified = tasks.verify(family, run, tasks.compact(family, run, run.shards))
                cleaned = tasks.cleanup(family, run, verified, run.shards)
                tasks.finish(family, run, verified, cleaned)
        except AirflowSkipException as exc:
            outcome = f"skipped: {exc}"
        profile.disable()
        cpu = time.process_time() - started
        if profiled:
            profile.dump_stats(str(out.with_suffix(".prof")))
        out.write_text(json.dumps({"cpu_s": cpu, "outcome": outcome, "phases": phases}))
    except BaseException as exc:  # reported by the parent
        out.write_text(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
        code = 1
    finally:
        os._exit(code)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.taskprofile", description=__doc__)
    parser.add_argument("--families", type=int, default=2)
    parser.add_argument("--minutes", type=int, default=6, help="family-runs per family (6)")
    parser.add_argument("--warmup", type=int, default=2, help="uncounted first minutes (2)")
    parser.add_argument("--rows", type=int, default=60, help="increments per family-minute")
    parser.add_argument("--keyspace", default=KEYSPACE, help=f"dropped first ({KEYSPACE})")
    parser.add_argument("--top", type=int, default=45, help="functions listed (45)")
    parser.add_argument("--sort", default="cumulative", help="pstats sort key (cumulative)")
    parser.add_argument("--stats", type=Path, help="keep the merged pstats file here")
    parser.add_argument(
        "--plain", action="store_true", help="no cProfile: the CPU-seconds without its overhead"
    )
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="taskprofile-"))
    config = work / "families.yaml"
    config.write_text(families_yaml(args.families, 2, args.keyspace))
    os.environ["COUNTERS_CONFIG"] = str(config)
    os.environ.setdefault("AIRFLOW_CONN_CASSANDRA_DEFAULT", _airflow_connection_env())
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("COUNTERS_GX_RESULTS", str(work / "gx"))
    from counters.client import CounterClient
    from counters.config import load_catalog
    from counters.connection import connect

    families = list(load_catalog(config).families)
    with connect() as conn:
        conn.session.execute(f"DROP KEYSPACE IF EXISTS {args.keyspace}", timeout=120)
    subprocess.run([str(VENV_BIN / "counterctl"), "init"], check=True, env=os.environ)

    from counters.airflow import preload

    preload.preload_tasks()  # as the scheduler does before it forks the executor's workers
    # what a task process has imported before the task's callable runs (its supervisor, the
    # task runner)
    import airflow.sdk.execution_time.supervisor
    import airflow.sdk.execution_time.task_runner  # noqa: F401

    writer = connect()
    clients = [CounterClient(writer, f) for f in families]
    gc.freeze()  # as the LocalExecutor does before it forks its workers

    base = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=args.minutes + 5)
    counted: list[float] = []
    phase_sums: dict[str, float] = {}
    outcomes: dict[str, int] = {}
    merged: pstats.Stats | None = None
    for minute in range(args.minutes):
        scheduled = base + timedelta(minutes=minute)
        for client in clients:
            epoch = scheduled - client.family.lag
            for i in range(args.rows):
                at = epoch - timedelta(seconds=50) + timedelta(milliseconds=700 * i)
                client.increment(f"c{i % 25}", 1, at=min(at, epoch).replace(tzinfo=UTC))
        for family in families:
            out = work / f"{family.name}-{minute}.json"
            pid = os.fork()
            if pid == 0:
                _child(family, scheduled, out, not args.plain)
            os.waitpid(pid, 0)
            result = json.loads(out.read_text())
            if "error" in result:
                print(f"{family.name} minute {minute}: {result['error']}", file=sys.stderr)
                return 1
            outcomes[result["outcome"]] = outcomes.get(result["outcome"], 0) + 1
            if minute >= args.warmup:
                counted.append(result["cpu_s"])
                for label, cpu in result["phases"].items():
                    phase_sums[label] = phase_sums.get(label, 0.0) + cpu
                if args.plain:
                    continue
                prof = str(out.with_suffix(".prof"))
                if merged is None:
                    merged = pstats.Stats(prof, stream=io.StringIO())
                else:
                    merged.add(prof)
    writer.close()
    if not counted or (merged is None and not args.plain):
        print("no run counted", file=sys.stderr)
        return 1
    print(
        f"{len(counted)} family-runs counted ({outcomes}); task-process CPU-s per run: "
        f"p50 {statistics.median(counted):.3f}, mean {statistics.mean(counted):.3f}"
    )
    for label, cpu in sorted(phase_sums.items(), key=lambda x: -x[1]):
        print(f"  {label:<36} {cpu / len(counted):.3f} CPU-s per run")
    if merged is None:
        return 0
    stream = io.StringIO()
    merged.stream = stream  # type: ignore[attr-defined]
    merged.sort_stats(args.sort).print_stats(args.top)
    print(stream.getvalue())
    if args.stats:
        merged.dump_stats(str(args.stats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
