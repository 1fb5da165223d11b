"""What the deploy tests share: the project's wheel, built once per session (``scripts/package.sh
wheel``: an isolated build with pip, as ``make mwaa`` and ``make helm`` build it) for the
platform bundles and the clean venv."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def project_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package's wheel, kept in the session's tmp dir."""
    done = subprocess.run(
        [str(PROJECT / "scripts" / "package.sh"), "wheel"],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    [built] = (PROJECT / "dist" / "wheel").glob("counters_compaction-*.whl")
    kept = tmp_path_factory.mktemp("wheel") / built.name
    shutil.copy2(built, kept)
    return kept
