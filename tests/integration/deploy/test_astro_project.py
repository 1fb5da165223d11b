"""The project deploys the way a platform installs a package: Airflow from the image, then
``pip install -r requirements.txt`` under that Airflow's constraints file, then the package itself
(the Dockerfile's ``pip install --no-deps``; on MWAA its wheel), and the DAG files arrive on their
own, in a DAG bundle folder apart from the rest of the project (an Astro DAG-only deploy,
git-sync, an Airflow 3 bundle).

Once per session: a clean virtual environment (``python3.12``, the Dockerfile's runtime Python,
where the machine has it; else this interpreter, which the session's summary then warns of)
gets ``apache-airflow`` at the pin of requirements-dev.txt (what the image carries;
``COUNTERS_DEPLOY_AIRFLOW`` names another supported one), then requirements.txt (what the
image's ONBUILD step installs; pip's cache in ``.cache/pip``), both under the stand-in for that
Airflow's own constraints file for that Python (``airflow-constraints/``,
scripts/airflow_constraints.py) with the project's overrides (``make mwaa``'s), not under the
project's lock; then the project as a package (not editable).
A bundle folder gets only ``dags/*.py`` and the families YAML (the demo families, moved to a
throw-away keyspace) as ``counter_families.yaml``; ``AIRFLOW_HOME`` is empty otherwise: no
``plugins/``, no ``include/``.

Then, in that environment only: no DAG import errors, every family's DAG listed from the
bundle, the plugin loaded from the package's entry point, a demo family's DAG run (``airflow
dags test``) folding rows on the real node, and ``counterctl`` (``--conn-id``: the Airflow
connection).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from counters.client import CounterClient, Increment
from counters.config import load_catalog
from counters.connection import Connection, ConnectionSettings
from counters.core import utc_aware
from counters.store import Store

from .conftest import DEPLOY_PYTHON

pytestmark = [pytest.mark.integration, pytest.mark.airflow]

PROJECT = Path(__file__).resolve().parents[3]
WORK = PROJECT / "var" / "deploy-test"
PIP_CACHE = Path(os.environ.get("PIP_CACHE_DIR") or PROJECT / ".cache" / "pip")
"""The cache ``make setup`` fills (scripts/env.sh sets ``PIP_CACHE_DIR``)."""
CONSTRAINTS = Path(__file__).resolve().parent / "airflow-constraints"
INSTALL_TIMEOUT_S = 900
CLI_TIMEOUT_S = 300
T = TypeVar("T")


def airflow_pin() -> str:
    """The Airflow the project is tested with (requirements-dev.txt), as the image carries it."""
    text = (PROJECT / "requirements-dev.txt").read_text()
    match = re.search(r"^apache-airflow==(\S+)$", text, re.MULTILINE)
    assert match, "requirements-dev.txt pins no apache-airflow"
    return match.group(1)


def deploy_airflow() -> str:
    """The Airflow the venv gets: ``COUNTERS_DEPLOY_AIRFLOW`` (a supported one: it has a
    constraints stand-in), else the pin of requirements-dev.txt."""
    return os.environ.get("COUNTERS_DEPLOY_AIRFLOW") or airflow_pin()


def platform_constraints(airflow: str, python_version: str) -> Path:
    """That Airflow's constraints file for that Python (its stand-in) with the project's
    overrides: what ``make mwaa`` ships and the Helm image installs under."""
    major_minor = ".".join(python_version.split(".")[:2])
    stand_in = CONSTRAINTS / f"constraints-{airflow}" / f"constraints-{major_minor}.txt"
    assert stand_in.is_file(), f"Airflow {airflow} on Python {major_minor}: no {stand_in}"
    done = run(
        [
            sys.executable,
            str(PROJECT / "scripts" / "airflow_constraints.py"),
            "overlay",
            str(stand_in),
            major_minor,
        ],
        dict(os.environ),
    )
    merged = WORK / "constraints.txt"
    merged.write_text(done.stdout)
    return merged


def pip_version() -> str:
    match = re.search(r'^PIP_VERSION="([^"]+)"', (PROJECT / "scripts" / "env.sh").read_text(), re.M)
    assert match
    return match.group(1)


def image_python() -> str:
    """The runtime image's Python, ``major.minor``, from the Dockerfile's ``FROM`` tag."""
    dockerfile = (PROJECT / "Dockerfile").read_text()
    match = re.search(r"^FROM \S+-python-(\d+\.\d+)\s*$", dockerfile, re.M)
    assert match, "the Dockerfile's FROM names no runtime image Python"
    return match.group(1)


def base_python() -> str:
    """The runtime image's Python (the Dockerfile's tag) when the machine has one that runs
    (on the PATH, or installed by pyenv: its shim may name a version that is not selected);
    else this interpreter. ``COUNTERS_DEPLOY_PYTHON`` picks another. Which one the venv got,
    and whether it is the image's, is said at the end of the session (``deploy_venv``)."""
    wanted = image_python()
    pyenv = sorted(Path.home().glob(f".pyenv/versions/{wanted}*/bin/python{wanted}"), reverse=True)
    named = os.environ.get("COUNTERS_DEPLOY_PYTHON")
    for candidate in (named, f"python{wanted}", *map(str, pyenv)):
        if not candidate or not shutil.which(candidate):
            continue
        probe = subprocess.run(
            [candidate, "-c", "import sys, venv; print(sys.executable)"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if probe.returncode == 0:
            return probe.stdout.strip()
    return sys.executable


def cli_json(stdout: str) -> Any:
    """The JSON line of an ``airflow ... -o json`` output. Airflow 3.3.0 (with the alembic its
    constraints pin) also logs alembic's plugin set-up to stdout, before it."""
    lines = [x for x in stdout.splitlines() if x.startswith(("[", "{"))]
    return json.loads(lines[-1] if lines else "[]")


def _pins(text: str) -> dict[str, str]:
    found = re.findall(r"^([A-Za-z0-9_.\-]+)==(\S+)$", text, re.M)
    return {name.lower().replace("_", "-"): version for name, version in found}


def run(args: list[str], env: dict[str, str], timeout: float = CLI_TIMEOUT_S, check: bool = True):
    started = time.monotonic()
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout)
    took = time.monotonic() - started
    print(f"[deploy] {' '.join(Path(a).name for a in args[:4])}: {took:.1f} s", file=sys.stderr)
    if check:
        assert done.returncode == 0, f"{' '.join(args[:4])}: {done.stdout}\n{done.stderr}"
    return done


def clean_env(**extra: str) -> dict[str, str]:
    """Nothing of the project's own environment (its AIRFLOW_*, COUNTERS_*, PYTHONPATH)."""
    keep = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "PIP_CERT", "PIP_FIND_LINKS")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env["PYTHONWARNINGS"] = "ignore"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env.update(extra)
    return env


