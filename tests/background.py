"""A check that runs in its own process from the start of the test session, while the other
tests run, and that its test only waits for: mypy over the package (a minute of CPU on the cold
cache of a fresh clone, mostly spent while other tests wait on the node or on Airflow)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MYPY = (sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"))
"""`make lint`'s mypy (pyproject.toml's [tool.mypy], its cache in var/mypy_cache)."""
NICENESS = 10
"""Below the tests' priority: it takes the CPU they leave, and delays none of them."""


@dataclass
class Background:
    """A command started now, its output in files of a temporary folder; ``result`` waits for
    it."""

    args: tuple[str, ...]
    folder: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="background-")))
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Background:
        with open(self.folder / "stdout", "wb") as out, open(self.folder / "stderr", "wb") as err:
            self.proc = subprocess.Popen(
                self.args,
                cwd=ROOT,
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                preexec_fn=lambda: os.nice(NICENESS),
            )
        return self

    def result(self, timeout_s: float) -> subprocess.CompletedProcess[str]:
        """The finished command: its exit code and output (waits up to ``timeout_s``)."""
        assert self.proc is not None
        returncode = self.proc.wait(timeout_s)
        return subprocess.CompletedProcess(
            self.args,
            returncode,
            (self.folder / "stdout").read_text(errors="replace"),
            (self.folder / "stderr").read_text(errors="replace"),
        )

    def stop(self) -> None:
        """At the session's end: killed if its test never waited for it (deselected, -x)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        shutil.rmtree(self.folder, ignore_errors=True)
