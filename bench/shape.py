"""``python -m bench.shape``: what a minute DAG's shape costs Airflow, apart from our code.

Starts ``airflow standalone`` once per shape over ``--dags`` minute DAGs whose tasks do nothing
of ours (``run`` sleeps a second): ``one`` is that task alone, ``five`` is the five-task shape of
a family with ``shard_tasks`` (``run`` -> ``compact[]`` -> ``verify`` -> ``cleanup[]`` ->
``record_audit``, the mapped tasks over nothing, the rest skipped, as in a small run), and
``trigger`` is ``run`` started from the trigger (``start_from_trigger``: the scheduler defers it
at once, a trigger in the triggerer sleeps the second and ends it with ``TaskSuccessEvent``; no
executor, task process or execution-API request). The CPU each process kind spent per DAG run
in a window of whole minutes is the cost of the shape, and the ``one`` figure is Airflow's own
floor for a family-run on a worker (docs/airflow.md, "The DAG's shape"). Needs no Cassandra; the
settings are those of ``scripts/env.sh``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .ops import code_state, machine
from .orchestration import VENV_BIN, Airflow, free_port, measure_window
from .report import result_path, write_new

SHAPES = ("one", "five", "trigger")

DAG_FILE = '''"""Minute DAGs of one shape (bench.shape): tasks that do nothing of the project's."""
import os
import time
from datetime import UTC, datetime, timedelta

from airflow.sdk import DAG, BaseOperator, task

SHAPE = os.environ["BENCH_DAG_SHAPE"]
START = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=2)

for i in range(int(os.environ["BENCH_DAGS"])):
    with DAG(
        dag_id=f"compact_orch{i:03d}",
        schedule="* * * * *",
        start_date=START,
        catchup=False,
        max_active_runs=1,
    ) as dag:

        @task(task_id="run")
        def run_():
            time.sleep(1.0)
            return None if SHAPE == "one" else []

        if SHAPE == "trigger":
            from airflow.triggers.base import StartTriggerArgs

            class TriggerRun(BaseOperator):
                """Started and ended by its trigger; ``execute_complete`` runs on a worker
                only when the trigger hands the task back (never here)."""

                template_fields = ()
                start_from_trigger = True
                start_trigger_args = StartTriggerArgs(
                    trigger_cls="shape_trigger.SleepThenSucceed",
                    trigger_kwargs={"seconds": 1.0},
                    next_method="execute_complete",
                    timeout=timedelta(minutes=5),
                )

                def execute_complete(self, context, event=None):
                    return None

            TriggerRun(task_id="run")
        elif SHAPE == "one":
            run_()
        else:

            @task
            def compact(run, shards):
                return []

            @task
            def verify(run, reports):
                return {}

            @task
            def cleanup(run, verified, shards):
                return []

            @task
            def record_audit(run, verified, cleanups):
                return {}

            groups = run_()
            plan = groups["run"]
            reports = compact.partial(run=plan).expand(shards=groups)
            verified = verify(plan, reports)
            cleanups = cleanup.partial(run=plan, verified=verified).expand(shards=groups)
            record_audit(plan, verified, cleanups)
    globals()[dag.dag_id] = dag
'''

TRIGGER_MODULE = '''"""The trigger of bench.shape's ``trigger`` shape (in $AIRFLOW_HOME/config)."""
import asyncio

from airflow.triggers.base import BaseTrigger, TaskSuccessEvent


class SleepThenSucceed(BaseTrigger):
    def __init__(self, seconds: float = 1.0):
        super().__init__()
        self.seconds = seconds

    def serialize(self):
        return ("shape_trigger.SleepThenSucceed", {"seconds": self.seconds})

    async def run(self):
        await asyncio.sleep(self.seconds)
        yield TaskSuccessEvent()
