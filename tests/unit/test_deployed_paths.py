"""Paths a deployment resolves: never under the installed package (site-packages) or the
process's current directory. A relative archive or results folder is the checkout's in the
local dev setup only; a relative ``COUNTERS_CONFIG`` is in the DAG folder (issue #41, item 1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from counters.archive import storage
from counters.cli import cli
from counters.config import ConfigError, config_path_in, load_catalog, local_folder
from counters.errors import ArchiveError
from counters.gx import checks, evidence

pytestmark = pytest.mark.unit

CHECKOUT = Path("/src/counters")
FAMILIES = """
families:
  - name: trades
    keyspace: ks
    raw_table: raw
    compact_table: compact
    lag: 90s
    archive: {archive}
"""


def test_a_relative_local_folder_is_the_checkouts_in_the_local_dev_setup_only() -> None:
    dev = {"COUNTERS_LOCAL_DEV": "1"}
    assert local_folder("var/archive", dev, CHECKOUT, "x") == CHECKOUT / "var/archive"
    assert local_folder("/data/archive", {}, CHECKOUT, "x") == Path("/data/archive")
    with pytest.raises(ConfigError) as refused:
        local_folder("var/archive", {"AIRFLOW_HOME": "/opt/airflow"}, CHECKOUT, "SETTING")
    assert str(refused.value) == (
        "SETTING: 'var/archive' is a relative path, used only in the local dev setup "
        "(COUNTERS_LOCAL_DEV=1); give an absolute path or a URL (e.g. 's3://bucket/prefix')"
    )


def family_archived_in(tmp_path: Path, archive: str):
    (tmp_path / "families.yaml").write_text(FAMILIES.format(archive=archive))
    return load_catalog(tmp_path / "families.yaml").get("trades")


def test_a_relative_archive_is_refused_outside_the_local_dev_setup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    family = family_archived_in(tmp_path, "var/archive")
    monkeypatch.setenv("COUNTERS_LOCAL_DEV", "1")
    assert Path(__file__).resolve().parents[2] == storage.PROJECT_ROOT  # the checkout
    root = storage.archive_root(family)
    assert str(root) == (storage.PROJECT_ROOT / "var/archive").as_uri()
    monkeypatch.delenv("COUNTERS_LOCAL_DEV")
    with pytest.raises(ArchiveError, match=r"^family 'trades': field 'archive': 'var/archive' is"):
        storage.archive_root(family)
    absolute = family_archived_in(tmp_path, str(tmp_path / "archive"))
    assert str(storage.archive_root(absolute)) == (tmp_path / "archive").as_uri()


def test_the_load_warns_that_a_relative_archives_cleanups_are_refused(tmp_path: Path) -> None:
    from counters.config import local_archive_warnings

    family = family_archived_in(tmp_path, "var/archive")
    assert local_archive_warnings([family], {}) == [
        "family 'trades': field 'archive': 'var/archive' is a relative path, used only in the "
        "local dev setup (COUNTERS_LOCAL_DEV=1): its cleanups are refused (and delete nothing); "
        "use an object store (e.g. 's3://bucket/prefix')"
    ]


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"COUNTERS_LOCAL_DEV": "1"}, CHECKOUT / "var/gx-results"),
        ({"AIRFLOW_HOME": "/opt/airflow"}, Path("/opt/airflow/gx-results")),
        ({}, Path("~/airflow/gx-results").expanduser()),
        ({"COUNTERS_GX_RESULTS": "/shared/gx"}, Path("/shared/gx")),
        ({"COUNTERS_GX_RESULTS": "gx", "COUNTERS_LOCAL_DEV": "1"}, CHECKOUT / "gx"),
    ],
)
def test_the_results_store_defaults_to_airflow_home_outside_the_local_dev_setup(
    env: dict[str, str], expected: Path
) -> None:
    assert evidence.results_location(None, env, CHECKOUT) == expected.as_uri()


def test_a_relative_results_store_is_refused_outside_the_local_dev_setup() -> None:
    env = {"COUNTERS_GX_RESULTS": "var/gx-results", "AIRFLOW_HOME": "/opt/airflow"}
    with pytest.raises(evidence.EvidenceConfigError, match=r"^COUNTERS_GX_RESULTS: 'var/gx-res"):
        evidence.results_location(None, env, CHECKOUT)
    url = {"COUNTERS_GX_RESULTS": "s3://bucket/gx"}
    assert evidence.results_location(None, url, CHECKOUT) == "s3://bucket/gx"
    assert not evidence.results_location(None, {}, checks.PROJECT_ROOT).startswith(
        checks.PROJECT_ROOT.as_uri()
    )


@pytest.mark.parametrize(
    ("explicit", "env", "expected"),
    [
        (
            None,
            {"COUNTERS_CONFIG": "families/f.yaml", "AIRFLOW__CORE__DAGS_FOLDER": "/bundle"},
            "/bundle/families/f.yaml",
        ),
        (
            None,
            {"COUNTERS_CONFIG": "f.yaml", "AIRFLOW_HOME": "/opt/airflow"},
            "/opt/airflow/dags/f.yaml",
        ),
        (
            None,
            {"COUNTERS_CONFIG": "/etc/f.yaml", "AIRFLOW__CORE__DAGS_FOLDER": "/bundle"},
            "/etc/f.yaml",
        ),
        ("mine.yaml", {"COUNTERS_CONFIG": "f.yaml"}, "mine.yaml"),  # --config: the shell's cwd
        (None, {"AIRFLOW__CORE__DAGS_FOLDER": "/bundle"}, "/bundle/counter_families.yaml"),
    ],
)
def test_a_relative_counters_config_is_in_the_dag_folder(
    explicit: str | None, env: dict[str, str], expected: str
) -> None:
    assert config_path_in(explicit, env) == Path(expected)


def test_counterctl_reads_a_relative_counters_config_from_the_dag_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle, elsewhere = tmp_path / "bundle", tmp_path / "cwd"
    for folder in (bundle / "conf", elsewhere / "conf"):
        folder.mkdir(parents=True)
    (bundle / "conf" / "f.yaml").write_text(FAMILIES.format(archive="s3://b/a"))
    (elsewhere / "conf" / "f.yaml").write_text(
        FAMILIES.replace("trades", "wrong").format(archive="s3://b/a")
    )
    monkeypatch.chdir(elsewhere)
    env = {"COUNTERS_CONFIG": "conf/f.yaml", "AIRFLOW__CORE__DAGS_FOLDER": str(bundle)}
    result = CliRunner().invoke(cli, ["families", "--json"], env=env)
    assert result.exit_code == 0, result.output
    assert [f["name"] for f in json.loads(result.output)] == ["trades"]
