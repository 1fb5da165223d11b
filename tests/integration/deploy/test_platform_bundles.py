"""``make mwaa`` and ``make helm`` build what each platform takes (scripts/package.sh): checked
here as files; neither was deployed from this machine (docs/deploy.md)."""

from __future__ import annotations

import os
import re
import subprocess
import zipfile
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.integration  # builds the wheel with pip (build isolation: PyPI)

PROJECT = Path(__file__).resolve().parents[3]


STAND_IN = Path(__file__).resolve().parent / "airflow-constraints"


def package(target: str, wheel: Path) -> Path:
    """``scripts/package.sh TARGET`` with the session's wheel (``WHEEL``: built once)."""
    airflow = airflow_pin()
    constraints = STAND_IN / f"constraints-{airflow}" / "constraints-3.12.txt"
    env = {**os.environ, "AIRFLOW_CONSTRAINTS": str(constraints), "WHEEL": str(wheel)}
    env.pop("COUNTERS_ASSET_CLUSTER", None)  # Airflow's file is unreachable: the stand-in
    done = subprocess.run(
        [str(PROJECT / "scripts" / "package.sh"), target],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
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


def pins(text: str) -> dict[str, str]:
    return dict(re.findall(r"^([A-Za-z0-9_.\-]+)==(\S+)$", text, re.M))


def test_the_constraints_shipped_are_airflows_with_the_projects_additions_only(
    project_wheel: Path,
) -> None:
    """What both outputs install under: every pin of Airflow's file kept (no override is needed
    while the floors stay at the supported pins), plus the tested versions of what Airflow's
    file leaves open (Great Expectations)."""
    out = package("helm", project_wheel)
    shipped = pins((out / "constraints.txt").read_text())
    airflow = pins((STAND_IN / f"constraints-{airflow_pin()}" / "constraints-3.12.txt").read_text())
    assert {n: shipped[n] for n in airflow} == airflow
    assert shipped["great-expectations"] == "1.24.1"
    overrides = "Pins above that requirements.txt's ranges exclude, now the tested version: none"
    assert overrides in (out / "constraints.txt").read_text()


def test_mwaa_gets_the_wheel_its_constraints_file_and_a_startup_script(
    project_wheel: Path,
) -> None:
    out = package("mwaa", project_wheel)
    with zipfile.ZipFile(out / "plugins.zip") as plugins:
        [wheel_name] = plugins.namelist()
        assert wheel_name == project_wheel.name
        with zipfile.ZipFile(plugins.open(wheel_name)) as wheel:
            metadata = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
            assert "Requires-Dist: apache-airflow>=3.3.0" in wheel.read(metadata).decode()
            entry_points = wheel_entry_points(wheel)
            assert "[apache_airflow_provider]" in entry_points  # the cassandra asset scheme
    lines = (out / "requirements.txt").read_text().splitlines()
    # MWAA's documented override: the constraints file in the DAGs folder, named by path
    assert lines[0] == '--constraint "/usr/local/airflow/dags/constraints-counters-3.12.txt"'
    constraints = pins((out / "dags" / "constraints-counters-3.12.txt").read_text())
    assert constraints["apache-airflow-core"] == airflow_pin()
    assert lines[-1] == f"/usr/local/airflow/plugins/{wheel_name}"
    ranges = [
        x for x in (PROJECT / "requirements.txt").read_text().splitlines() if x and x[0] != "#"
    ]
    assert lines[1:-1] == ranges
    private = (out / "requirements-private-webserver.txt").read_text().splitlines()
    assert private[:2] == ["--find-links /usr/local/airflow/plugins", "--no-index"]
    assert private[2:] == lines
    startup = (out / "startup.sh").read_text()
    assert 'export COUNTERS_ASSET_CLUSTER="CASSANDRA_HOST:9042"' in startup
    readme = (out / "README.txt").read_text()
    assert "Private web server" in readme and "pip download" in readme


def test_helm_gets_an_image_recipe_and_a_values_snippet(project_wheel: Path) -> None:
    out = package("helm", project_wheel)
    [wheel_path] = out.glob("counters_compaction-*.whl")
    with zipfile.ZipFile(wheel_path) as wheel:
        assert "counters.airflow.plugin:CounterFamiliesPlugin" in wheel_entry_points(wheel)
        assert "counters/airflow/ui/templates/base.html" in wheel.namelist()
    dockerfile = (out / "Dockerfile").read_text()
    assert f"FROM apache/airflow:{airflow_pin()}-python3.12" in dockerfile
    # the docker-stack docs' habit: the image's Airflow named on the pip line, so pip keeps it
    pip_line = f'RUN pip install --no-cache-dir "apache-airflow=={airflow_pin()}" -r '
    assert pip_line in dockerfile
    assert "--constraint /tmp/counters/constraints.txt" in dockerfile
    assert (out / "constraints.txt").is_file()
    assert f"pip install --no-cache-dir --no-deps /tmp/counters/{wheel_path.name}" in dockerfile
    values = yaml.safe_load((out / "values.yaml").read_text())
    assert values["airflowVersion"] == airflow_pin()
    git_sync = values["dags"]["gitSync"]
    assert git_sync["enabled"] is True
    env = {e["name"]: e["value"] for e in values["env"]}
    # git-sync checks the repository out under /opt/airflow/dags/repo; the DAG folder is subPath
    families = f"/opt/airflow/dags/repo/{git_sync['subPath']}/counter_families.yaml"
    assert env["COUNTERS_CONFIG"] == families
    assert (PROJECT / git_sync["subPath"]).is_dir()  # the repository's dags/
    assert env["COUNTERS_ASSET_CLUSTER"] == "CASSANDRA_HOST:9042"
    assert "COUNTERS_GX_RESULTS" in env
    mapping = yaml.safe_load((PROJECT / "docs/monitoring/statsd_exporter.yml").read_text())
    assert values["statsd"]["extraMappings"] == mapping["mappings"]
    assert values["config"]["metrics"]["statsd_on"] is True
    assert values["config"]["metrics"]["statsd_influxdb_enabled"] is True  # tags for labels
