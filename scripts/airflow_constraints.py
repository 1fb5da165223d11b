"""Airflow's constraints files: their stand-ins for the deploy test, and the file a deployment
installs under (Airflow's, with the project's overrides).

``build``: stand-ins for Airflow's own constraints files, one per supported Airflow and Python
version, for the deploy test (tests/integration/deploy/airflow-constraints/).

A platform installs requirements.txt under the constraints file of its Airflow version
(``constraints-<airflow>/constraints-<python>.txt`` on Airflow's GitHub; MWAA, the official
image, Astro Runtime): the newest version of every provider and shared library that resolved
together when that Airflow was released. That file is not reachable from the machine this
project is developed on, so this script rebuilds its like: pip's resolver over Airflow, the
providers the project and the platforms use and the libraries they share, taking only what was
uploaded to PyPI before that Airflow was (``--uploaded-prior-to``). The result pins more or less
than the real file (it resolves a few providers, not all of them), but it pins what the
project's ranges meet: the providers, the driver, click, numpy, pyarrow, pandas, statsd.

    .venv/bin/python scripts/airflow_constraints.py build [AIRFLOW_VERSION ...]

Needs ``python3.11`` and ``python3.12`` (a throw-away venv of each, pip at scripts/env.sh's
version) and PyPI. Rewrites the files of the given (default: every supported) version.

``overlay AIRFLOW_CONSTRAINTS_FILE PYTHON``: that file with the project's overrides, what MWAA
documents for a requirement its constraints file does not admit (and what the Helm image and the
deploy test install under). Every line of Airflow's file stays, except a pin that a range of
requirements.txt excludes, which becomes requirements-lock.txt's version (none today: the unit
tests keep the floors at or below every supported Airflow's pins); then requirements-lock.txt's
versions of what requirements.txt brings that Airflow's file leaves open (Great Expectations
and its own dependencies), so a deployment installs the versions tested. Run with the
project's venv (the lock installed): the dependency tree is read from it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "integration" / "deploy" / "airflow-constraints"

RELEASED = {
    "3.3.0": "2026-07-06T13:57:00Z",
    "3.3.1": "2026-08-12T08:11:00Z",
    "3.3.2": "2026-09-17T08:41:00Z",
}
"""Every supported Airflow (>= 3.3: docs/deploy.md) and when PyPI had all of it: a minute after
the upload of its last distribution (apache-airflow, -core and -task-sdk go up within a minute
or two; the task SDK's is the last), read from PyPI's release pages."""

PYTHONS = ("3.11", "3.12")
"""The Pythons the project supports (docs/deploy.md)."""

RESOLVED = (
    "apache-airflow[statsd]",
    "apache-airflow-providers-apache-cassandra",
    "apache-airflow-providers-smtp",
    "apache-airflow-providers-slack",
    "apache-airflow-providers-http",
    "apache-airflow-providers-openlineage",
    "apache-airflow-providers-celery",
    "cassandra-driver",
    "pandas",
    "pyarrow",
    "numpy",
    "click",
)
"""What the stand-in resolves with Airflow: the providers the project uses, OpenLineage and
Celery (which Astro Runtime and the official image carry), and the libraries requirements.txt
shares with Airflow's constraints (the real file pins them, through its other providers)."""


def pip_version() -> str:
    match = re.search(r'^PIP_VERSION="([^"]+)"', (ROOT / "scripts" / "env.sh").read_text(), re.M)
    if not match:
        raise SystemExit("scripts/env.sh sets no PIP_VERSION")
    return match[1]


def interpreter(python: str) -> str:
    """``python<version>`` where it runs, else pyenv's install of that version (its shim
    names versions that are not selected)."""
    pyenv = sorted(Path.home().glob(f".pyenv/versions/{python}*/bin/python{python}"), reverse=True)
    for candidate in (f"python{python}", *map(str, pyenv)):
        if (
            shutil.which(candidate)
            and subprocess.run([candidate, "-c", "import venv"], capture_output=True).returncode
            == 0
        ):
            return candidate
    raise SystemExit(f"no working python{python} on this machine")


def resolve(airflow: str, python: str, workdir: Path) -> list[tuple[str, str]]:
    """Every distribution pip would install with Airflow ``airflow`` on ``python``, taking only
    what PyPI had when that Airflow was released."""
    venv = workdir / f"venv{python}"
    if not venv.exists():
        subprocess.run([interpreter(python), "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
        subprocess.run([*pip, f"pip=={pip_version()}"], check=True)
    report = workdir / f"report-{airflow}-{python}.json"
    wanted = [RESOLVED[0].replace("]", f"]=={airflow}"), *RESOLVED[1:]]
    subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--dry-run",
            "--ignore-installed",
            "--uploaded-prior-to",
            RELEASED[airflow],
            "--report",
            str(report),
            *wanted,
        ],
        check=True,
    )
    installed = json.loads(report.read_text())["install"]
    pins = {(i["metadata"]["name"].lower(), i["metadata"]["version"]) for i in installed}
    return sorted(pins)


def write(airflow: str, python: str, pins: list[tuple[str, str]]) -> Path:
    path = OUT / f"constraints-{airflow}" / f"constraints-{python}.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    header = [
        f"# A stand-in for Airflow {airflow}'s constraints-{python}.txt "
        "(scripts/airflow_constraints.py build):",
        f"# pip's resolution of {', '.join(RESOLVED)}",
        f"# with apache-airflow=={airflow}, from what PyPI had before {RELEASED[airflow]} "
        "(its release).",
    ]
    path.write_text("\n".join([*header, *(f"{n}=={v}" for n, v in pins)]) + "\n")
    return path


