"""``make mwaa`` and ``make helm`` build what each platform takes (scripts/package.sh): checked
here as files; neither was deployed from this machine (docs/deploy.md)."""

from __future__ import annotations

import re
import subprocess
import zipfile
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.integration  # builds the wheel with pip (build isolation: PyPI)

PROJECT = Path(__file__).resolve().parents[3]


def package(target: str) -> Path:
    done = subprocess.run(
        [str(PROJECT / "scripts" / "package.sh"), target],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return PROJECT / "dist" / target


def airflow_pin() -> str:
    match = re.search(
        r"^apache-airflow==(\S+)$", (PROJECT / "requirements-dev.txt").read_text(), re.M
    )
    assert match
    return match.group(1)


def wheel_entry_points(wheel: zipfile.ZipFile) -> str:
    name = next(n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt"))
    return wheel.read(name).decode()


def test_mwaa_gets_the_wheel_in_plugins_zip_and_constraints_led_requirements() -> None:
    out = package("mwaa")
    with zipfile.ZipFile(out / "plugins.zip") as plugins:
        [wheel_name] = plugins.namelist()
    lines = (out / "requirements.txt").read_text().splitlines()
    constraints = (
        f'--constraint "https://raw.githubusercontent.com/apache/airflow/'
        f'constraints-{airflow_pin()}/constraints-3.12.txt"'
    )
    assert lines[0] == constraints
    assert lines[-1] == f"/usr/local/airflow/plugins/{wheel_name}"
    ranges = [
        x for x in (PROJECT / "requirements.txt").read_text().splitlines() if x and x[0] != "#"
    ]
    assert lines[1:-1] == ranges


def test_helm_gets_an_image_recipe_and_a_values_snippet() -> None:
    out = package("helm")
    [wheel_path] = out.glob("counters_compaction-*.whl")
    with zipfile.ZipFile(wheel_path) as wheel:
        assert "counters.airflow.plugin:CounterFamiliesPlugin" in wheel_entry_points(wheel)
        assert "counters/airflow/ui/templates/base.html" in wheel.namelist()
    dockerfile = (out / "Dockerfile").read_text()
    assert f"FROM apache/airflow:{airflow_pin()}-python3.12" in dockerfile
    assert f"pip install --no-cache-dir --no-deps /tmp/counters/{wheel_path.name}" in dockerfile
    values = yaml.safe_load((out / "values.yaml").read_text())
    mapping = yaml.safe_load((PROJECT / "docs/monitoring/statsd_exporter.yml").read_text())
    assert values["statsd"]["extraMappings"] == mapping["mappings"]
    assert values["config"]["metrics"]["statsd_on"] is True
    assert values["config"]["metrics"]["statsd_influxdb_enabled"] is True  # tags for labels
    assert {e["name"] for e in values["env"]} >= {"COUNTERS_CONFIG", "COUNTERS_GX_RESULTS"}
