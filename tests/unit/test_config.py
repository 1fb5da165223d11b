"""Loading and validating the families file."""

from datetime import timedelta
from pathlib import Path

import pytest
from counters.config import (
    ConfigError,
    Kind,
    Retention,
    default_config_path,
    load_catalog,
    load_families_leniently,
    local_archive_warnings,
    parse_duration,
)

pytestmark = pytest.mark.unit
EXAMPLE_FAMILIES = Path(__file__).resolve().parents[2] / "include/examples/counter_families.yaml"

GOOD = """
families:
  - name: trades
    keyspace: ks
    raw_table: raw
    compact_table: compact
    lag: 90s
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "families.yaml"
    path.write_text(text)
    return path


def test_shipped_file_loads():
    catalog = load_catalog(EXAMPLE_FAMILIES)
    assert catalog.names


def test_defaults(tmp_path):
    family = load_catalog(write(tmp_path, GOOD)).get("trades")
    assert family.lag == timedelta(seconds=90)
    assert family.schedule == "* * * * *"
    assert family.kind is Kind.INCREMENTS
    assert family.effective_retention is Retention.DELETE
    assert family.columns.key == ("type",)
    assert family.columns.time == "modify_time"
    assert family.dag_id == "compact_trades"


def test_env_var_selects_file(tmp_path, monkeypatch):
    monkeypatch.setenv("COUNTERS_CONFIG", str(write(tmp_path, GOOD)))
    assert load_catalog().names == ["trades"]


def test_without_counters_config_the_families_file_is_in_the_dag_folder(tmp_path, monkeypatch):
    """A DAG-only deploy ships the families: the DAG folder's counter_families.yaml."""
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "counter_families.yaml").write_text(GOOD)
    monkeypatch.delenv("COUNTERS_CONFIG", raising=False)
    monkeypatch.setenv("AIRFLOW__CORE__DAGS_FOLDER", str(bundle))
    catalog = load_catalog()
    assert (catalog.path, catalog.names) == (bundle / "counter_families.yaml", ["trades"])
    home = {"AIRFLOW_HOME": "/opt/airflow"}
    assert default_config_path(home) == Path("/opt/airflow/dags/counter_families.yaml")


ARCHIVED = GOOD + "    archive: {archive}\n"


@pytest.mark.parametrize(
    ("archive", "env", "warned"),
    [
        ("/data/archive", {}, True),
        ("file:///data/archive", {}, True),
        ("var/archive", {"COUNTERS_LOCAL_DEV": "1"}, False),  # make run, make test
        ("s3://bucket/counters", {}, False),
    ],
)
def test_a_local_folder_archive_is_warned_outside_the_local_dev_setup(
    tmp_path, archive, env, warned
):
    family = load_catalog(write(tmp_path, ARCHIVED.format(archive=archive))).get("trades")
    expected = (
        [
            f"family 'trades': field 'archive': {archive!r} is a local folder; outside the local "
            "dev setup use an object store (e.g. 's3://bucket/prefix'): the rows a cleanup "
            "deletes are kept only there"
        ]
        if warned
        else []
    )
    assert local_archive_warnings([family], env) == expected


def test_loading_the_file_logs_the_local_archive_warning(tmp_path, monkeypatch, caplog):
    monkeypatch.delenv("COUNTERS_LOCAL_DEV", raising=False)
    path = write(tmp_path, ARCHIVED.format(archive="var/archive"))
    load_catalog(path)
    assert f"{path}: family 'trades': field 'archive': 'var/archive' is a relative path" in (
        caplog.text
    )


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("lag: 0s", "family 'trades' (families[0]): field 'lag': lag must be > 0"),
        ("lag: soon", "field 'lag': expected a duration"),
        ("schedule: every minute", "field 'schedule': schedule must be a cron expression"),
        ("kind: gauge", "field 'kind'"),
        ("colour: red", "field 'colour': Extra inputs are not permitted"),
        ("shards: 0", "field 'shards'"),
        ("raw_table: 'x; DROP TABLE y'", "field 'raw_table'"),
    ],
)
def test_bad_field_is_named(tmp_path, text, fragment):
    key = text.split(":")[0]
    lines = [ln for ln in GOOD.splitlines() if not ln.strip().startswith(f"{key}:")]
    path = write(tmp_path, "\n".join(lines) + f"\n    {text}\n")
    with pytest.raises(ConfigError) as info:
        load_catalog(path)
    assert fragment in str(info.value)
    assert str(path) in str(info.value)


