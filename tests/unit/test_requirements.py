"""What a deployment installs names ranges for what platforms ship; development installs the
lock; the two agree (every requirement's locked version is inside its range)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
SHIPPED_BY_PLATFORMS = {"click", "numpy", "pyarrow", "statsd"}
"""Libraries Astro Runtime, the official image or MWAA's constraints carry in their own version
(the Airflow providers too): an exact pin would fight the platform's resolver."""


def requirements(name: str) -> list[Requirement]:
    lines = (ROOT / name).read_text().splitlines()
    return [Requirement(line) for line in lines if line.strip() and not line.startswith(("#", "-"))]


def locked() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "requirements-lock.txt").read_text().splitlines():
        match = re.fullmatch(r"([A-Za-z0-9_.\-]+)==(\S+)", line.strip())
        if match:
            pins[canonicalize_name(match[1])] = match[2]
    return pins


def test_a_deployment_gets_ranges_for_what_the_platform_ships_and_no_airflow() -> None:
    deployed = requirements("requirements.txt")
    names = {canonicalize_name(r.name) for r in deployed}
    assert "apache-airflow" not in names and "apache-airflow-core" not in names
    for requirement in deployed:
        shipped = requirement.name in SHIPPED_BY_PLATFORMS or requirement.name.startswith(
            "apache-airflow-providers-"
        )
        exact = any(spec.operator in ("==", "===") for spec in requirement.specifier)
        assert not (shipped and exact), f"requirements.txt pins {requirement} exactly"
        assert requirement.specifier, f"requirements.txt: {requirement.name} has no range"


@pytest.mark.parametrize("name", ["requirements.txt", "requirements-dev.txt"])
def test_every_requirement_is_locked_inside_its_range(name: str) -> None:
    pins = locked()
    for requirement in requirements(name):
        version = pins.get(canonicalize_name(requirement.name))
        assert version is not None, f"{name}: {requirement.name} is not in requirements-lock.txt"
        assert requirement.specifier.contains(version, prereleases=True), (
            f"{name}: {requirement} does not admit the locked {requirement.name}=={version}"
        )


def test_the_lock_is_what_setup_installs_and_hashes() -> None:
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert "-c requirements-lock.txt" in setup
    assert "requirements-lock.txt | sha256sum" in setup  # a changed lock reinstalls


def test_the_package_declares_the_ranges_a_deployment_installs() -> None:
    """pyproject's dependencies are requirements.txt's lines: installing the package (a wheel
    on MWAA, ``pip install .`` in an image) resolves what requirements.txt does."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = sorted(str(Requirement(line)) for line in project["dependencies"])
    assert declared == sorted(str(r) for r in requirements("requirements.txt"))
    plugins = project["entry-points"]["airflow.plugins"]
    assert plugins == {"counter_families": "counters.airflow.plugin:CounterFamiliesPlugin"}