@dataclass
class DeployVenv:
    path: Path
    python_version: str

    @property
    def bin(self) -> Path:
        return self.path / "bin"

    def pip(self, *args: str) -> subprocess.CompletedProcess[str]:
        return run(
            [str(self.bin / "python"), "-m", "pip", "--cache-dir", str(PIP_CACHE), *args],
            clean_env(),
            timeout=INSTALL_TIMEOUT_S,
        )

    def installed(self) -> dict[str, str]:
        frozen = self.pip("list", "--format", "json").stdout
        return {p["name"].lower(): p["version"] for p in json.loads(frozen)}


@pytest.fixture(scope="session")
def deploy_venv(project_wheel: Path, request: pytest.FixtureRequest) -> Iterator[DeployVenv]:
    """Built once per session, from nothing: the image's Airflow, then requirements.txt. The
    session's summary says on which Python, and warns when it is not the image's."""
    path = WORK / "venv"
    shutil.rmtree(path, ignore_errors=True)
    WORK.mkdir(parents=True, exist_ok=True)
    python = base_python()
    # no ensurepip (its bundled pip would be replaced at once): pip at the pin is installed
    # into the venv by this session's pip (the same pin, scripts/env.sh), run for its Python
    run([python, "-m", "venv", "--without-pip", str(path)], clean_env(), timeout=120)
    version = run([str(path / "bin" / "python"), "--version"], clean_env()).stdout.split()[-1]
    wanted = image_python()
    said = f"the deploy venv ran on Python {version} ({python})"
    if version.split(".")[:2] != wanted.split("."):
        said = (
            f"WARNING: {said}, not on the runtime image's Python {wanted} (the Dockerfile's): "
            f"no python{wanted} here; COUNTERS_DEPLOY_PYTHON names one"
        )
        warnings.warn(said, stacklevel=1)
    request.config.stash[DEPLOY_PYTHON] = said
    venv = DeployVenv(path, version)
    run(
        [sys.executable, "-m", "pip", "--python", str(venv.bin / "python"), "--cache-dir",
         str(PIP_CACHE), "install", "-q", f"pip=={pip_version()}"],
        clean_env(),
        timeout=INSTALL_TIMEOUT_S,
    )  # fmt: skip
    assert venv.pip("--version").stdout.startswith(f"pip {pip_version()} from {path}/")
    # A platform installs under its Airflow's constraints file (the image's, MWAA's constraints
    # line): its stand-in with the project's overrides, not the project's lock, so a floor
    # above what that Airflow pins fails here as it would there
    airflow = deploy_airflow()
    constraints = platform_constraints(airflow, version)
    platform = ("-c", str(constraints))
    venv.pip("install", "-q", f"apache-airflow=={airflow}", *platform)  # the runtime image
    core = venv.installed()["apache-airflow-core"]
    venv.pip("install", "-q", "-r", str(PROJECT / "requirements.txt"), *platform)  # ONBUILD
    installed = venv.installed()
    assert installed["apache-airflow-core"] == core == airflow, (
        "requirements.txt changed the image's Airflow"
    )
    pinned = _pins(constraints.read_text())
    for name in ("apache-airflow-providers-apache-cassandra", "cassandra-driver", "numpy"):
        assert installed[name] == pinned[name], f"{name}: not the platform's version"
    # the Dockerfile's step after ONBUILD: the project as a package, its dependencies already in
    assert "RUN pip install --no-cache-dir --no-deps /usr/local/airflow" in (
        (PROJECT / "Dockerfile").read_text()
    )
    venv.pip("install", "-q", "--no-deps", str(project_wheel))  # the project, built once
    assert venv.installed()["counters-compaction"]
    venv.pip("check")  # the package's own requirements (apache-airflow>=3.3 among them) are met
    yield venv
    shutil.rmtree(path, ignore_errors=True)