def read_pins(text: str) -> dict[str, str]:
    """``name==version`` lines (canonical names) of a requirements or constraints text."""
    from packaging.utils import canonicalize_name

    pins = {}
    for line in text.splitlines():
        match = re.fullmatch(r"([A-Za-z0-9_.\-]+)\s*==\s*([^\s;#]+).*", line.strip())
        if match:
            pins[canonicalize_name(match[1])] = match[2]
    return pins


def read_ranges(text: str) -> list[Any]:
    """The requirements of a requirements.txt text (no options, no comments)."""
    from packaging.requirements import Requirement

    lines = [line.split("#")[0].strip() for line in text.splitlines()]
    return [Requirement(line) for line in lines if line and not line.startswith("-")]


def closure(roots: list[Any], python: str) -> set[str]:
    """Pure over this environment's metadata: the canonical names of ``roots`` and everything
    they depend on, with markers evaluated for ``python`` (what a platform on that Python
    installs for them)."""
    import importlib.metadata as metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    environment = {"python_version": python, "python_full_version": f"{python}.0", "extra": ""}
    seen: set[str] = set()
    todo = [(canonicalize_name(r.name), tuple(sorted(r.extras))) for r in roots]
    while todo:
        name, extras = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue  # not installed here (needed on another platform only): left open
        for text in requires:
            requirement = Requirement(text)
            marker = requirement.marker
            wanted = marker is None or any(
                marker.evaluate({**environment, "extra": extra}) for extra in ("", *extras)
            )
            if wanted:
                todo.append((canonicalize_name(requirement.name), tuple(requirement.extras)))
    return seen


def overlay(
    airflow_text: str, ranges: list[Any], lock: dict[str, str], deployed: set[str]
) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """Pure: Airflow's constraints lines with the project's overrides, the overrides (name ->
    the lock's version, for a pin a range excludes) and the additions (name -> the lock's
    version, for what ``deployed`` holds and Airflow's file leaves open)."""
    from packaging.utils import canonicalize_name

    by_name = {canonicalize_name(r.name): r for r in ranges}
    pinned = read_pins(airflow_text)
    overrides = {}
    for name, version in pinned.items():
        requirement = by_name.get(name)
        if requirement is not None and not requirement.specifier.contains(version, True):
            if name not in lock:
                raise SystemExit(f"{requirement} excludes {name}=={version}, and the lock has none")
            overrides[name] = lock[name]
    lines = []
    for line in airflow_text.splitlines():
        name = next(iter(read_pins(line)), None)
        lines.append(f"{name}=={overrides[name]}" if name in overrides else line)
    additions = {n: lock[n] for n in sorted(deployed) if n not in pinned and n in lock}
    return lines, overrides, additions


def overlay_main(airflow_file: str, python: str) -> None:
    airflow_text = Path(airflow_file).read_text()
    ranges = read_ranges((ROOT / "requirements.txt").read_text())
    lock = read_pins((ROOT / "requirements-lock.txt").read_text())
    lines, overrides, additions = overlay(airflow_text, ranges, lock, closure(ranges, python))
    print("\n".join(lines))
    print("# --- counters-compaction's overrides (scripts/airflow_constraints.py overlay) ---")
    print(
        "# Pins above that requirements.txt's ranges exclude, now the tested version: "
        + (", ".join(f"{n}=={v}" for n, v in overrides.items()) or "none")
    )
    print("# What requirements.txt brings that Airflow's file leaves open, at the tested versions:")
    for name, version in additions.items():
        print(f"{name}=={version}")


def main(argv: list[str]) -> None:
    if argv[:1] == ["overlay"] and len(argv) == 3:
        overlay_main(argv[1], argv[2])
        return
    if argv[:1] != ["build"]:
        raise SystemExit(__doc__)
    versions = argv[1:] or list(RELEASED)
    unknown = [v for v in versions if v not in RELEASED]
    if unknown:
        raise SystemExit(
            f"not a supported Airflow version: {unknown} (supported: {list(RELEASED)})"
        )
    with tempfile.TemporaryDirectory(prefix="airflow-constraints-") as tmp:
        for airflow in versions:
            for python in PYTHONS:
                path = write(airflow, python, resolve(airflow, python, Path(tmp)))
                print(path.relative_to(ROOT))


if __name__ == "__main__":
    main(sys.argv[1:])
