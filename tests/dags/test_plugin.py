"""The plugin as Airflow loads it in every process, from the installed package's
``airflow.plugins`` entry point: it registers with nothing in a plugins folder, loading it
imports none of the heavy modules (schedulers and task processes load it too), and a real
Airflow job's start preloads what its forks need through its listener, the task bodies
included (not timed here: ``make bench-airflow`` measures the preload)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.airflow

PROBE = """
import json, sys
from airflow import plugins_manager
plugins, errors = plugins_manager._get_plugins()
heavy = ("cassandra.cluster", "counters.store", "counters.engine", "pandas", "great_expectations",
         "airflow.api_fastapi.core_api.security")
ui = next(p for p in plugins if p.name == "counter_families")
print(json.dumps({
    "plugins": sorted(p.name for p in plugins),
    "errors": errors,
    "source": str(ui.source),
    "heavy": sorted(m for m in heavy if m in sys.modules),
    "apps": [(a["name"], a["url_prefix"]) for a in ui.fastapi_apps],
    "views": [(v["url_route"], v["href"], v["destination"]) for v in ui.external_views],
    "listeners": sorted(type(x).__name__ for x in ui.listeners),
}))
"""


def probe_env(plugins_folder: Path) -> dict[str, str]:
    """This environment, with an empty plugins folder: the plugin must come from the package."""
    return {
        **os.environ,
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(plugins_folder),
        "PYTHONWARNINGS": "ignore",
    }


def test_the_plugin_loads_from_the_entry_point_without_errors_or_heavy_imports(
    tmp_path: Path,
) -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        env=probe_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    probe = json.loads(out.stdout.strip().splitlines()[-1])
    assert probe["errors"] == {}
    assert "counter_families" in probe["plugins"]
    assert "counters-compaction" in probe["source"], probe["source"]  # the entry point's dist
    assert probe["apps"] == [["Counter families", "/counters"]]
    assert probe["views"] == [["counter-families", "counters/", "nav"]]
    assert probe["listeners"] == ["PoolListener", "PreloadListener", "TriggererListener"]
    assert probe["heavy"] == []


JOB_PROBE = """
import json, sys
sys.argv = [sys.argv[1] + "/airflow", *sys.argv[2:]]
from airflow.jobs.job import Job
Job()  # what `airflow <command>` builds before it runs (and forks): listeners' on_starting
heavy = ("counters.airflow.factory", "counters.airflow.tasks", "cassandra.cluster", "pandas",
         "great_expectations")
print(json.dumps(sorted(m for m in heavy if m in sys.modules)))
"""


@pytest.mark.parametrize(
    ("command", "loaded"),
    [
        (["dag-processor"], ["counters.airflow.factory"]),  # each parse's fork inherits it
        (
            ["scheduler"],  # its LocalExecutor workers fork the task processes
            [
                "cassandra.cluster",
                "counters.airflow.factory",
                "counters.airflow.tasks",
                "great_expectations",
                "pandas",
            ],
        ),
        (["triggerer"], []),
    ],
)
def test_a_job_start_preloads_what_its_forks_need_through_the_listener(
    command: list[str], loaded: list[str], tmp_path: Path
) -> None:
    out = subprocess.run(
        [sys.executable, "-c", JOB_PROBE, "/opt/bin", *command],
        env=probe_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == loaded


FORKED_TASK_PROBE = """
import json, os, sys
sys.argv = [sys.argv[1] + "/airflow", "scheduler"]
from airflow.jobs.job import Job
Job()  # the scheduler's start: the listener preloads
import airflow.executors.local_executor, airflow.sdk.execution_time.supervisor  # a worker's
before = set(sys.modules)
read, write = os.pipe()
child = os.fork()
if child == 0:  # what a task process imports before it runs the task
    from airflow.sdk.execution_time import task_runner  # _subprocess_main
    from airflow.dag_processing.dagbag import BundleDagBag  # task_runner.parse
    import jinja2.ext  # its template environment (``jinja2.ext.do``)
    os.write(write, json.dumps(sorted(set(sys.modules) - before)).encode())
    os._exit(0)
os.close(write)
chunks = []
while chunk := os.read(read, 65536):
    chunks.append(chunk)
os.waitpid(child, 0)
print(json.dumps(json.loads(b"".join(chunks))))
"""


def test_a_task_process_forked_after_the_preload_imports_nothing_before_its_task(
    tmp_path: Path,
) -> None:
    """A LocalExecutor worker forks each task process from the preloaded scheduler: what the
    task process imports before it runs the task (its task runner, the DAG bag it parses the
    DAG file with, Jinja's extensions for its template environment) is imported there once,
    not in every task (``python -X importtime`` on this probe: no line from the child; the
    task runner and the DAG bag come with the scheduler's own imports, Jinja's extensions with
    the preload)."""
    out = subprocess.run(
        [sys.executable, "-c", FORKED_TASK_PROBE, "/opt/bin"],
        env=probe_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