def test_malformed_yaml(tmp_path):
    with pytest.raises(ConfigError, match="malformed YAML"):
        load_catalog(write(tmp_path, "families: [\n  - name: x\n    lag: : :"))


def test_missing_families_key(tmp_path):
    with pytest.raises(ConfigError, match=r"'families:' list"):
        load_catalog(write(tmp_path, "family: {}"))


def test_unknown_family_lists_known(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown family 'nope'.*known families: trades"):
        load_catalog(write(tmp_path, GOOD)).get("nope")


def test_duplicate_names_refused(tmp_path):
    with pytest.raises(ConfigError, match="declared twice"):
        load_catalog(write(tmp_path, GOOD + GOOD.split("families:")[1]))


@pytest.mark.parametrize("kind", ["[rows]", "{rows: 1}"])
def test_a_kind_that_is_no_name_is_that_familys_error(tmp_path, kind):
    """Not a TypeError out of the kind's defaults, which would break every family's DAG."""
    with pytest.raises(ConfigError, match="kind"):
        load_catalog(write(tmp_path, GOOD + f"    kind: {kind}\n"))


def test_rows_family_cannot_delete(tmp_path):
    text = GOOD + "    kind: rows\n    retention: delete\n"
    with pytest.raises(ConfigError, match="'rows' family keeps its rows"):
        load_catalog(write(tmp_path, text))


@pytest.mark.parametrize(
    "extra",
    [
        "    retention: keep\n",
        "    kind: unique\n    columns: {member: user}\n    retention: keep\n",
    ],
)
def test_keep_is_refused_for_families_folded_row_by_row(tmp_path, extra):
    with pytest.raises(ConfigError, match="retention: 'keep' is only for 'rows' families"):
        load_catalog(write(tmp_path, GOOD + extra))


@pytest.mark.parametrize("level", ["ONE", "LOCAL_ONE"])
@pytest.mark.parametrize(
    "kind", ["", "    kind: rows\n", "    kind: unique\n    columns: {member: user}\n"]
)
def test_one_replica_consistency_is_refused_for_every_kind(tmp_path, level, kind):
    """A fold that reads one replica can miss rows another holds and move its epoch past them
    (rows families too: issue #43, item 8)."""
    with pytest.raises(ConfigError, match=f"trades.*consistency: {level} is refused") as raised:
        load_catalog(write(tmp_path, GOOD + kind + f"    consistency: {level}\n"))
    assert "consistency" in str(raised.value)


def test_sweep_interval(tmp_path):
    family = load_catalog(write(tmp_path, GOOD + "    sweep_interval: 5m\n")).get("trades")
    assert family.sweep_interval == timedelta(minutes=5)
    assert load_catalog(write(tmp_path, GOOD)).get("trades").sweep_interval == timedelta(minutes=15)
    with pytest.raises(ConfigError, match="sweep_interval must be > 0"):
        load_catalog(write(tmp_path, GOOD + "    sweep_interval: 0s\n"))


def test_sweep_offset_must_lie_within_the_interval(tmp_path):
    text = GOOD + "    sweep_interval: 1d\n    sweep_offset: 3h\n"
    assert load_catalog(write(tmp_path, text)).get("trades").sweep_offset == timedelta(hours=3)
    assert load_catalog(write(tmp_path, GOOD)).get("trades").sweep_offset is None
    with pytest.raises(ConfigError, match=r"sweep_offset must be >= 0 and shorter than"):
        load_catalog(write(tmp_path, GOOD + "    sweep_interval: 1h\n    sweep_offset: 1h\n"))


def test_unique_needs_member(tmp_path):
    with pytest.raises(ConfigError, match=r"columns\.member is required"):
        load_catalog(write(tmp_path, GOOD + "    kind: unique\n"))


def test_composite_key(tmp_path):
    text = GOOD + "    columns:\n      key: [location_id, calculation_date]\n"
    family = load_catalog(write(tmp_path, text)).get("trades")
    assert family.columns.key == ("location_id", "calculation_date")


def test_lenient_load_keeps_good_families(tmp_path):
    text = (
        GOOD
        + """  - name: broken
    keyspace: ks
    raw_table: r2
    compact_table: c2
    lag: -1m
"""
    )
    good, errors = load_families_leniently(write(tmp_path, text))
    assert [f.name for f in good] == ["trades"]
    assert list(errors) == ["broken"]
    assert "family 'broken' (families[1]): field 'lag'" in errors["broken"]


def test_a_broken_entry_keeps_its_name_keyspace_and_alerts_when_they_validate(tmp_path):
    """Issue #49 item 4: what the freshness check needs of an entry that does not load."""
    from counters.config import broken_entries

    text = (
        GOOD
        + """  - name: typo
    keyspace: ks
    raw_table: r2
    compact_table: c2
    freshnes: 10m
    alerts: {webhook_url: "http://hooks/typo"}
  - name: worse
    keyspace: "not a keyspace"
    raw_table: r3
    compact_table: c3
    alerts: {email: 5}
"""
    )
    path = write(tmp_path, text)
    typo, worse = broken_entries(path)
    assert (typo.name, typo.keyspace) == ("typo", "ks") and "freshnes" in typo.error
    assert typo.alerts is not None and typo.alerts.webhook_url == "http://hooks/typo"
    assert (worse.name, worse.keyspace, worse.alerts) == ("worse", None, None)
    assert broken_entries(write(tmp_path, GOOD)) == []


@pytest.mark.parametrize(("text", "seconds"), [("90s", 90), ("1m", 60), ("2h", 7200), (30, 30)])
def test_durations(text, seconds):
    assert parse_duration(text) == timedelta(seconds=seconds)


SHARED = """
families:
  - {name: trades, keyspace: ks, raw_table: raw, compact_table: totals, lag: 1m}
  - {name: fills, keyspace: ks, raw_table: raw, compact_table: fill_totals, lag: 1m}
  - {name: other, keyspace: ks2, raw_table: raw, compact_table: totals, lag: 1m}
"""


def test_two_families_on_one_table_are_refused_at_load(tmp_path):
    path = write(tmp_path, SHARED)
    with pytest.raises(ConfigError, match=r"family 'fills' uses table ks\.raw, which family "):
        load_catalog(path)
    good, errors = load_families_leniently(path)
    assert [f.name for f in good] == ["trades", "other"]  # another keyspace's tables
    assert list(errors) == ["fills"] and "each would count its rows" in errors["fills"]


def test_archive_fields(tmp_path):
    text = GOOD + "    archive: s3://bucket/counters\n    archive_retention: 30d\n"
    family = load_catalog(write(tmp_path, text)).get("trades")
    assert family.archive == "s3://bucket/counters"
    assert family.archive_retention == timedelta(days=30)
    plain = load_catalog(write(tmp_path, GOOD + "    archive: var/archive\n")).get("trades")
    assert (plain.archive, plain.archive_retention) == ("var/archive", None)  # kept for good


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (
            "archive: memory://x/y",
            "field 'archive': archive 'memory://x/y': 'memory' is not a store an archive can",
        ),
        ("archive: nosuch://bucket/x", "'nosuch' is not a store an archive can be kept in"),
        ("archive: 's3://'", "archive 's3://' names no folder or bucket"),
        ("archive: 'c:archive'", "is neither a URL (scheme://path) nor a path"),
        ("archive: ''", "archive must be a URL or a path"),
        (
            "archive: var/a\n    archive_retention: 12h",
            "archive_retention must be a whole number of days, at least 1d",
        ),
        ("archive_retention: 30d", "archive_retention and archive_conn_id need an archive"),
        (
            "kind: rows\n    archive: var/a",
            "a 'rows' family keeps its rows (business data): nothing is deleted",
        ),
    ],
)
def test_a_bad_archive_is_refused_at_load_naming_family_field_and_value(tmp_path, text, fragment):
    path = write(tmp_path, GOOD + f"    {text}\n")
    with pytest.raises(ConfigError) as info:
        load_catalog(path)
    message = str(info.value)
    assert fragment in message
    assert "family 'trades'" in message and str(path) in message
