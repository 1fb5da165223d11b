"""mypy over include/counters is clean (issue #36): `make lint` runs it, and this test holds it
under `make test`, which is what CI runs. The configuration is pyproject.toml's [tool.mypy]; its
cache is var/mypy_cache, so a second run rechecks only what changed."""

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def test_mypy_finds_no_error_in_the_package() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, (
        f"mypy over include/counters (exit {result.returncode}; `make lint` runs the same):\n"
        f"{result.stdout}{result.stderr}"
    )
    assert "no issues found in" in result.stdout, result.stdout
