"""What the deploy tests share: the project's wheel, built once per session (``scripts/package.sh
wheel``: an isolated build with pip, as ``make mwaa`` and ``make helm`` build it) for the
platform bundles and the clean venv."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[3]
DEPLOY_PYTHON = pytest.StashKey[str]()
"""Set by ``deploy_venv``: which Python the deploy venv ran on, and whether it is the image's."""


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The deploy venv's Python, at the end of every session that built it: a fallback to
    another Python than the runtime image's is said where everyone reads, not only among
    the warnings."""
    said = terminalreporter.config.stash.get(DEPLOY_PYTHON, None)
    if said:
        terminalreporter.write_line(said, yellow=said.startswith("WARNING"))


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
