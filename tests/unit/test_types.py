"""mypy over include/counters is clean (issue #36): `make lint` runs it, and this test holds it
under `make test`, which is what CI runs. The configuration is pyproject.toml's [tool.mypy]; its
cache is var/mypy_cache, so a second run rechecks only what changed. mypy starts in the
background when the session starts (tests/background.py); this test waits for its result."""

import subprocess

import pytest

pytestmark = pytest.mark.unit


def test_mypy_finds_no_error_in_the_package(
    mypy_result: subprocess.CompletedProcess[str],
) -> None:
    result = mypy_result
    assert result.returncode == 0, (
        f"mypy over include/counters (exit {result.returncode}; `make lint` runs the same):\n"
        f"{result.stdout}{result.stderr}"
    )
    assert "no issues found in" in result.stdout, result.stdout
