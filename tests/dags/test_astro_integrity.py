"""The astro CLI's DAG integrity test (``.astro/test_dag_integrity_default.py``, what `astro dev
parse` runs) passes on the project's DAGs and fails on a DAG file that does not import. Run in
its own pytest process, as the astro CLI runs it: it replaces ``BaseHook.get_connection`` and
``Variable.get`` for the whole process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[2]
INTEGRITY = PROJECT / ".astro" / "test_dag_integrity_default.py"

pytestmark = pytest.mark.airflow


def run_integrity(dags_folder: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder)}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(INTEGRITY)],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_project_dags_pass_the_astro_integrity_test() -> None:
    done = run_integrity(PROJECT / "dags")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout, done.stdout


def test_a_dag_file_that_does_not_import_fails_it_by_name(tmp_path: Path) -> None:
    (tmp_path / "ok.py").write_text(
        "from airflow.sdk import DAG\nwith DAG('fine', schedule=None, tags=['t']):\n    pass\n"
    )
    (tmp_path / "broken_dag.py").write_text("from airflow.sdk import DAG\nimport no_such_module\n")

    done = run_integrity(tmp_path)

    assert done.returncode == 1, done.stdout + done.stderr
    assert "broken_dag.py failed to import" in done.stdout
    assert "No module named 'no_such_module'" in done.stdout
