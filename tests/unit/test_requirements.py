"""What a deployment installs names ranges for what platforms ship; development installs the
lock; the two agree (every requirement's locked version is inside its range)."""

from __future__ import annotations

import importlib.util
import re
import tomllib
from pathlib import Path
from types import ModuleType

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PLATFORM_CONSTRAINTS = ROOT / "tests" / "integration" / "deploy" / "airflow-constraints"
"""Stand-ins for every supported Airflow's constraints files (scripts/airflow_constraints.py)."""
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
    """pyproject's dependencies are requirements.txt's lines and Airflow's floor, as a
    provider's are: installing the package (a wheel on MWAA, ``pip install .`` in an image)
    resolves what requirements.txt does, and refuses an Airflow older than 3.3."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = sorted(str(Requirement(line)) for line in project["dependencies"])
    airflow = "apache-airflow>=3.3.0"  # the floor only: the platform brings Airflow
    assert declared == sorted([airflow, *(str(r) for r in requirements("requirements.txt"))])
    plugins = project["entry-points"]["airflow.plugins"]
    assert plugins == {"counter_families": "counters.airflow.plugin:CounterFamiliesPlugin"}


def constraints_script() -> ModuleType:
    """scripts/airflow_constraints.py (the supported versions, the overlay)."""
    spec = importlib.util.spec_from_file_location(
        "airflow_constraints", ROOT / "scripts" / "airflow_constraints.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pins(path: Path) -> dict[str, str]:
    found = {}
    for line in path.read_text().splitlines():
        match = re.fullmatch(r"([A-Za-z0-9_.\-]+)==(\S+)", line.strip())
        if match:
            found[canonicalize_name(match[1])] = match[2]
    return found


def platform_constraints() -> dict[tuple[str, str], dict[str, str]]:
    """(Airflow, Python) -> the pins of that Airflow's constraints file (its stand-in)."""
    found = {}
    for path in sorted(PLATFORM_CONSTRAINTS.glob("constraints-*/constraints-*.txt")):
        airflow = path.parent.name.removeprefix("constraints-")
        found[(airflow, path.stem.removeprefix("constraints-"))] = pins(path)
    return found


def test_every_supported_airflow_has_its_constraints_for_every_python() -> None:
    """One stand-in per supported Airflow (docs/deploy.md's matrix) and Python, each pinning
    that Airflow."""
    module = constraints_script()
    found = platform_constraints()
    assert set(found) == {(a, p) for a in module.RELEASED for p in module.PYTHONS}
    for (airflow, _python), pinned in found.items():
        assert pinned["apache-airflow-core"] == airflow
    deploy = (ROOT / "docs" / "deploy.md").read_text()
    for airflow in module.RELEASED:
        assert airflow in deploy, f"docs/deploy.md's support matrix does not name {airflow}"


def test_requirements_install_under_every_supported_airflows_constraints() -> None:
    """Each range admits what every supported Airflow's constraints file pins: a platform
    installs requirements.txt under that file (MWAA always does), and a floor above its pin is
    ResolutionImpossible there (provider floors at the newest releases, after Airflow 3.3.2's,
    were)."""
    for (airflow, python), pinned in platform_constraints().items():
        for requirement in requirements("requirements.txt"):
            version = pinned.get(canonicalize_name(requirement.name))
            if version is None:
                continue  # not one the platform pins (great-expectations): pip picks
            assert requirement.specifier.contains(version, prereleases=True), (
                f"requirements.txt's {requirement} does not admit {requirement.name}=={version}, "
                f"which Airflow {airflow}'s constraints-{python}.txt pins"
            )


def test_each_floor_is_the_oldest_version_a_supported_airflow_pins() -> None:
    """A floor lower than every supported platform's pin names versions nothing tests; so each
    shared requirement's floor is the oldest pin among the supported constraints files."""
    oldest: dict[str, Version] = {}
    for pinned in platform_constraints().values():
        for name, version in pinned.items():
            if name not in oldest or Version(version) < oldest[name]:
                oldest[name] = Version(version)
    shared = 0
    for requirement in requirements("requirements.txt"):
        name = canonicalize_name(requirement.name)
        if name not in oldest:
            continue
        shared += 1
        floors = [Version(s.version) for s in requirement.specifier if s.operator == ">="]
        assert floors == [oldest[name]], (
            f"requirements.txt's {requirement}: the floor must be {oldest[name]}, the oldest "
            "version a supported Airflow's constraints pin"
        )
    assert shared >= 9  # the four providers, the driver, click, numpy, pyarrow, statsd


def test_the_overlay_keeps_airflows_pins_and_overrides_only_what_a_range_excludes() -> None:
    """``make mwaa``'s constraints file (and the deploy test's): Airflow's lines, a pin that a
    range excludes replaced by the tested version (MWAA's documented override), and the tested
    versions of what Airflow's file leaves open."""
    module = constraints_script()
    airflow = "# header\nclick==8.4.2\napache-airflow-providers-smtp==3.0.1\nnumpy==2.4.6\n"
    ranges = [Requirement("apache-airflow-providers-smtp>=3.2,<4"), Requirement("click>=8.1")]
    lock = {"apache-airflow-providers-smtp": "3.2.0", "click": "8.5.1", "altair": "6.3.0"}
    lines, overrides, additions = module.overlay(
        airflow, ranges, lock, {"altair", "click", "apache-airflow-providers-smtp", "nolock"}
    )
    assert lines == [
        "# header",
        "click==8.4.2",
        "apache-airflow-providers-smtp==3.2.0",
        "numpy==2.4.6",
    ]
    assert overrides == {"apache-airflow-providers-smtp": "3.2.0"}
    assert additions == {"altair": "6.3.0"}