'''


def airflow_env(home: Path, dags: Path, shape: str, count: int) -> dict[str, str]:
    """The environment of one shape's Airflow: ``scripts/env.sh``'s settings for minute DAGs,
    a scratch home and DAG folder, no project plugin preload (nothing of ours runs)."""
    env = dict(os.environ)
    env.update(
        PATH=f"{VENV_BIN}:{env.get('PATH', '')}",
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__DAGS_FOLDER=str(dags),
        AIRFLOW__CORE__PLUGINS_FOLDER=str(home / "plugins"),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION="False",
        AIRFLOW__CORE__PARALLELISM="8",
        AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL="30",
        AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL="120",
        AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES="1",
        AIRFLOW__CORE__MP_START_METHOD="fork",
        COUNTERS_PRELOAD="0",
        # SQLite's 5 s lock wait is too short on a loaded machine: the triggerer died of
        # "database is locked" under a load average of 20
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS="shape_sqlite.CONNECT_ARGS",
        PYTHONWARNINGS="ignore",
        BENCH_DAG_SHAPE=shape,
        BENCH_DAGS=str(count),
    )
    return env


def dag_processor_counts(home: Path) -> dict[str, int]:
    """From the DAG processor's logs since the start: how many times it parsed the DAG file
    (for its interval or for callbacks), and how many task callbacks it found to be no failure
    callback (each success of a trigger-ended task queues one: ``models/trigger.py``
    ``handle_event_submit``; callbacks queued together for a file share one parse)."""
    needles = {
        "parses": b"Filling up the DagBag from",
        "success_callbacks": b"Task callback requested but is not a failure callback",
    }
    counts = dict.fromkeys(needles, 0)
    for path in (home / "logs").rglob("*"):
        if path.is_file() and "dag_processor" in path.parts:
            text = path.read_bytes()
            for name, needle in needles.items():
                counts[name] += text.count(needle)
    return counts


def measure_shape(
    shape: str, count: int, warmup: int, minutes: int, say: Any, extra_env: dict[str, str]
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"bench-shape-{shape}-") as scratch:
        home, dags = Path(scratch) / "home", Path(scratch) / "dags"
        home.mkdir()
        dags.mkdir()
        (dags / "shape_dags.py").write_text(DAG_FILE)
        (home / "config").mkdir()
        (home / "config" / "shape_trigger.py").write_text(TRIGGER_MODULE)
        (home / "config" / "shape_sqlite.py").write_text('CONNECT_ARGS = {"timeout": 60}\n')
        env = airflow_env(home, dags, shape, count)
        env.update(extra_env)
        subprocess.run(
            [str(VENV_BIN / "airflow"), "db", "migrate"], env=env, check=True, capture_output=True
        )
        port = free_port()
        env.update(
            AIRFLOW__API__PORT=str(port),
            AIRFLOW__CORE__EXECUTION_API_SERVER_URL=f"http://localhost:{port}/execution/",
        )
        airflow = Airflow(home, port, env)
        try:
            say(f"{shape}: airflow standalone on port {port}")
            started = airflow.start(timeout=600)  # a loaded shared machine starts slowly
            say(f"{shape}: healthy after {started:.0f} s; warm-up {warmup} min")
            time.sleep(warmup * 60)
            window = measure_window(shape, minutes, airflow, None, say)
            window["dag_processor_since_start"] = dag_processor_counts(home)
            if not window["kept_up"]:  # why, for the record
                kept = result_path(datetime.now(UTC), None, [f"shape-{shape}-standalone"])
                kept = kept.with_suffix(".log")
                kept.parent.mkdir(parents=True, exist_ok=True)
                kept.write_bytes(airflow.log_path.read_bytes()[-2_000_000:])
                window["standalone_log"] = str(kept)
            window["settings"] = extra_env
            return window
        finally:
            airflow.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.shape", description=__doc__)
    parser.add_argument("--dags", type=int, default=25, help="minute DAGs (25)")
    parser.add_argument("--warmup", type=int, default=2, help="minutes before measuring (2)")
    parser.add_argument("--minutes", type=int, default=4, help="minutes per window (4)")
    parser.add_argument(
        "--shapes",
        default=",".join(SHAPES),
        help=f"the shapes, in this order ({','.join(SHAPES)})",
    )
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an environment variable for every shape's Airflow (e.g. an AIRFLOW__ setting)",
    )
    args = parser.parse_args(argv)
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown or not shapes:
        parser.error(f"--shapes: {','.join(unknown) or 'none'}: the shapes are {','.join(SHAPES)}")
    bad = [e for e in args.env if "=" not in e]
    if bad:
        parser.error(f"--env {bad[0]!r}: expected NAME=VALUE")
    extra_env = dict(e.split("=", 1) for e in args.env)

    def say(message: str) -> None:
        print(f"[bench-shape {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)

    started = datetime.now(UTC)
    code = code_state()
    report: dict[str, Any] = {
        "started_at": started.isoformat(timespec="seconds"),
        "command": "python -m bench.shape " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": machine(),
        "code": code,
        "dags": args.dags,
        "shapes": {},
    }
    for shape in shapes:
        report["shapes"][shape] = measure_shape(
            shape, args.dags, args.warmup, args.minutes, say, extra_env
        )
    written = write_new(result_path(started, code["commit"], ["shape"]), report, started)
    for shape, window in report["shapes"].items():
        say(f"{shape}: {window['airflow_cpu_s_per_family_run']} Airflow CPU-s per DAG run")
    say(f"JSON: {written}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
