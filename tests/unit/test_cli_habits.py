"""counterctl's habits that need no node: --version, --json everywhere, the confirmation of
reset and reshard, init's replication outside a local node, the hidden demo writer."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from counters import audit_export
from counters.audit import code_version
from counters.cli import cli
from counters.cli import common as cli_module
from counters.cli.common import is_local_host, replication_for
from counters.status import AuditRow

pytestmark = pytest.mark.unit

CONFIG = Path(__file__).resolve().parents[2] / "include" / "examples" / "counter_families.yaml"


@pytest.fixture
def no_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    """Connecting fails the test: these refusals come before any connection."""

    def connect(*_a: object, **_k: object) -> None:
        raise AssertionError("counterctl connected to Cassandra")

    monkeypatch.setattr(cli_module, "connect", connect)


def invoke(*args: str, env: dict[str, str] | None = None, stdin: str | None = None):
    return CliRunner().invoke(cli, ["--config", str(CONFIG), *args], env=env, input=stdin)


def test_version_prints_the_code_version() -> None:
    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0 and result.output == f"counterctl {code_version()}\n"


def test_every_command_that_prints_takes_json() -> None:
    for name, command in cli.commands.items():
        if command.hidden:
            continue
        options = {opt for p in command.params for opt in getattr(p, "opts", [])}
        assert "--json" in options, f"counterctl {name} has no --json"


def test_families_json_lists_every_family_with_its_hash() -> None:
    result = invoke("families", "--json")
    assert result.exit_code == 0, result.output
    families = json.loads(result.output)
    assert "trades" in {f["name"] for f in families}
    assert all(f["config_hash"].startswith("sha256:") for f in families)


def test_init_print_grants_json_needs_no_connection(no_connection: None) -> None:
    result = invoke("init", "--print-grants", "--family", "trades", "--json", "--role", "ops")
    assert result.exit_code == 0, result.output
    grants = json.loads(result.output)
    assert grants["role"] == "ops" and all(g.endswith(' TO "ops"') for g in grants["statements"])


def test_demo_writer_is_hidden_from_help_but_runs() -> None:
    assert "demo-writer" not in CliRunner().invoke(cli, ["--help"]).output
    assert CliRunner().invoke(cli, ["demo-writer", "--help"]).exit_code == 0


@pytest.mark.parametrize(
    "args",
    [
        ("reset", "--family", "trades", "IBM"),
        ("reshard", "--family", "trades", "--shards", "8"),
    ],
)
def test_a_change_without_a_terminal_is_refused_without_yes(
    no_connection: None, args: tuple[str, ...]
) -> None:
    """CliRunner's stdin is not a terminal: a script must say --yes; nothing is connected to,
    so nothing can change."""
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert "standard input is not a terminal, so pass --yes" in result.output
    assert "family trades" in result.output


def test_init_outside_a_local_node_requires_replication(no_connection: None) -> None:
    result = invoke("init", env={"CASSANDRA_HOSTS": "127.0.0.1,cassandra-1.prod"})
    assert result.exit_code == 2, result.output
    assert "--replication is required for the cluster at cassandra-1.prod" in result.output
    assert "localhost/127.0.0.1" in result.output


def test_the_dev_replication_is_only_the_default_for_local_hosts() -> None:
    dev = "{'class': 'SimpleStrategy', 'replication_factor': 1}"
    assert replication_for(None, ("127.0.0.1",)) == dev
    assert replication_for(None, ("localhost", "127.0.0.2", "::1")) == dev
    given = "{'class': 'NetworkTopologyStrategy', 'dc1': 3}"
    assert replication_for(given, ("10.0.0.1",)) == given
    for host in ("10.0.0.1", "cassandra.example.com", "0.0.0.0"):
        assert not is_local_host(host)
        with pytest.raises(click.ClickException, match="--replication is required"):
            replication_for(None, (host,))


def test_audit_jsonl_is_one_json_object_per_row_and_line() -> None:
    start = datetime(2026, 11, 1, tzinfo=UTC)
    rows = [
        AuditRow.from_record(
            {"started_at": start + timedelta(minutes=i), "run_id": f"r{i}", "outcome": "success"}
        )
        for i in range(5)
    ]
    data = b"".join(audit_export.chunks("jsonl", iter(rows), "trades", None, None))
    lines = data.decode().splitlines()
    assert [json.loads(line)["run_id"] for line in lines] == ["r0", "r1", "r2", "r3", "r4"]
    assert data.endswith(b"\n") and json.loads(lines[0]) == rows[0].as_dict()
    assert list(audit_export.jsonl_chunks([], batch_rows=2)) == []
    assert len(list(audit_export.jsonl_chunks(rows, batch_rows=2))) == 3  # streamed in batches


def test_a_counter_that_is_not_the_familys_key_exits_2_naming_it() -> None:
    """Every command that takes COUNTER parses it with ``counter_keys``: a value the key's
    column type refuses, or too few parts for a composite key, exits 2 with the reason."""
    from types import SimpleNamespace

    from counters.config import load_catalog

    catalog = load_catalog(str(CONFIG))
    orders = catalog.get("orders")  # key [location_id, calculation_date]

    def parse_key(parts: list[str]) -> tuple[object, ...]:
        if parts[1] != "2026-11-22":
            raise ValueError(f"calculation_date: not a date: {parts[1]!r}")
        return tuple(parts)

    store = SimpleNamespace(family=orders, keys=SimpleNamespace(parse_key=parse_key))
    assert cli_module.counter_keys(store, ["7/2026-11-22"]) == [("7", "2026-11-22")]
    with pytest.raises(click.ClickException) as typed:
        cli_module.counter_keys(store, ["7/2026-11-22", "7/22.11.2026"])
    assert typed.value.exit_code == 2 and "not a date: '22.11.2026'" in typed.value.message
    with pytest.raises(click.ClickException) as parts:
        cli_module.counter_keys(store, ["7"])
    assert parts.value.exit_code == 2 and "give one value per column" in parts.value.message


def test_every_json_output_writes_times_in_one_format(capsys: pytest.CaptureFixture[str]) -> None:
    """UTC, to the millisecond, ending in Z (``core.moments.to_text``), whatever the time's
    timezone, in every ``--json`` output: they all go through ``echo_json``."""
    from counters.config import load_catalog
    from counters.health import family_lag

    naive = datetime(2026, 11, 22, 10, 0, 0, 123456)
    aware = datetime(2026, 11, 22, 11, 0, 0, tzinfo=UTC).astimezone()
    cli_module.echo_json({"at": naive, "nested": [{"epoch": aware}], "day": naive.date()})
    printed = json.loads(capsys.readouterr().out)
    assert printed == {
        "at": "2026-11-22T10:00:00.123Z",
        "nested": [{"epoch": "2026-11-22T11:00:00.000Z"}],
        "day": "2026-11-22",
    }
    trades = load_catalog(CONFIG).get("trades")
    lag = family_lag(trades, naive, naive + timedelta(minutes=2)).as_dict()  # health --json
    assert lag["epoch"] == "2026-11-22T10:00:00.123Z"
    source = Path(cli_module.__file__).parent
    for module in source.glob("*.py"):  # no command prints JSON past echo_json
        if module.name != "common.py":
            assert "json.dumps" not in module.read_text(), module.name


def test_log_format_json_writes_log_lines_and_errors_as_json_objects(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--log-format json`` (``$COUNTERS_LOG_FORMAT``): one JSON object a line on stderr, for a
    CronJob's log pipeline; an error carries its exit code."""
    import logging

    try:
        cli_module.configure_logging(0, "json")
        logging.getLogger("counters.health").warning("family %s: %d behind", "trades", 3)
        line = json.loads(capsys.readouterr().err)
        assert line["level"] == "warning" and line["logger"] == "counters.health"
        assert line["message"] == "family trades: 3 behind"
        assert line["time"].endswith("Z") and len(line["time"]) == len("2026-11-22T10:00:00.000Z")
        missing = CliRunner().invoke(
            cli, ["--log-format", "json", "--config", "/no/such/families.yaml", "families"]
        )
        assert missing.exit_code == 2
        [error] = [json.loads(x) for x in missing.stderr.splitlines()]
        assert error["level"] == "error" and error["exit_code"] == 2
        assert "/no/such/families.yaml" in error["message"]
        by_env = CliRunner().invoke(
            cli,
            ["--config", "/no/such/families.yaml", "families"],
            env={"COUNTERS_LOG_FORMAT": "json"},
        )
        assert json.loads(by_env.stderr)["exit_code"] == 2
    finally:
        cli_module.configure_logging(0)
    plain = CliRunner().invoke(cli, ["--config", "/no/such/families.yaml", "families"])
    assert plain.stderr.startswith("Error: ")


def test_health_is_named_the_status_command() -> None:
    """Operators look for a status command: ``health`` says it is one, in its help and in
    the docs."""
    help_text = CliRunner().invoke(cli, ["--help"]).output
    assert re.search(r"^  health +The status command", help_text, re.M), help_text
    root = Path(__file__).resolve().parents[2]
    for doc in ("README.md", "docs/cli.md", "docs/operations.md"):
        text = (root / doc).read_text()
        assert re.search(r"`counterctl health`\**,? is the status command", text), doc