@dataclass
class BundleHome:
    """An empty ``AIRFLOW_HOME`` and, apart from it, a DAG bundle folder with the DAG files and
    the families YAML only."""

    home: Path
    bundle: Path
    venv: DeployVenv
    families_yaml: Path
    cassandra: dict[str, Any]

    def env(self, **extra: str) -> dict[str, str]:
        return clean_env(
            PATH=f"{self.venv.bin}:{os.environ['PATH']}",
            AIRFLOW_HOME=str(self.home),
            PYTHONPATH=str(self.home),  # the runtime image's PYTHONPATH (AIRFLOW_HOME)
            AIRFLOW__CORE__DAGS_FOLDER=str(self.bundle),
            AIRFLOW__CORE__LOAD_EXAMPLES="False",
            AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION="False",
            AIRFLOW_CONN_CASSANDRA_DEFAULT=json.dumps(self.cassandra),
            GX_ANALYTICS_ENABLED="false",
            COUNTERS_GX_RESULTS=str(self.home / "gx-results"),
            **extra,
        )

    def airflow(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return run([str(self.venv.bin / "airflow"), *args], self.env(), check=check)

    def counterctl(self, *args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
        return run([str(self.venv.bin / "counterctl"), *args], self.env(), check=check)


@pytest.fixture
def bundle_home(deploy_venv: DeployVenv, keyspace: str, cassandra_contact) -> Iterator[BundleHome]:
    home, bundle = WORK / "airflow", WORK / "bundle" / "dags"
    for folder in (home, bundle):
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
    for dag_file in (PROJECT / "dags").glob("*.py"):
        shutil.copy2(dag_file, bundle / dag_file.name)
    # the demo families, in the test's keyspace (so the demo keyspace stays untouched), with
    # the archive in a store's URL (a local folder is for the local dev setup only)
    doc = yaml.safe_load((PROJECT / "include" / "examples" / "counter_families.yaml").read_text())
    for entry in doc["families"]:
        entry["keyspace"] = keyspace
        if "archive" in entry:
            entry["archive"] = (WORK / "archive").as_uri()
    families_yaml = bundle / "counter_families.yaml"  # found there: no COUNTERS_CONFIG
    families_yaml.write_text(yaml.safe_dump(doc, sort_keys=False))
    hosts, port = cassandra_contact
    cassandra = {"conn_type": "cassandra", "host": ",".join(hosts), "port": port}
    yield BundleHome(home, bundle, deploy_venv, families_yaml, cassandra)
    for folder in (home, bundle, WORK / "archive"):
        shutil.rmtree(folder, ignore_errors=True)


def together(*calls: Callable[[], T]) -> list[T]:
    """The calls three at a time, each in a thread (each starts a process that mostly imports:
    two cores run two of them in the time of one, a third fills the gaps); results in order."""
    with ThreadPoolExecutor(max_workers=min(len(calls), 3)) as pool:
        return [future.result() for future in [pool.submit(call) for call in calls]]


def test_the_installed_package_runs_the_dag_files_of_a_bundle_folder(
    bundle_home: BundleHome,
) -> None:
    """Over 30 s, and why: a clean venv gets Airflow and requirements.txt from pip under the
    platform's constraints (once per session), and every check runs the installed tools as
    processes of that venv (the ``airflow`` CLI, ``counterctl``, ``python``), each importing
    Airflow. Those that do not depend on each other run two or three at a time."""
    venv = bundle_home.venv
    installed = venv.installed()
    for tool in ("pytest", "ruff", "playwright", "hypothesis"):
        assert tool not in installed, f"{tool} is a dev tool: requirements-dev.txt"
    families = load_catalog(bundle_home.families_yaml).families

    def probe(entry: Path) -> subprocess.CompletedProcess[str]:
        """The DAG file imported on its own, and where the package was imported from."""
        code = (
            f"import runpy; runpy.run_path({str(entry)!r}); "
            "import counters; print(counters.__file__)"
        )
        return run([str(venv.bin / "python"), "-c", code], bundle_home.env(), check=False)

    # what needs no metadata DB, while `db migrate` makes it: the plugin, each DAG file on
    # its own, the installed counterctl through the Airflow connection
    dag_files = sorted(bundle_home.bundle.glob("*.py"))
    plugins_out, init, *probes = together(
        lambda: bundle_home.airflow("db", "migrate"),
        lambda: bundle_home.airflow("plugins", "-o", "json"),
        lambda: bundle_home.counterctl(
            "--conn-id", "cassandra_default", "init", "--family", "trades"
        ),
        *[lambda entry=entry: probe(entry) for entry in dag_files],
    )[1:]

    # the plugin is loaded, from the package's entry point
    plugins = cli_json(plugins_out.stdout)
    ui = [p for p in plugins if p["name"] == "counter_families"]
    assert ui, plugins
    assert "counters-compaction" in ui[0]["source"], ui  # the package's entry point
    assert ui[0]["listeners"], "the pool and preload listeners are not registered"

    # each DAG file imports on its own too, the package from the venv's site-packages
    for entry, done in zip(dag_files, probes, strict=True):
        assert done.returncode == 0, f"{entry.name}: {done.stderr[-2000:]}"
        site = str(venv.path / "lib")
        assert done.stdout.strip().splitlines()[-1].startswith(site), (entry, done.stdout)

    assert init.returncode == 0, init.stdout + init.stderr
    trades = next(f for f in families if f.name == "trades")

    # every DAG file imports, every family's DAG is there (both read the migrated DB)
    errors_out, listed_out = together(
        lambda: bundle_home.airflow("dags", "list-import-errors", "-l", "-o", "json"),
        lambda: bundle_home.airflow("dags", "list", "-l", "-o", "json"),
    )
    assert cli_json(errors_out.stdout) == [], errors_out.stdout
    listed = cli_json(listed_out.stdout)
    dag_ids = {d["dag_id"] for d in listed}
    assert {f.dag_id for f in families} | {"counters_freshness"} <= dag_ids, dag_ids
    assert {d["fileloc"] for d in listed} <= {
        str(bundle_home.bundle / name)
        for name in (
            "counter_families.py",
            "counters_freshness.py",
            "counters_metadata_cleanup.py",
            "counters_example_downstream.py",
        )
    }

    # a DAG run of the demo family, against the real node
    hosts = tuple(bundle_home.cassandra["host"].split(","))
    with Connection(ConnectionSettings(hosts=hosts, port=bundle_home.cassandra["port"])) as conn:
        store = Store(conn, trades)
        client = CounterClient(conn, trades, store)
        now = datetime.now(UTC).replace(tzinfo=None, second=0, microsecond=0)
        t0 = now - timedelta(minutes=30)
        written = [
            Increment(("IBM",), i + 1, utc_aware(t0 + timedelta(minutes=i)), ("w", i))
            for i in range(10)
        ]
        client.record(written)
        logical = (now - timedelta(minutes=1)).replace(tzinfo=UTC).isoformat()
        done = bundle_home.airflow("dags", "test", trades.dag_id, logical, check=False)
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
        audit = store.audit.page(5)
        assert [(a["outcome"], a["rows_folded"], a["rows_deleted"]) for a in audit] == [
            ("success", 10, 10)
        ]
        value = client.read_many(["IBM"])[0]
        assert (value.compact_value, value.value) == (55, 55)

    read, health, missing = together(
        lambda: bundle_home.counterctl(
            "--conn-id", "cassandra_default", "read", "--family", "trades", "IBM"
        ),
        lambda: bundle_home.counterctl(
            "--conn-id", "cassandra_default", "health", "--family", "trades", "--json"
        ),
        lambda: bundle_home.counterctl("--conn-id", "no_such_conn", "health"),
    )
    assert read.returncode == 0 and read.stdout.split("\t")[:2] == ["IBM", "55"], read
    assert health.returncode == 0, health.stdout + health.stderr
    # fresh, or late (past half its limit) when the machine is slow between the run and here
    assert json.loads(health.stdout)[0]["healthy"] is True, health.stdout
    # the same CLI names a connection that does not exist, and says where it looked
    assert missing.returncode == 2
    assert "--conn-id 'no_such_conn': cannot read the Airflow connection" in missing.stderr
    assert "AIRFLOW_CONN_NO_SUCH_CONN" in missing.stderr
    core = installed["apache-airflow-core"]
    print(f"deploy venv: Python {venv.python_version}, apache-airflow-core {core}")
