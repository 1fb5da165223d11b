"""The plugins folder as Airflow loads it in every process: the UI plugin registers, nothing
fails to import, and loading it stays cheap (schedulers and task processes load it too)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.airflow

PLUGINS = Path(__file__).resolve().parents[2] / "plugins"

PROBE = """
import json, sys, time
started = time.perf_counter()
from airflow import plugins_manager
plugins, errors = plugins_manager._get_plugins()
seconds = time.perf_counter() - started
heavy = ("cassandra.cluster", "counters.store", "counters.engine", "pandas", "great_expectations",
         "airflow.api_fastapi.core_api.security")
ui = next(p for p in plugins if p.name == "counter_families")
print(json.dumps({
    "plugins": sorted(p.name for p in plugins),
    "errors": errors,
    "heavy": sorted(m for m in heavy if m in sys.modules),
    "apps": [(a["name"], a["url_prefix"]) for a in ui.fastapi_apps],
    "views": [(v["url_route"], v["href"], v["destination"]) for v in ui.external_views],
}))
"""


def test_expect_the_ui_plugin_loaded_without_errors_or_heavy_imports() -> None:
    env = {**os.environ, "AIRFLOW__CORE__PLUGINS_FOLDER": str(PLUGINS), "PYTHONWARNINGS": "ignore"}
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    probe = json.loads(out.stdout.strip().splitlines()[-1])
    assert probe["errors"] == {}
    assert "counter_families" in probe["plugins"]
    assert probe["apps"] == [["Counter families", "/counters"]]
    assert probe["views"] == [["counter-families", "counters/", "nav"]]
    assert probe["heavy"] == []


PRELOAD_PROBE = """
import json, sys
sys.argv = [sys.argv[1] + "/airflow", *sys.argv[2:]]
import airflow_local_settings  # what Airflow imports first in every process
heavy = ("counters.airflow.factory", "cassandra.cluster", "pandas", "great_expectations")
print(json.dumps(sorted(m for m in heavy if m in sys.modules)))
"""


@pytest.mark.parametrize(
    ("command", "loaded"),
    [
        (["dag-processor"], ["counters.airflow.factory"]),  # each parse's fork inherits it
        (["api-server"], []),
        (["dags", "list"], []),
    ],
)
def test_the_dag_processor_preloads_the_dag_factory_and_nothing_heavier(
    command: list[str], loaded: list[str]
) -> None:
    env = {**os.environ, "PYTHONPATH": f"{PLUGINS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    out = subprocess.run(
        [sys.executable, "-c", PRELOAD_PROBE, "/opt/bin", *command],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == loaded
