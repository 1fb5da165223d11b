"""``counters.airflow.celery_local``: the Celery settings of a broker-less CeleryExecutor."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit


def _import(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Import the module in a fresh interpreter (it reads its folder at import)."""
    code = "from counters.airflow.celery_local import CELERY_CONFIG as c; print(c['broker_url'])"
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )


def test_config_puts_broker_and_results_in_the_folder_and_keeps_the_provider_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COUNTERS_CELERY_DIR", str(tmp_path / "at-import"))
    from counters.airflow.celery_local import filesystem_config

    config = filesystem_config({"task_acks_late": True, "broker_url": "redis://x"}, tmp_path)
    assert config["task_acks_late"] is True
    assert config["broker_url"] == "filesystem://"
    options = config["broker_transport_options"]
    assert options["data_folder_in"] == options["data_folder_out"] == str(tmp_path / "queue")
    assert options["control_folder"] == str(tmp_path / "control")
    assert config["result_backend"] == f"file://{tmp_path / 'results'}"


def test_import_creates_the_folders(tmp_path: Path) -> None:
    done = _import({**os.environ, "COUNTERS_CELERY_DIR": str(tmp_path / "celery")})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("filesystem://")
    assert sorted(p.name for p in (tmp_path / "celery").iterdir()) == [
        "control",
        "queue",
        "results",
    ]


def test_import_without_the_folder_names_the_variable() -> None:
    env = {k: v for k, v in os.environ.items() if k != "COUNTERS_CELERY_DIR"}
    done = _import(env)
    assert done.returncode != 0
    assert "COUNTERS_CELERY_DIR is not set" in done.stderr
